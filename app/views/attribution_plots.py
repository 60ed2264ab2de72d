"""The Why lens's two plots of one AttributionRecord: the waterfall of the top parts (cumulative, from the embedding
to the logit) and the layers x heads map of every head's share (diverging colours centred at 0). Picking a bar or a
cell emits `part_picked(part index)`; `outline(i)` marks a part in both, `show_check(check)` draws what a real
ablation did beside the part's share. Drawing only: the lens (app.views.attribution) holds what is picked and asks.
Two of these side by side show the same attribution in two models (A and B of Compare). `head_grid` /
`draw_head_grid` make and draw a layers x heads map in this style (the Patching tab's two maps), `tint_colours` the
input tint's colours."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QWidget

from app.records.attribution import AblationCheck, AttributionRecord
from app.views.common.colours import colormap

TOP = 15  # parts in the waterfall
DIVERGING = "CET-D1"  # a diverging map, reversed below: red (against) - white (0) - blue (for)
POS, NEG, TOTAL = (70, 110, 200), (210, 80, 70), (120, 120, 120)
PICK_PEN = (20, 20, 20)
CHECK_PEN = (230, 140, 0)


def diverging() -> pg.ColorMap:
    """Red for negative, white at 0, blue for positive (the waterfall's colours)."""
    pos, colours = colormap(DIVERGING).getStops(mode="byte")  # a new map: pyqtgraph keeps one object per name
    return pg.ColorMap(1.0 - pos[::-1], colours[::-1])


def tint_colours(values: np.ndarray, reach: float) -> list[str]:
    """A '#rrggbb' per value on the diverging map, the largest |value| `reach` from its white middle (0: white)."""
    scale = float(np.max(np.abs(values))) if values.size else 0.0
    lut = diverging()
    out = []
    for v in values:
        c = lut.map(np.array([0.5 if scale == 0 else 0.5 + reach * float(v) / scale]), mode="byte")[0]
        out.append(f"#{int(c[0]):02x}{int(c[1]):02x}{int(c[2]):02x}")
    return out


def head_limit(rec: AttributionRecord) -> float:
    """The largest |head value| of a record (0 without heads)."""
    finite = rec.heads[np.isfinite(rec.heads)]
    return float(np.max(np.abs(finite))) if finite.size else 0.0


def _outline(pen: pg.QtGui.QPen) -> pg.QtWidgets.QGraphicsRectItem:
    box = pg.QtWidgets.QGraphicsRectItem()
    box.setPen(pen)
    box.setVisible(False)
    return box


def _still(plot: pg.PlotItem) -> None:
    plot.invertY(True)
    plot.setMenuEnabled(False)
    plot.hideButtons()
    plot.setMouseEnabled(x=False, y=False)


def head_grid(layout: pg.GraphicsLayout, row: int, col: int,
              label: str) -> tuple[pg.PlotItem, pg.ImageItem, pg.ColorBarItem | None]:
    """A layers x heads map at (row, col) of `layout` (layer 0 at the top, heads along the top axis) and its colour
    bar at (row, col + 1), labelled `label` ('': none, for a map drawn on another's scale): the Why lens's head maps
    all look alike."""
    plot = layout.addPlot(row=row, col=col)
    _still(plot)
    plot.showAxis("top")
    plot.hideAxis("bottom")
    plot.setLabel("left", "layer")
    plot.setLabel("top", "head")
    image = pg.ImageItem(axisOrder="row-major")
    plot.addItem(image)
    if not label:
        image.setColorMap(diverging())
        return plot, image, None
    bar = pg.ColorBarItem(values=(-1, 1), colorMap=diverging(), interactive=False, width=10, label=label)
    bar.setImageItem(image)
    layout.addItem(bar, row=row, col=col + 1)
    return plot, image, bar


def draw_head_grid(plot: pg.PlotItem, image: pg.ImageItem, bar: pg.ColorBarItem | None, m: np.ndarray,
                   lim: float) -> None:
    """Draw the (n_layers, heads) map `m` (NaN, no such head: white) coloured -lim..lim, a tick per layer and head
    (fewer when there are many)."""
    if m.size == 0:
        image.clear()
        return
    lim = lim if lim > 0 else 1.0
    image.setImage(np.nan_to_num(m, nan=0.0), autoLevels=False, levels=(-lim, lim))
    if bar is not None:
        bar.setLevels((-lim, lim))
    n_layers, n_heads = m.shape
    every_l = max(1, int(np.ceil(n_layers / 24)))
    every_h = max(1, int(np.ceil(n_heads / 8)))  # the map is narrow: a label per head up to 8 heads
    plot.getAxis("left").setTicks([[(i + 0.5, f"L{i}") for i in range(0, n_layers, every_l)]])
    plot.getAxis("top").setTicks([[(h + 0.5, str(h)) for h in range(0, n_heads, every_h)]])
    plot.setXRange(0, n_heads, padding=0.02)
    plot.setYRange(0, n_layers, padding=0.02)


class AttributionPlots(pg.GraphicsLayoutWidget):
    """The waterfall and the head map of one record (see the module docstring)."""

    part_picked = Signal(int)  # a part index of the record, picked in the waterfall or the map

    def __init__(self, stacked: bool = False, parent: QWidget | None = None):
        """`stacked`: the map under the waterfall (half a lens wide, as A and B side by side), else beside it."""
        super().__init__(parent)
        self.setBackground("w")
        self.record: AttributionRecord | None = None
        self.bars: list[tuple[str, float, int | None]] = []  # the waterfall: (label, value, part index or None)
        self.fall = self.addPlot(row=0, col=0, colspan=2 if stacked else 1)
        _still(self.fall)
        self.fall.setLabel("bottom", "logit (difference), cumulative")
        self.fall.getAxis("bottom").enableAutoSIPrefix(False)  # logits as they are, never '(x0.001)'
        self.fall.getAxis("left").setWidth(110)
        self.fall.addItem(pg.InfiniteLine(pos=0, angle=90, pen=pg.mkPen((150, 150, 150), width=1)))
        self.fall_bars = pg.BarGraphItem(x0=[], y=[], height=0.7, width=[])
        self.fall.addItem(self.fall_bars)
        self.fall_pick = _outline(pg.mkPen(PICK_PEN, width=2, cosmetic=True))
        self.fall.addItem(self.fall_pick)
        self.fall_check = _outline(pg.mkPen(CHECK_PEN, width=2, style=Qt.PenStyle.DashLine, cosmetic=True))
        self.fall.addItem(self.fall_check)  # the ablation's real effect, beside the part's share
        self.fall.scene().sigMouseClicked.connect(self._fall_click)

        map_at = (1, 0) if stacked else (0, 1)
        self.map, self.image, self.colorbar = head_grid(self.ci, map_at[0], map_at[1], "head's share")
        self.map_pick = _outline(pg.mkPen(PICK_PEN, width=2, cosmetic=True))
        self.map.addItem(self.map_pick)
        if stacked:
            self.ci.layout.setRowStretchFactor(0, 3)
            self.ci.layout.setRowStretchFactor(1, 2)
        else:
            self.ci.layout.setColumnStretchFactor(0, 3)
            self.ci.layout.setColumnStretchFactor(1, 2)
        self.image.hoverEvent = self._hover
        self.image.mouseClickEvent = self._map_click

    # ---- drawing

    def clear_plots(self) -> None:
        self.record = None
        self.bars = []
        self.fall_bars.setOpts(x0=[], y=[], width=[])
        self.image.clear()
        for box in (self.fall_pick, self.fall_check, self.map_pick):
            box.setVisible(False)

    def draw(self, rec: AttributionRecord, limit: float | None = None) -> None:
        """The record's waterfall and head map (nothing outlined); `limit`: the map's colours span -limit..limit
        (two maps compared share one), else the record's largest |head|."""
        self.record = rec
        self.fall_check.setVisible(False)
        self._draw_waterfall(rec)
        self._draw_map(rec, limit)

    def _draw_waterfall(self, rec: AttributionRecord) -> None:
        self.bars = rec.waterfall(TOP)
        starts, widths, brushes, ticks = [], [], [], []
        run = 0.0
        for row, (label, value, _i) in enumerate(self.bars):
            starts.append(min(run, run + value))
            widths.append(abs(value))
            brushes.append(pg.mkBrush(POS if value >= 0 else NEG))
            ticks.append((row, f"{label} {value:+.2f}"))
            run += value
        total_row = len(self.bars)
        starts.append(min(0.0, rec.logit_diff))
        widths.append(abs(rec.logit_diff))
        brushes.append(pg.mkBrush(TOTAL))
        ticks.append((total_row, f"= logit {rec.logit_diff:+.2f}"))
        self.fall_bars.setOpts(x0=np.array(starts), y=np.arange(total_row + 1, dtype=float), width=np.array(widths),
                               height=0.7, brushes=brushes, pens=[pg.mkPen(None)] * len(brushes))
        self.fall.getAxis("left").setTicks([ticks])
        self.fall.getAxis("left").setWidth(max(110, 7 * max(len(t) for _, t in ticks)))
        lo = min(0.0, *starts)
        hi = max(0.0, *(s + w for s, w in zip(starts, widths)))
        pad = 0.05 * max(hi - lo, 1e-6)
        self.fall.setXRange(lo - pad, hi + pad, padding=0)
        self.fall.setYRange(-0.6, total_row + 0.6, padding=0)

    def _draw_map(self, rec: AttributionRecord, limit: float | None) -> None:
        draw_head_grid(self.map, self.image, self.colorbar, rec.heads, head_limit(rec) if limit is None else limit)

    def row_of(self, i: int | None) -> int | None:
        """The waterfall row of part i (None: it is in the 'other parts' bar)."""
        return next((r for r, (_l, _v, j) in enumerate(self.bars) if j is not None and j == i), None)

    def _start(self, row: int) -> float:
        return sum(v for _l, v, _j in self.bars[:row])

    def outline(self, i: int | None) -> None:
        """Mark part i in the waterfall (its bar) and the map (its cell, a head)."""
        rec = self.record
        self.fall_pick.setVisible(False)
        self.map_pick.setVisible(False)
        if rec is None or i is None:
            return
        row = self.row_of(i)
        if row is not None:
            run, v = self._start(row), self.bars[row][1]
            self.fall_pick.setRect(min(run, run + v), row - 0.4, abs(v), 0.8)
            self.fall_pick.setVisible(True)
        if str(rec.kinds[i]) == "head":
            self.map_pick.setRect(float(rec.indices[i]), float(rec.layers[i]), 1.0, 1.0)
            self.map_pick.setVisible(True)

    def show_check(self, check: AblationCheck | None) -> None:
        """The real effect of the part ablated, dashed, on its row of the waterfall (where it has one)."""
        rec = self.record
        self.fall_check.setVisible(False)
        if rec is None or check is None or check.token_index != rec.token_index:
            return
        row = self.row_of(rec.find(check.kind, check.layer, check.index if check.kind != "ffn" else -1))
        if row is None:
            return
        run = self._start(row)
        self.fall_check.setRect(min(run, run + check.effect), row - 0.45, abs(check.effect), 0.9)
        self.fall_check.setVisible(True)

    # ---- text and interaction

    def describe_head(self, layer: int, head: int) -> str:
        """The hover text of a cell of the head map."""
        rec = self.record
        if rec is None or not (0 <= layer < rec.heads.shape[0] and 0 <= head < rec.heads.shape[1]):
            return ""
        v = rec.heads[layer, head]
        if np.isnan(v):
            return f"layer {layer} has no head {head}"
        share = f" ({100 * v / rec.logit_diff:+.0f}% of the total)" if abs(rec.logit_diff) > 1e-9 else ""
        return f"head L{layer}.{head}: {v:+.4f}{share} to {rec.describe_target()}"

    def head_at(self, x: float, y: float) -> tuple[int, int] | None:
        """(layer, head) of the map cell under image pixel (x, y), None off the map or where there is no head."""
        rec = self.record
        if rec is None:
            return None
        layer, head = int(np.floor(y)), int(np.floor(x))
        if 0 <= layer < rec.heads.shape[0] and 0 <= head < rec.heads.shape[1] and np.isfinite(rec.heads[layer, head]):
            return layer, head
        return None

    def _hover(self, ev) -> None:  # noqa: ANN001 - pyqtgraph event
        if ev.isExit():
            self.setToolTip("")
            return
        hit = self.head_at(ev.pos().x(), ev.pos().y())
        self.setToolTip(self.describe_head(*hit) if hit is not None else "")

    def _map_click(self, ev) -> None:  # noqa: ANN001 - pyqtgraph event
        hit = self.head_at(ev.pos().x(), ev.pos().y())
        if hit is None or self.record is None or ev.button() != Qt.MouseButton.LeftButton:
            return
        ev.accept()
        i = self.record.find("head", *hit)
        if i is not None:
            self.part_picked.emit(i)

    def _fall_click(self, ev) -> None:  # noqa: ANN001 - pyqtgraph event
        if self.record is None or not self.bars or not self.fall.vb.sceneBoundingRect().contains(ev.scenePos()):
            return
        row = int(round(self.fall.vb.mapSceneToView(ev.scenePos()).y()))
        if 0 <= row < len(self.bars) and self.bars[row][2] is not None:
            self.part_picked.emit(int(self.bars[row][2]))
