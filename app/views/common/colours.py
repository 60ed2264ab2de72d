"""Colours shared by the views: the colormaps the lenses offer (colour-blind-safe first) and one colour per ggml type."""
from __future__ import annotations

import pyqtgraph as pg

COLORMAPS = ("viridis", "cividis", "magma", "inferno", "plasma", "CET-L1")  # perceptually uniform; first is the default

# one colour per ggml type, darker for fewer bits (Okabe-Ito and friends; F32/F16 are greys)
TYPE_COLOURS: dict[str, tuple[int, int, int]] = {
    "F32": (150, 150, 150), "F16": (190, 190, 190), "BF16": (210, 210, 210),
    "Q8_0": (86, 180, 233), "Q6_K": (0, 158, 115), "Q5_K": (240, 228, 66), "Q5_1": (230, 200, 90),
    "Q5_0": (220, 180, 60), "Q4_K": (230, 159, 0), "Q4_1": (213, 130, 40), "Q4_0": (213, 94, 0),
    "Q3_K": (204, 121, 167), "Q2_K": (170, 60, 120),
}


def colormap(name: str) -> pg.ColorMap:
    """A pyqtgraph colormap by name, falling back to viridis."""
    try:
        return pg.colormap.get(name)
    except (FileNotFoundError, KeyError, ValueError):
        return pg.colormap.get("viridis")


def type_colour(name: str) -> tuple[int, int, int]:
    """The table/bar colour of a ggml type name (grey-blue for types not in the table)."""
    return TYPE_COLOURS.get(name, (120, 140, 170))
