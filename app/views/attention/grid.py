"""The layers x heads grid of pooled attention thumbnails (BertViz's model view), drawn as one mosaic image.

When a role is chosen in Head roles, each thumbnail gets a frame coloured (and thickened) by that head's score,
with a legend beside the grid (`set_role_scores`); no role: no frames.

A hybrid's record (AttentionRecord.layers / recurrent / heads) has rows of two kinds: attention layers, and the
recurrent (gated DeltaNet) layers, whose thumbnails are their value heads' read maps. Recurrent rows sit on a
tinted band with an "R" on the right, and a legend under the grid says what they show; rows may have fewer
heads than the grid has columns (the rest is left empty). Clicks, hover and the selection speak model layers.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QPen
from PySide6.QtWidgets import QGraphicsRectItem

from app.records.attention import AttentionRecord
from app.records.model import ModelRecord
from app.views.common.colours import colormap

GAP = 2  # pixels between thumbnails of one KV group
GROUP_GAP = 6  # between KV groups, so heads that share a KV head sit together
FRAME_COLOURS = ((225, 225, 225), (240, 160, 0), (190, 0, 110))  # score 0, 0.5, 1: grey, orange, magenta
FRAME_WIDTH = (0.8, 4.0)  # cosmetic pen width in screen pixels at score 0 and 1
RECURRENT_TINT = (0, 150, 136)  # teal: the band behind a recurrent row, its "R" and the legend
RECURRENT_LEGEND = ("<span style='color:#00968a'><b>R</b></span> rows: recurrent (gated DeltaNet) layers, each value "
                    "head's read map: the share of |W| its output takes from each earlier token (exact, no softmax). "
                    "Other rows: softmax attention.")


class GridView(pg.GraphicsLayoutWidget):
    """One ImageItem holding every thumbnail; click picks (layer, head), hover describes the head."""

    head_clicked = Signal(int, int)
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setBackground("w")
        self.plot = self.addPlot()
        self.plot.invertY(True)
        self.plot.setAspectLocked(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        for side in ("top", "right"):
            self.plot.showAxis(side)
        self.plot.getAxis("top").setStyle(tickLength=0)
        self.plot.getAxis("bottom").setStyle(tickLength=0)
        self.plot.getAxis("left").setStyle(tickLength=0)
        self.plot.getAxis("right").setStyle(tickLength=0)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.selection = QGraphicsRectItem()
        self.selection.setPen(pg.mkPen((230, 30, 30), width=2.5, cosmetic=True))
        self.group_box = QGraphicsRectItem()
        self.group_box.setPen(pg.mkPen((230, 30, 30), width=1, style=Qt.PenStyle.DashLine, cosmetic=True))
        for item in (self.group_box, self.selection):
            item.setVisible(False)
            item.setZValue(10)  # above the role frames
            self.plot.addItem(item)
        self.plot.getViewBox().sigResized.connect(lambda _vb: self._head_ticks())
        self.plot.getViewBox().sigXRangeChanged.connect(lambda _vb, _r: self._head_ticks())
        self.image.mouseClickEvent = self._click
        self.image.hoverEvent = self._hover
        self.model: ModelRecord | None = None
        self.record: AttentionRecord | None = None
        self.cmap_name = "viridis"
        self.pool = "max"
        self.hide_sink = False
        self.normalize = True
        self.selected: tuple[int, int] | None = None
        self._t = 1
        self._xs: np.ndarray = np.zeros(0, int)
        self.role: str | None = None  # the Head roles score framing each thumbnail (None: no frames)
        self.role_scores: np.ndarray | None = None  # (model layers, heads), NaN where not scored
        self.frames: list[QGraphicsRectItem] = []
        self.frame_map = pg.ColorMap(pos=[0.0, 0.5, 1.0], color=list(FRAME_COLOURS))
        self.legend = pg.ColorBarItem(values=(0, 1), colorMap=self.frame_map, interactive=False, width=10)
        self.legend.setVisible(False)  # in the layout only while frames are drawn (a hidden item keeps its room)
        self.bands: list[QGraphicsRectItem] = []  # behind the recurrent rows of a hybrid
        self.kinds_legend = pg.LabelItem(RECURRENT_LEGEND, size="8pt", color="#333", justify="left")
        self.kinds_legend.setVisible(False)  # in the layout only for a hybrid's record
        self._fit_legend()

    # ---- geometry

    def resizeEvent(self, ev) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(ev)
        self._fit_legend()

    def _fit_legend(self) -> None:
        """The legend wraps to the grid's width (one long line would widen the layout past the widget)."""
        if not hasattr(self, "kinds_legend") or getattr(self, "closed", False):  # before our constructor ran, or
            return  # after close() cleared the scene (the item is gone with it)
        self.kinds_legend.item.setTextWidth(max(60.0, float(self.width()) - 16.0))
        self.kinds_legend.updateMin()

    def _group(self) -> int:
        if self.model is not None:
            return self.model.group
        return 1

    def _layout(self, n_heads: int, t: int) -> np.ndarray:
        """x offset of each head's thumbnail, with a wider gap between KV groups."""
        g = self._group()
        xs, x = [], 0
        for h in range(n_heads):
            if h and h % g == 0:
                x += GROUP_GAP - GAP
            xs.append(x)
            x += t + GAP
        return np.array(xs, int)

    # ---- drawing

    def set_model(self, model: ModelRecord) -> None:
        self.model = model
        self.selected = None

    def redraw(self) -> None:
        """Rebuild the mosaic from the current record and settings (cheap: a few hundred thousand pixels)."""
        rec = self.record
        if rec is None or rec.thumbs.size == 0:
            self.image.clear()
            self._draw_bands(0.0)
            return
        maps = {"max": rec.thumbs, "mean": rec.thumbs_mean}[self.pool]
        if self.hide_sink:
            maps = rec.thumbs_nosink if self.pool == "max" else rec.thumbs_nosink_mean
        n_layers, n_heads, t, _ = maps.shape
        maps = maps.astype(np.float32, copy=True)
        if self.normalize:
            with np.errstate(invalid="ignore", all="ignore"):
                top = np.nanmax(np.where(np.isfinite(maps), maps, -1), axis=(2, 3), keepdims=True)
                maps /= np.where(top > 0, top, 1)
        self._t = t
        self._xs = self._layout(n_heads, t)
        width = int(self._xs[-1] + t)
        height = n_layers * (t + GAP) - GAP
        mosaic = np.full((height, width), np.nan, np.float32)
        for li in range(n_layers):
            y = li * (t + GAP)
            for h in range(n_heads):
                mosaic[y : y + t, self._xs[h] : self._xs[h] + t] = maps[li, h]
        finite = mosaic[np.isfinite(mosaic)]
        top = 1.0 if self.normalize or finite.size == 0 else max(float(finite.max()), 1e-6)
        lut = colormap(self.cmap_name).getLookupTable(0.0, 1.0, 256)
        self.image.setImage(mosaic, autoLevels=False, levels=(0.0, top), lut=lut)
        self._axes(n_layers, n_heads, t)
        self._draw_bands(width)
        self.plot.getViewBox().setRange(QRectF(0, 0, width, height), padding=0.01)
        self._draw_frames()
        self._draw_selection()

    def _draw_bands(self, width: float) -> None:
        """A tinted band behind each recurrent row (it shows through the masked upper triangles) and the legend."""
        for item in self.bands:
            self.plot.removeItem(item)
        self.bands = []
        rec = self.record
        hybrid = rec is not None and rec.thumbs.size > 0 and rec.hybrid
        in_layout = self.kinds_legend.scene() is not None
        if hybrid and not in_layout:
            self._fit_legend()
            self.addItem(self.kinds_legend, row=1, col=0)
        elif not hybrid and in_layout:
            self.ci.removeItem(self.kinds_legend)
        self.kinds_legend.setVisible(hybrid)
        if not hybrid:
            return
        assert rec is not None
        t = self._t
        colour = QColor(*RECURRENT_TINT)
        colour.setAlpha(60)
        for li in range(rec.n_layers):
            if not rec.is_recurrent(li):
                continue
            band = QGraphicsRectItem(QRectF(-GAP, li * (t + GAP) - GAP / 2, width + 2 * GAP, t + GAP))
            band.setBrush(QBrush(colour))
            band.setPen(QPen(Qt.PenStyle.NoPen))
            band.setZValue(-1)  # behind the thumbnails
            self.plot.addItem(band)
            self.bands.append(band)

    def set_role_scores(self, role: str | None, scores: np.ndarray | None = None) -> None:
        """Frame every thumbnail by its head's `role` score in 0..1 (rows: model layers); None clears the frames."""
        self.role = role if scores is not None else None
        self.role_scores = None if self.role is None else np.asarray(scores, dtype=np.float32)
        self._draw_frames()

    def frame_score(self, layer: int, head: int) -> float | None:
        """The score a thumbnail's frame shows (tests, hover), None without frames or for an unscored head."""
        s = self.role_scores
        if s is None or not (0 <= layer < s.shape[0] and 0 <= head < s.shape[1]) or not np.isfinite(s[layer, head]):
            return None
        return float(s[layer, head])

    def _draw_frames(self) -> None:
        for item in self.frames:
            self.plot.removeItem(item)
        self.frames = []
        s, rec = self.role_scores, self.record
        show = s is not None and rec is not None and rec.thumbs.size > 0 and len(self._xs) > 0
        in_layout = self.legend.scene() is not None
        if show and not in_layout:
            self.addItem(self.legend, row=0, col=1)
        elif not show and in_layout:
            self.ci.removeItem(self.legend)
        self.legend.setVisible(show)
        if not show:
            return
        t = self._t
        for li in range(rec.thumbs.shape[0]):
            for h in range(min(rec.heads_in(li), len(self._xs))):
                v = self.frame_score(rec.layer_of(li), h)
                if v is None:
                    continue
                v = min(1.0, max(0.0, v))
                frame = QGraphicsRectItem(QRectF(self._xs[h] - 0.5, li * (t + GAP) - 0.5, t + 1, t + 1))
                width = FRAME_WIDTH[0] + (FRAME_WIDTH[1] - FRAME_WIDTH[0]) * v
                frame.setPen(pg.mkPen(self.frame_map.map(v, mode="qcolor"), width=width, cosmetic=True))
                frame.setZValue(5 + v)  # the strongest on top; the selection (added first) is raised above all
                self.plot.addItem(frame)
                self.frames.append(frame)
        room = self.plot.getViewBox().height() - 8  # a rotated title longer than the bar is cut: the short one then
        title = f"{self.role} score"
        self.legend.axis.setLabel(title if self.fontMetrics().horizontalAdvance(title) <= room else str(self.role))

    def _head_ticks(self) -> None:
        """Head labels over the columns: every head when the thumbnails are wide enough, else every k-th."""
        if not len(self._xs):
            return
        x0, x1 = self.plot.getViewBox().viewRange()[0]  # wider than the grid where the locked aspect pads it
        px = self.plot.getViewBox().width() / max(x1 - x0, 1.0) * (self._t + GAP)  # screen pixels per column
        label = self.fontMetrics().horizontalAdvance(f"h{len(self._xs) - 1}") + 6
        every = max(1, int(np.ceil(label / max(px, 1e-6))))
        self.plot.getAxis("top").setTicks([[(float(x + self._t / 2), f"h{h}") for h, x in enumerate(self._xs)
                                            if h % every == 0]])

    def _axes(self, n_layers: int, n_heads: int, t: int) -> None:
        rec = self.record
        assert rec is not None
        g = self._group()
        self._head_ticks()
        groups = []
        n_att = min(n_heads, self.model.n_heads) if self.model is not None else n_heads  # KV groups: attention heads
        for kv in range(max(1, n_att // g)):
            a, b = self._xs[kv * g], self._xs[min(n_att, (kv + 1) * g) - 1] + t
            groups.append((float((a + b) / 2), f"KV {kv}" if g > 1 else ""))
        self.plot.getAxis("bottom").setTicks([groups])
        self.plot.getAxis("bottom").setLabel("KV groups (GQA)" if g > 1 else "")  # short: the grid can be 160 px wide
        self.plot.getAxis("bottom").setToolTip("Heads under one KV label share that KV head (grouped-query attention)"
                                               if g > 1 else "")
        rows = [(float(li * (t + GAP) + t / 2), f"L{rec.layer_of(li)}") for li in range(n_layers)]
        self.plot.getAxis("left").setTicks([rows])
        right = []
        infos = {x.index: x for x in self.model.layers} if self.model is not None else {}
        windows = any(x.window for x in infos.values())
        for li in range(n_layers):
            y = float(li * (t + GAP) + t / 2)
            info = infos.get(rec.layer_of(li))
            if rec.is_recurrent(li):
                right.append((y, "R"))
            elif windows and info is not None:
                right.append((y, f"local {info.window}" if info.window else "global"))
            elif rec.hybrid:
                right.append((y, "attn"))
        axis = self.plot.getAxis("right")
        axis.setTicks([right])
        axis.setWidth((60 if windows else 34) if right else 8)
        axis.setTextPen(pg.mkPen(RECURRENT_TINT) if rec.hybrid and not windows else pg.mkPen("#444"))
        axis.setToolTip("R: a recurrent (gated DeltaNet) layer: its value heads' read maps" if rec.hybrid else "")

    def select(self, layer: int, head: int) -> None:
        """Outline (model layer, head)."""
        self.selected = (layer, head)
        self._draw_selection()

    def _draw_selection(self) -> None:
        row = None if self.selected is None or self.record is None else self.record.row_of(self.selected[0])
        if row is None or not len(self._xs):
            self.selection.setVisible(False)
            self.group_box.setVisible(False)
            return
        assert self.selected is not None and self.record is not None
        _layer, head = self.selected
        t, g = self._t, self._group()
        if not (0 <= head < len(self._xs)):
            return
        y = row * (t + GAP)
        self.selection.setRect(QRectF(self._xs[head] - 1, y - 1, t + 2, t + 2))
        kv = head // g
        a = self._xs[kv * g]
        b = self._xs[min(len(self._xs), (kv + 1) * g) - 1] + t
        self.group_box.setRect(QRectF(a - 3, y - 3, b - a + 6, t + 6))
        self.selection.setVisible(True)
        self.group_box.setVisible(g > 1 and not self.record.is_recurrent(row))

    # ---- interaction

    def head_at(self, x: float, y: float) -> tuple[int, int] | None:
        """(model layer, head) of the thumbnail under image pixel (x, y), or None in a gap."""
        rec = self.record
        if rec is None or not len(self._xs):
            return None
        t = self._t
        row, dy = divmod(int(np.floor(y)), t + GAP)
        head = int(np.searchsorted(self._xs, np.floor(x), side="right")) - 1
        if not (0 <= row < rec.thumbs.shape[0]) or dy >= t or head < 0 or x - self._xs[head] >= t:
            return None
        if head >= rec.heads_in(row):  # a row with fewer heads than the grid is wide
            return None
        return rec.layer_of(row), head

    def describe(self, layer: int, head: int) -> str:
        """The hover text of (model layer, head)."""
        rec = self.record
        assert rec is not None
        row = rec.row_of(layer)
        if row is None:
            return f"layer {layer} is not in the grid"
        if rec.is_recurrent(row):
            return self._describe_recurrent(row, layer, head)
        g = self._group()
        kv = head // g
        parts = [f"layer {layer}{' (attention)' if rec.hybrid else ''}, head {head}"]
        if g > 1:
            parts.append(f"KV head {kv} (shared by h{kv * g}–h{kv * g + g - 1})")
        info = next((x for x in self.model.layers if x.index == layer), None) if self.model is not None else None
        if info is not None and info.window:
            parts.append(f"sliding window {info.window}")
        parts.append(f"sink {rec.sink[row, head]:.2f} · previous token {rec.prev[row, head]:.2f} · "
                     f"self {rec.self_[row, head]:.2f}")
        if rec.learned_sink is not None:  # gpt-oss: the share no key got
            parts.append(f"attention to nothing (learned sink) {rec.learned_sink[row, head]:.2f}")
        framed = self.frame_score(layer, head)
        if framed is not None:
            parts.append(f"frame: {self.role} {framed:.2f}")
        return " · ".join(parts)

    def _describe_recurrent(self, row: int, layer: int, head: int) -> str:
        rec = self.record
        assert rec is not None
        n_k = self.model.n_k_heads if self.model is not None and self.model.n_k_heads else 0
        parts = [f"layer {layer} (recurrent, gated DeltaNet), value head {head}"
                 + (f" (reads key head {head % n_k})" if n_k else "")]
        parts.append(f"reads: first token {rec.sink[row, head]:.2f} · previous token {rec.prev[row, head]:.2f} · "
                     f"self {rec.self_[row, head]:.2f}")
        if rec.earlier is not None and rec.read_start > 0:
            parts.append(f"earlier context (before token {rec.read_start}) {rec.earlier[row, head]:.2f}")
        framed = self.frame_score(layer, head)
        if framed is not None:
            parts.append(f"frame: {self.role} {framed:.2f}")
        return " · ".join(parts)

    def _hover(self, ev) -> None:
        if ev.isExit():
            return
        hit = self.head_at(ev.pos().x(), ev.pos().y())
        if hit is not None:
            self.hovered.emit(self.describe(*hit))

    def _click(self, ev) -> None:
        hit = self.head_at(ev.pos().x(), ev.pos().y())
        if hit is not None and ev.button() == Qt.MouseButton.LeftButton:
            ev.accept()
            self.select(*hit)
            self.head_clicked.emit(*hit)
