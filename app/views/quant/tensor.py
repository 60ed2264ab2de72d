"""The selected tensor in the quant lens: weight and block-scale histograms, and one block taken apart."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QSpinBox,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.records.tensor import TensorRecord
from app.views.common.flow import FlowBox
from app.views.quant.imatrix import ImportanceStrip
from engine.quant.blocks import DecodedBlock

FIELD_COLOURS = ((0, 114, 178), (230, 159, 0), (0, 158, 115), (204, 121, 167), (86, 180, 233), (213, 94, 0))
MAX_VALUES_SHOWN = 16
CLIP_QUANTILE = 0.0005  # the weight histogram opens on the central 99.9%; drag out to see the tails
MIN_PLOT_HEIGHT = 220  # the histograms and the block plots never shrink to a sliver
EMPTY_TEXT = ("Click a tensor in the table (or in “All tensors”) to see why it has its type, its weight and "
              "block-scale distributions, and one block decoded field by field.")


class TensorDetail(QWidget):
    """Histograms and the field-by-field block decode of one TensorRecord."""

    block_requested = Signal(str, int)  # (tensor name, block index)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.record: TensorRecord | None = None
        self.reason = ""  # why the tensor has its type (the lens gives it: preset, fallback, rule)
        self.title = QLabel("Click a tensor in the table.")
        self.title.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.title.setWordWrap(True)
        self.why = QLabel("")  # "why Q5_0: 640 columns are not a multiple of Q4_K's 256-wide super-block ..."
        self.why.setTextFormat(Qt.TextFormat.PlainText)
        self.why.setWordWrap(True)
        self.why.setStyleSheet("color: #444; background: #f4f6fa; border-radius: 3px; padding: 2px 4px;")
        self.why.hide()
        self.importance = ImportanceStrip()  # the tensor's column importance when an imatrix is loaded
        self.importance.hide()
        self.scale_box = QComboBox()
        self.scale_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.block_spin = QSpinBox()
        self.block_spin.setPrefix("block ")
        self.block_spin.setKeyboardTracking(False)
        weights, scales = pg.PlotWidget(background="w"), pg.PlotWidget(background="w")
        for w in (weights, scales):
            w.setMinimumSize(240, MIN_PLOT_HEIGHT)
        self.plots = FlowBox([weights, scales], min_width=300)  # side by side, or one above the other when narrow
        self.weight_plot = weights.getPlotItem()
        self.weight_plot.setTitle("Dequantized weights")
        self.scale_plot = scales.getPlotItem()
        self.scale_plot.setTitle("Block scales")
        for p in (self.weight_plot, self.scale_plot):
            p.setLabel("left", "count")
            p.getAxis("bottom").setStyle(maxTickLevel=1)  # fewer, wider-spaced tick labels: none overlap
        self.block_plots = pg.GraphicsLayoutWidget()  # one block: its bytes and its weights
        self.block_plots.setBackground("w")
        self.layout_plot = self.block_plots.addPlot(row=0, col=0, title="Raw layout of one block (bytes)")
        self.layout_plot.hideAxis("left")
        self.layout_plot.setMouseEnabled(x=True, y=False)
        self.block_plot = self.block_plots.addPlot(row=1, col=0, title="The block's weights: w = scale · q + offset")
        self.block_plot.setLabel("bottom", "weight index in the block")
        self.block_plots.ci.layout.setRowStretchFactor(0, 1)
        self.block_plots.ci.layout.setRowStretchFactor(1, 2)
        self.block_plots.setMinimumHeight(MIN_PLOT_HEIGHT)
        self.fields = QTableWidget(0, 6)
        self.fields.setHorizontalHeaderLabels(["field", "bytes", "stored as", "meaning", "decodes to", "raw (hex)"])
        self.fields.verticalHeader().setVisible(False)
        header = self.fields.horizontalHeader()  # meaning and value share what the pane has left (never a sideways
        for j, width in enumerate((60, 64, 96, 0, 0, 120)):  # scroll at 1280x800): a long cell is cut, whole in its tip
            header.setSectionResizeMode(j, QHeaderView.ResizeMode.Stretch if not width else
                                        QHeaderView.ResizeMode.Interactive)
            if width:
                self.fields.setColumnWidth(j, width)
        self.fields.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.formula = QLabel("")
        self.formula.setWordWrap(True)
        bar = QHBoxLayout()
        bar.addWidget(self.title, 1)
        bar.addWidget(QLabel("scale field"))
        bar.addWidget(self.scale_box)
        bar.addWidget(self.block_spin)
        block_page = QWidget()
        bl = QVBoxLayout(block_page)
        bl.setContentsMargins(0, 0, 0, 0)
        bl.addWidget(self.block_plots, 3)
        bl.addWidget(self.formula)
        bl.addWidget(self.fields, 2)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.plots, "Distributions")
        self.tabs.addTab(block_page, "One block, field by field")
        content = QWidget()
        cl = QVBoxLayout(content)
        cl.setContentsMargins(0, 0, 0, 0)
        cl.addLayout(bar)
        cl.addWidget(self.why)
        cl.addWidget(self.importance)
        cl.addWidget(self.tabs, 1)
        self.empty = QLabel(EMPTY_TEXT)  # no axes before there is something to plot
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.empty.setStyleSheet("color: #888; padding: 16px;")
        self.stack = QStackedWidget()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(content)
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addWidget(self.stack)
        self.scale_box.currentTextChanged.connect(lambda _: self._draw_scales())
        self.block_spin.valueChanged.connect(self._block_changed)

    def clear(self, text: str = "") -> None:
        """Back to the empty state (a new model: the tensor shown belongs to the old one)."""
        self.record = None
        self.reason = ""
        self.empty.setText(text or EMPTY_TEXT)
        self.stack.setCurrentWidget(self.empty)

    def set_importance(self, name: str, values: np.ndarray | None) -> None:
        """The imatrix's column importance of the shown tensor (None: no imatrix, or it has no entry)."""
        self.importance.set_values(name, values)

    def loading(self, name: str) -> None:
        """A tensor was asked for: say so (in the empty state until the first record arrives)."""
        self.title.setText(f"Loading {name}…")
        if self.record is None:
            self.empty.setText(f"Loading {name}…")

    def set_reason(self, text: str) -> None:
        """Why the shown tensor has its type, under the title (and in its tooltip)."""
        self.reason = text
        self.why.setText(f"why {self.record.type_name}: {text}" if text and self.record is not None else text)
        self.why.setVisible(bool(text))

    def set_record(self, rec: TensorRecord, reason: str = "") -> None:
        """Show a tensor: why it has its type, its histograms and the decoded block."""
        self.record = rec
        self.stack.setCurrentIndex(1)
        self.set_reason(reason)
        shape = " × ".join(str(s) for s in rec.shape)
        sampled = "" if rec.sampled_rows >= rec.n_rows else f" (histogram of {rec.sampled_rows:,} of {rec.n_rows:,} rows)"
        st = rec.weight_stats
        stats = f" · min {st['min']:.4g}, max {st['max']:.4g}, mean {st['mean']:.3g}, std {st['std']:.3g}" if st else ""
        self.title.setText(f"<b>{rec.name}</b> · {rec.type_name} · [{shape}] · {rec.nbytes:,} bytes · "
                           f"{rec.bpw:.4g} bits/weight{stats}{sampled}")
        _histogram(self.weight_plot, rec.weight_counts, rec.weight_edges, (0, 114, 178))
        lo, hi = _central_range(rec.weight_counts, rec.weight_edges)
        self.weight_plot.setXRange(lo, hi, padding=0.05)
        self.weight_plot.setTitle("Weights (central 99.9%)")  # short: a long title would widen the plot past its pane
        self.weight_plot.setToolTip(f"all weights: {st.get('min', 0):.4g} … {st.get('max', 0):.4g}; drag to see the tails")
        current = self.scale_box.currentText()
        self.scale_box.blockSignals(True)
        self.scale_box.clear()
        self.scale_box.addItems(list(rec.scale_counts))
        if current in rec.scale_counts:
            self.scale_box.setCurrentText(current)
        self.scale_box.blockSignals(False)
        self._draw_scales()
        n_blocks = (rec.nbytes // rec.block.type_size) if rec.block else 1
        self.block_spin.blockSignals(True)
        self.block_spin.setRange(0, max(0, n_blocks - 1))
        self.block_spin.setValue(rec.block_index)
        self.block_spin.blockSignals(False)
        self._draw_block(rec.block)

    def _block_changed(self, index: int) -> None:
        if self.record is not None:
            self.block_requested.emit(self.record.name, int(index))

    def _draw_scales(self) -> None:
        rec = self.record
        key = self.scale_box.currentText()
        if rec is None or key not in rec.scale_counts:
            self.scale_plot.clear()
            self.scale_plot.setTitle("No block scales (plain floats)")
            return
        _histogram(self.scale_plot, rec.scale_counts[key], rec.scale_edges[key], (213, 94, 0))
        lo, hi = _central_range(rec.scale_counts[key], rec.scale_edges[key])
        self.scale_plot.setXRange(lo, hi, padding=0.05)
        self.scale_plot.setTitle(f"Block scales: {key}")

    def _draw_block(self, block: DecodedBlock | None) -> None:
        self.layout_plot.clear()
        self.block_plot.clear()
        self.fields.setRowCount(0)
        if block is None:
            self.formula.setText("This type cannot be decoded here.")
            return
        self.formula.setText(f"<b>{block.type_name}</b>: {block.block_size} weights in {block.type_size} bytes "
                             f"({8 * block.type_size / block.block_size:.4g} bits/weight) · {block.formula}")
        for i, f in enumerate(block.fields):
            c = FIELD_COLOURS[i % len(FIELD_COLOURS)]
            bar = pg.BarGraphItem(x0=[f.spec.offset], x1=[f.spec.offset + f.spec.size], y0=[0], y1=[1], brush=pg.mkBrush(*c, 170), pen=pg.mkPen("w"))
            self.layout_plot.addItem(bar)
            narrow = f.spec.size < 0.08 * block.type_size  # small fields are labelled above the bar, staggered
            label = pg.TextItem(f"{f.spec.name} ({f.spec.size} B)" if narrow else f"{f.spec.name}\n{f.spec.size} B",
                                color=(0, 0, 0), anchor=(0.5, 0.5) if not narrow else (0.0, 0.5))
            label.setPos(f.spec.offset + (f.spec.size / 2 if not narrow else 0), 0.5 if not narrow else 1.25 + 0.35 * (i % 2))
            self.layout_plot.addItem(label)
            self._field_row(i, f, c)
        self.layout_plot.setXRange(0, block.type_size, padding=0.01)
        self.layout_plot.setYRange(0, 1.8, padding=0.02)
        x = np.arange(block.block_size)
        self.block_plot.plot(x, block.scales * block.quants.astype(np.float32) + block.offsets, pen=pg.mkPen((150, 150, 150), width=1))
        self.block_plot.plot(x, block.weights, pen=None, symbol="o", symbolSize=5, symbolBrush=(0, 114, 178), symbolPen=None)
        index = self.record.block_index if self.record else 0
        if block.block_size > 1:
            self.block_plot.plot(x, block.offsets, pen=pg.mkPen((213, 94, 0), width=1.5, style=Qt.PenStyle.DashLine))
            n_scales = np.unique(block.scales).size
            self.block_plot.setTitle(f"Block {index}: {n_scales} scale(s), q {block.quants.min()}…{block.quants.max()}")
            self.block_plot.setToolTip("dots: the weights w; grey: scale · q + offset; dashes: the offset")
        else:
            self.block_plot.setTitle(f"Element {index}: a plain float, w = {block.weights[0]:.6g}")

    def _field_row(self, i: int, f, colour: tuple[int, int, int]) -> None:
        self.fields.insertRow(i)
        raw = " ".join(f"{b:02x}" for b in f.raw[:16]) + (" …" if f.raw.size > 16 else "")
        vals = np.asarray(f.values).reshape(-1)
        shown = ", ".join(_fmt(v) for v in vals[:MAX_VALUES_SHOWN]) + (f", … ({vals.size} values)" if vals.size > MAX_VALUES_SHOWN else "")
        cells = [f.spec.name, f"{f.spec.offset}–{f.spec.offset + f.spec.size - 1}", f.spec.kind, f.spec.meaning, shown, raw]
        for j, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(text)
            if j == 0:
                item.setBackground(QColor(*colour, 120))
            self.fields.setItem(i, j, item)


def _fmt(v: object) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.5g}"
    return str(int(v)) if isinstance(v, (int, np.integer)) else str(v)


def _histogram(plot: pg.PlotItem, counts: np.ndarray, edges: np.ndarray, colour: tuple[int, int, int]) -> None:
    plot.clear()
    if counts.size == 0 or counts.sum() == 0:
        return
    plot.plot(edges, counts, stepMode="center", fillLevel=0, brush=pg.mkBrush(*colour, 120), pen=pg.mkPen(colour))


def _central_range(counts: np.ndarray, edges: np.ndarray) -> tuple[float, float]:
    """The value range holding all but CLIP_QUANTILE of the mass at each end, from a histogram."""
    if counts.size == 0 or counts.sum() == 0:
        return float(edges[0]), float(edges[-1])
    cdf = np.cumsum(counts) / counts.sum()
    lo = int(np.searchsorted(cdf, CLIP_QUANTILE))
    hi = int(np.searchsorted(cdf, 1 - CLIP_QUANTILE))
    return float(edges[lo]), float(edges[min(hi + 1, len(edges) - 1)])
