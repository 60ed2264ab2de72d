"""The large heatmap of one head (or an aggregate): query rows x key columns with token labels and a colour bar.

A recurrent (gated DeltaNet) head of a hybrid is drawn the same way from its read shares (|W| per row); the
hover gives the signed weight W[t, s] with which token t's output reads the value of token s, and the share of
the row that came from the earlier context (before the decomposed window, through the state).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFontMetrics, QPen
from PySide6.QtWidgets import QGraphicsRectItem

from app.records.attention import HeadRecord
from app.views.common.colours import colormap
from app.views.common.tokens import TokenAxis, token_label

DISPLAY_MAX = 1200  # cells per side actually drawn: wider maps are max-pooled so one-key spikes stay visible
MASKED_BRUSH = QBrush(QColor(120, 120, 120), Qt.BrushStyle.BDiagPattern)  # drawn behind NaN (masked) cells


class HeadView(pg.GraphicsLayoutWidget):
    """Heatmap of a HeadRecord in token coordinates: masked cells hatched, sliding window outlined."""

    hovered = Signal(str)
    cell_clicked = Signal(int, int)  # (query index, key index)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setBackground("w")
        self.left = TokenAxis("left")
        self.bottom = TokenAxis("bottom")
        self.plot = self.addPlot(axisItems={"left": self.left, "bottom": self.bottom})
        self.plot.setLabel("left", "query token")
        self.plot.setLabel("bottom", "key token")
        self.plot.invertY(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.backdrop = QGraphicsRectItem()
        self.backdrop.setBrush(MASKED_BRUSH)
        self.backdrop.setPen(QPen(Qt.PenStyle.NoPen))
        self.plot.addItem(self.backdrop)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), label="attention weight", interactive=False)
        self.colorbar.setImageItem(self.image, insert_in=self.plot)
        pen = pg.mkPen((255, 140, 0), width=2, style=Qt.PenStyle.DashLine)
        self.window_lines = [pg.PlotCurveItem(pen=pen), pg.PlotCurveItem(pen=pen)]
        for line in self.window_lines:
            self.plot.addItem(line)
        self.marker = QGraphicsRectItem()
        self.marker.setPen(pg.mkPen((230, 30, 30), width=2, cosmetic=True))
        self.marker.setVisible(False)
        self.plot.addItem(self.marker)
        self.record: HeadRecord | None = None
        self.shown: np.ndarray | None = None
        self.first_col = 0  # 1 when the BOS / sink column is hidden
        self.hide_sink = False
        self.hidden: tuple[int, ...] = (0,)  # the sink keys hide_sink hides (key 0's column is dropped, others blank)
        self._scale = (1.0, 1.0)
        self.cmap_name = "viridis"
        self.image.hoverEvent = self._hover
        self.image.mouseClickEvent = self._click
        self._bar_titles: tuple[str, ...] = ("attention weight",)
        self.plot.getViewBox().sigResized.connect(lambda _vb: self._fit_bar_title())

    def _fit_bar_title(self) -> None:
        """The colour bar's title: the longest that fits along the bar (a rotated title longer than it is cut)."""
        axis = self.colorbar.getAxis("left")
        room = self.plot.getViewBox().height() - 8
        metrics = QFontMetrics(axis.label.font())
        text = next((t for t in self._bar_titles if metrics.horizontalAdvance(t) <= room), self._bar_titles[-1])
        if axis.labelText != text:
            axis.setLabel(text)

    # ---- drawing

    def set_colormap(self, name: str) -> None:
        self.cmap_name = name
        self.colorbar.setColorMap(colormap(name))

    def set_hide_sink(self, hide: bool) -> None:
        self.hide_sink = hide
        if self.record is not None:
            self.set_record(self.record)

    def set_hidden(self, keys: tuple[int, ...]) -> None:
        """The keys hide_sink hides."""
        self.hidden = tuple(keys)
        if self.record is not None and self.hide_sink:
            self.set_record(self.record)

    def clear_record(self) -> None:
        """Nothing to show (another chat or model); not `clear`, which GraphicsLayoutWidget binds per instance."""
        self.record = None
        self.shown = None
        self.image.clear()
        self.backdrop.setRect(QRectF())
        self.marker.setVisible(False)
        for line in self.window_lines:
            line.setVisible(False)
        self.left.set_tokens(())
        self.bottom.set_tokens(())

    def set_record(self, rec: HeadRecord) -> None:
        """Draw a head record; the view keeps the user's zoom when the same window is redrawn."""
        same_window = self.record is not None and (self.record.row_start, self.record.row_stop) == (rec.row_start, rec.row_stop)
        self.record = rec
        w = np.where(rec.allowed, rec.weights, np.nan).astype(np.float32)
        if self.hide_sink:
            cols = sorted({k // rec.col_step for k in self.hidden if 0 < k // rec.col_step < w.shape[1]})
            w[:, cols] = np.nan  # a hidden sink past key 0: its column is left blank
        self.first_col = 1 if self.hide_sink and 0 in self.hidden and w.shape[1] > 1 else 0
        w = w[:, self.first_col :]
        self.shown = w
        rest = w[:, 1:] if self.first_col == 0 and w.shape[1] > 1 else w  # the sink column may saturate
        finite = rest[np.isfinite(rest)]
        top = float(finite.max()) if finite.size else 1.0
        top = top if top > 0 else 1.0
        sink_max = float(np.nanmax(w[:, 0])) if self.first_col == 0 and np.isfinite(w[:, 0]).any() else 0.0
        saturated = f" (key 0 saturates, up to {sink_max:.2f})" if sink_max > top * 1.01 else ""
        what = "share of the read (|W|)" if rec.recurrent else "attention weight"
        self._bar_titles = (what + saturated, ("share" if rec.recurrent else "weight")
                            + (f" (key 0 ≤ {sink_max:.2f})" if saturated else ""), "share" if rec.recurrent else "weight")
        self.colorbar.setToolTip(what + saturated)
        self._fit_bar_title()
        if rec.sink_share is not None:  # gpt-oss: what the learned sink took never reaches a key of the map
            self.plot.setTitle(f"sink (attention to nothing): {rec.sink_share:.0%}", size="9pt", color="#444")
        elif rec.recurrent:
            self.plot.setTitle(_reads_title(rec), size="9pt", color="#00796b")
        else:
            self.plot.setTitle(None)
        x0 = self.first_col * rec.col_step
        rect = QRectF(x0, rec.row_start, w.shape[1] * rec.col_step, w.shape[0] * rec.row_step)
        shown = _display(w)
        self._scale = (w.shape[0] / max(1, shown.shape[0]), w.shape[1] / max(1, shown.shape[1]))  # data cells per drawn cell
        self.image.setImage(shown, autoLevels=False, levels=(0.0, top), rect=rect)
        self.colorbar.setLevels((0.0, top))
        self.backdrop.setRect(rect)
        self.left.set_tokens(rec.token_texts if rec.row_step == 1 else ())
        self.bottom.set_tokens(rec.token_texts if rec.col_step == 1 else ())
        self._draw_window(rec)
        if not same_window:
            self.plot.getViewBox().setRange(rect, padding=0.0)
        self.marker.setVisible(False)

    def _draw_window(self, rec: HeadRecord) -> None:
        """Outline the band a sliding-window layer may see: keys in (q - window, q]."""
        for line in self.window_lines:
            line.setVisible(rec.window is not None and rec.n_rows > 0)
        if rec.window is None or rec.n_rows == 0:
            return
        y = np.array([rec.row_start, rec.row_stop], dtype=float)
        self.window_lines[0].setData(y + 1, y)  # right edge: the query's own key
        self.window_lines[1].setData(np.maximum(y - rec.window + 1, 0), y)

    def mark(self, query: int, key: int) -> None:
        """Outline one cell (e.g. the query shown in the text view)."""
        self.marker.setRect(QRectF(key, query, 1, 1))
        self.marker.setVisible(True)

    # ---- interaction

    def cell_at(self, pos: QPointF) -> tuple[int, int, float] | None:
        """(query, key, weight) under an ImageItem-local position, or None outside the data."""
        rec, w = self.record, self.shown
        if rec is None or w is None:
            return None
        r, c = int(np.floor(pos.y() * self._scale[0])), int(np.floor(pos.x() * self._scale[1]))
        if not (0 <= r < w.shape[0] and 0 <= c < w.shape[1]):
            return None
        q = rec.row_start + r * rec.row_step
        k = (c + self.first_col) * rec.col_step
        return q, k, float(w[r, c])

    def describe(self, q: int, k: int, weight: float) -> str:
        """'query token -> key token: weight' for the status line."""
        rec = self.record
        assert rec is not None
        texts = rec.token_texts
        qt = token_label(texts[q], 24) if q < len(texts) else "?"
        kt = token_label(texts[k], 24) if k < len(texts) else "?"
        pooled = " (max over a pooled block)" if rec.row_step > 1 or rec.col_step > 1 else ""
        if rec.recurrent:
            return self._describe_read(rec, q, k, qt, kt, weight, pooled)
        value = "masked (cannot attend)" if not np.isfinite(weight) else f"{weight:.4f}"
        return f"query {q} “{qt}” → key {k} “{kt}”: {value}{pooled}"

    @staticmethod
    def _describe_read(rec: HeadRecord, q: int, k: int, qt: str, kt: str, share: float, pooled: str) -> str:
        """A recurrent head's cell: the signed weight with which token q reads the value of token k."""
        r = (q - rec.row_start) // max(1, rec.row_step)
        earlier = ""
        if rec.earlier is not None and 0 <= r < len(rec.earlier) and np.isfinite(rec.earlier[r]) and rec.read_start:
            earlier = f" · earlier context {float(rec.earlier[r]):.1%}"
        if not np.isfinite(share):
            if k > q:
                return f"token {q} “{qt}” cannot read token {k} “{kt}”: it comes later"
            if k < rec.read_start or q < rec.read_start:
                return (f"token {k} “{kt}” is in the earlier context (before token {rec.read_start}): token {q} reads "
                        f"it only through the state, not decomposed here{earlier}")
            return f"token {q} “{qt}” → token {k} “{kt}”: not read"
        signed = rec.signed
        if signed is not None and 0 <= r < signed.shape[0] and 0 <= k < signed.shape[1]:
            w = float(signed[r, k])
            return (f"token {q} “{qt}” reads v of token {k} “{kt}” with weight {w:+.4g} (signed) · share {share:.1%}"
                    + earlier)
        return f"token {q} “{qt}” reads token {k} “{kt}”: share {share:.4f} of |W|{pooled}{earlier}"

    def _hover(self, ev) -> None:
        if ev.isExit():
            return
        cell = self.cell_at(ev.pos())
        if cell is not None:
            self.hovered.emit(self.describe(*cell))

    def _click(self, ev) -> None:
        cell = self.cell_at(ev.pos())
        if cell is not None and ev.button() == Qt.MouseButton.LeftButton:
            ev.accept()
            self.mark(cell[0], cell[1])
            self.cell_clicked.emit(cell[0], cell[1])


def _reads_title(rec: HeadRecord) -> str:
    """The title over a recurrent head's map: what the colours are, and the earlier context's share."""
    text = "exact reads (hover: the signed weight)"
    e = rec.earlier
    if rec.read_start and e is not None and np.isfinite(e).any():
        text = f"earlier context (before {rec.read_start}): {float(np.nanmean(e)):.0%} of the reads"
    return text


def _display(w: np.ndarray) -> np.ndarray:
    """What is drawn: w max-pooled (NaN-ignoring) to at most DISPLAY_MAX cells per side.

    Drawing 2,000 columns into ~1,000 pixels drops every other column, and attention often sits in a single
    key; pooling with fmax keeps such spikes. Hover and the text view still read the exact weights.
    """
    for axis in (0, 1):
        n = w.shape[axis]
        if n > DISPLAY_MAX:
            step = -(-n // DISPLAY_MAX)
            with np.errstate(invalid="ignore"):
                w = np.fmax.reduceat(w, np.arange(0, n, step), axis=axis)
    return w
