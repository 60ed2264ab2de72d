"""Where the presets chart writes each point's name: beside its point where there is room, else farther out with a
leader line back to it, never over another name or point, and never outside the plot. Every point gets a name: a
crowded cluster of presets (Q3_K_S beside Q2_K, Q4_0 beside Q4_K_S) is fanned out around it.

Pure geometry in pixels (x right, y down); app.views.compare.charts turns the boxes into pyqtgraph items, and a
name the plot has no room for at all (a plot smaller than the names) is left to the point's hover tip.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

Box = tuple[float, float, float, float]  # left, top, right, bottom
GAP = 3.0  # px between two names
POINT_HALF = 5.0  # a point's marker keeps this far around it free
NEAR_GAP = 6.0  # a name beside its point starts this far from it
RADII = (22.0, 34.0, 48.0, 64.0, 82.0, 104.0, 130.0, 160.0, 200.0)  # farther rings, tried in turn
ANGLES = 16  # directions tried on each ring


@dataclass(frozen=True)
class Placed:
    """One name's box, and whether it sits away from its point (then a leader line joins them)."""

    box: Box
    leader: bool


def near_spots(bw: float, bh: float) -> list[tuple[float, float]]:
    """Offsets of a name's top-left corner from its point: above, below, right, left, then the four diagonals."""
    g = NEAR_GAP
    return [(-bw / 2, -bh - g), (-bw / 2, g), (g + 1, -bh / 2), (-bw - g - 1, -bh / 2),
            (g, -bh - g), (g, g), (-bw - g, -bh - g), (-bw - g, g)]


def far_spots(bw: float, bh: float) -> list[tuple[float, float]]:
    """Offsets of a name's top-left corner on rings around its point, nearest ring first."""
    out = []
    for r in RADII:
        for k in range(ANGLES):
            a = 2 * math.pi * k / ANGLES - math.pi / 2  # straight up first, then clockwise
            out.append((r * math.cos(a) - bw / 2, r * math.sin(a) - bh / 2))
    return out


def overlaps(a: Box, b: Box, gap: float = GAP) -> bool:
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def place(points: list[tuple[float, float]], sizes: list[tuple[float, float]], order: list[int], w: float,
          h: float) -> dict[int, Placed]:
    """A box for each point's name (point i at points[i], its name sizes[i] wide and tall), in `order` (who
    chooses first), inside a w x h plot, overlapping no other name and no point. A point left out has no room."""
    taken: list[Box] = [(x - POINT_HALF, y - POINT_HALF, x + POINT_HALF, y + POINT_HALF) for x, y in points]
    out: dict[int, Placed] = {}
    for i in order:
        (px, py), (bw, bh) = points[i], sizes[i]
        for spots, leader in ((near_spots(bw, bh), False), (far_spots(bw, bh), True)):
            box = _first_free(px, py, bw, bh, spots, taken, w, h)
            if box is not None:
                taken.append(box)
                out[i] = Placed(box, leader)
                break
    return out


def _first_free(px: float, py: float, bw: float, bh: float, spots: list[tuple[float, float]], taken: list[Box],
                w: float, h: float) -> Box | None:
    for dx, dy in spots:
        box = (px + dx, py + dy, px + dx + bw, py + dy + bh)
        inside = box[0] >= 0 and box[2] <= w and box[1] >= 0 and box[3] <= h
        if inside and not any(overlaps(box, b) for b in taken):
            return box
    return None


def leader_end(px: float, py: float, box: Box) -> tuple[float, float]:
    """Where a leader line from the point meets the name's box: the nearest point of the box."""
    return min(max(px, box[0]), box[2]), min(max(py, box[1]), box[3])
