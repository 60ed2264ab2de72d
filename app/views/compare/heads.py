"""Attention of one (layer, head) in A and in B side by side, and their difference B − A."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtWidgets import QCheckBox, QHBoxLayout, QLabel, QSizePolicy, QSpinBox, QVBoxLayout, QWidget

from app.records.compare import HeadPair
from app.views.common.colours import colormap
from app.views.common.tokens import TokenAxis, token_label

DIFF_MAP = "CET-D1"  # blue - white - red, diverging around 0
LEVEL_QUANTILE = 0.995  # attention is sparse: colours end here so the bulk is not all one dark shade


def _level(values: np.ndarray, floor: float) -> float:
    """The colour scale's top: a high quantile of the finite values (floor when there are none)."""
    finite = values[np.isfinite(values)]
    top = float(np.quantile(finite, LEVEL_QUANTILE)) if finite.size else floor
    return top if top > 0 else floor


class HeadPairView(QWidget):
    """Three linked heatmaps (query rows x key columns): A, B and B − A, for the chosen layer and head."""

    head_requested = Signal(int, int)  # (layer, head)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.pair: HeadPair | None = None
        self.layer = QSpinBox()
        self.layer.setPrefix("layer ")
        self.head = QSpinBox()
        self.head.setPrefix("head ")
        for spin in (self.layer, self.head):
            spin.setKeyboardTracking(False)
            spin.valueChanged.connect(lambda _v: self.head_requested.emit(self.layer.value(), self.head.value()))
        self.hide_sink = QCheckBox("hide key 0")
        self.hide_sink.setToolTip("Key 0 (the first token) soaks up most attention; hide it to see the rest")
        self.hide_sink.setChecked(True)
        self.hide_sink.toggled.connect(lambda _on: self.set_pair(self.pair) if self.pair is not None else None)
        self.info = QLabel("Run a comparison to see attention in both models.")
        self.info.setTextFormat(Qt.TextFormat.PlainText)  # token texts, never markup
        self.info.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)  # long hover text never widens
        self.info.setWordWrap(True)
        self.info.setFixedHeight(2 * self.info.fontMetrics().lineSpacing() + 4)  # two lines, whatever it says
        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setBackground("w")
        self.images: list[pg.ImageItem] = []
        self.views: list[pg.PlotItem] = []
        self.axes: list[TokenAxis] = []
        for col, title in enumerate(("A", "B", "B − A")):
            left, bottom = TokenAxis("left"), TokenAxis("bottom")
            plot = self.plots.addPlot(row=0, col=col, title=title, axisItems={"left": left, "bottom": bottom})
            plot.invertY(True)
            plot.setMenuEnabled(False)
            plot.hideButtons()
            image = pg.ImageItem(axisOrder="row-major")
            plot.addItem(image)
            if self.views:
                plot.setXLink(self.views[0])
                plot.setYLink(self.views[0])
                plot.getAxis("left").setStyle(showValues=False)  # linked to A's rows: A's labels serve all three
                plot.getAxis("left").setWidth(6)
            self.views.append(plot)
            self.images.append(image)
            self.axes += [left, bottom]
        self.views[0].setLabel("left", "query")
        self.bar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), interactive=False, width=12)
        self.bar.setImageItem(self.images[:2])
        self.plots.addItem(self.bar, row=0, col=3)
        self.diff_bar = pg.ColorBarItem(values=(-1, 1), colorMap=colormap(DIFF_MAP), interactive=False, width=12)
        self.diff_bar.setImageItem(self.images[2])
        self.plots.addItem(self.diff_bar, row=0, col=4)
        for image in self.images:
            image.hoverEvent = lambda ev, im=image: self._hover(ev)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("<b>Attention</b>"))
        bar.addWidget(self.layer)
        bar.addWidget(self.head)
        bar.addWidget(self.hide_sink)
        bar.addStretch(1)
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addLayout(bar)
        root.addWidget(self.info)  # a line of its own: the hover text is long and the pane can be narrow
        root.addWidget(self.plots, 1)

    def set_shape(self, n_layers: int, n_heads: int) -> None:
        """The ranges of the layer and head choosers."""
        for spin, n in ((self.layer, n_layers), (self.head, n_heads)):
            spin.blockSignals(True)
            spin.setRange(0, max(0, n - 1))
            spin.blockSignals(False)

    def set_pair(self, pair: HeadPair) -> None:
        """Draw A, B and B − A on shared levels (key 0 left out of the levels, or hidden)."""
        self.pair = pair
        for spin, v in ((self.layer, pair.layer), (self.head, pair.head)):
            spin.blockSignals(True)
            spin.setValue(v)
            spin.blockSignals(False)
        first = 1 if self.hide_sink.isChecked() and pair.a.weights.shape[1] > 1 else 0
        a = np.where(pair.a.allowed, pair.a.weights, np.nan)[:, first:]
        b = np.where(pair.b.allowed, pair.b.weights, np.nan)[:, first:]
        d = pair.difference()[:, first:]
        rest = np.concatenate([a[:, 1 - first:].ravel(), b[:, 1 - first:].ravel()]) if a.shape[1] > 1 else a.ravel()
        top = _level(rest, 1.0)
        dmax = _level(np.abs(d), 1e-6)
        largest = float(np.nanmax(np.abs(d))) if np.isfinite(d).any() else 0.0
        rec = pair.a
        rect = QRectF(first * rec.col_step, rec.row_start, a.shape[1] * rec.col_step, a.shape[0] * rec.row_step)
        for image, data, levels in ((self.images[0], a, (0.0, top)), (self.images[1], b, (0.0, top)),
                                    (self.images[2], d, (-dmax, dmax))):
            image.setImage(data.astype(np.float32), autoLevels=False, levels=levels, rect=rect)
        self.bar.setLevels((0.0, top))
        self.diff_bar.setLevels((-dmax, dmax))
        texts = rec.token_texts
        for axis in self.axes:
            axis.set_tokens(texts if rec.row_step == 1 and rec.col_step == 1 else ())
        self.views[0].getViewBox().setRange(rect, padding=0.0)
        dnorm = float(np.sqrt(np.nansum(d * d)) / max(np.sqrt(np.nansum(a * a)), 1e-30))
        which = (f"layer {pair.layer} (recurrent: read shares of |W|, no softmax), value head {pair.head}"
                 if rec.recurrent else f"layer {pair.layer}, head {pair.head} (KV head {rec.kv_head})")
        self.info.setText(f"{which} · "
                          f"largest change {largest:.3g} · ‖B−A‖/‖A‖ = {dnorm:.3g} · colours end at the "
                          f"{100 * LEVEL_QUANTILE:g}th percentile")

    def _hover(self, ev) -> None:
        if ev.isExit() or self.pair is None:
            return
        pos = ev.pos()
        first = 1 if self.hide_sink.isChecked() else 0
        r, c = int(np.floor(pos.y())), int(np.floor(pos.x())) + first
        a, b = self.pair.a, self.pair.b
        if not (0 <= r < a.weights.shape[0] and 0 <= c < a.weights.shape[1]):
            return
        q, k = a.row_start + r * a.row_step, c * a.col_step  # long texts are max-pooled to fit
        texts = a.token_texts
        qt = token_label(texts[q], 16) if q < len(texts) else "?"
        kt = token_label(texts[k], 16) if k < len(texts) else "?"
        if not a.allowed[r, c]:
            self.info.setText(f"query {q} “{qt}” → key {k} “{kt}”: masked")
            return
        wa, wb = float(a.weights[r, c]), float(b.weights[r, c])
        self.info.setText(f"query {q} “{qt}” → key {k} “{kt}”: A {wa:.4f} · B {wb:.4f} · B − A {wb - wa:+.4f}")
