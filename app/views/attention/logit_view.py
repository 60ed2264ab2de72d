"""The logit lens: each layer's residual stream through the model's own final norm and output head.

`LogitLensPanel` draws one LogitLensRecord: a layers x positions heatmap of the produced token's probability
(or rank), and for the selected position each layer's top 5 next to the produced token's rank and probability.
`LogitLensView` adds the controls and asks for records through `logit_requested(position, width)`.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QGraphicsRectItem,
    QHeaderView,
    QLabel,
    QPushButton,
    QSpinBox,
    QSplitter,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.records.logit_lens import LENS_WIDTH, LogitLensRecord, on_top_text
from app.views.attention.controls import FlowLayout, NoHfwLabel
from app.views.common.colours import colormap
from app.views.common.tokens import token_label

METRICS = (("probability of the produced token", "prob"), ("rank of the produced token (log)", "rank"))
EMPTY_TEXT = "Send a message to see the logit lens."
COLOUR_TITLES = {"prob": ("p", "the produced token's softmax probability at temperature 1"),
                 "rank": ("log₁₀ rank", "log₁₀(rank + 1) of the produced token: 0 = the layer's top token")}
RANK_DECADES = 4.0  # the rank colour scale runs from rank 1 to rank 10^4 and beyond
HIT = QBrush(QColor(200, 235, 200))


def _colours(name: str, reverse: bool) -> pg.ColorMap:
    cmap = colormap(name)
    if reverse:
        pos, col = cmap.getStops()
        cmap = pg.ColorMap(1.0 - pos[::-1], col[::-1])
    return cmap


class LogitLensPanel(QWidget):
    """Heatmap (layers x positions) and the selected position's top-5 table of one LogitLensRecord."""

    position_clicked = Signal(int)  # a position of the heatmap (a context index)
    hovered = Signal(str)

    def __init__(self, parent: QWidget | None = None, vertical: bool = True):
        super().__init__(parent)
        self.record: LogitLensRecord | None = None
        self.recurrent: frozenset[int] = frozenset()  # a hybrid's recurrent layers: "R" beside their rows
        self.metric_key = "prob"  # not `metric`: QWidget.metric() is a virtual Qt calls
        self.column = 0
        self.title = NoHfwLabel("")
        self.title.setMinimumHeight(32)
        self.title.setTextFormat(Qt.TextFormat.PlainText)
        self.title.setWordWrap(True)
        self.axis = pg.AxisItem("bottom")
        self.plot = pg.PlotWidget(axisItems={"bottom": self.axis})
        self.plot.setBackground("w")
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(False, False)
        self.plot.invertY(True)
        self.plot.setLabel("left", "after layer")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), interactive=False, width=12)
        self.colorbar.setImageItem(self.image, insert_in=self.plot.getPlotItem())
        self.plot.getPlotItem().layout.setContentsMargins(2, 10, 2, 2)  # the colour bar's top label is drawn whole
        self.marker = QGraphicsRectItem()
        self.marker.setPen(pg.mkPen((230, 30, 30), width=2, cosmetic=True))
        self.marker.setVisible(False)
        self.plot.addItem(self.marker)
        # the empty state is a word-wrapped label in place of the plots, never text drawn inside a plot (cut there)
        self.empty = QLabel("")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.empty.setTextFormat(Qt.TextFormat.PlainText)
        self.empty.setStyleSheet("color: #555; background: white; padding: 12px;")
        self.image.hoverEvent = self._hover
        self.image.mouseClickEvent = self._click
        self.tick_every = 1  # a position label under every tick_every-th column
        self.plot.getPlotItem().vb.sigResized.connect(lambda _vb: self._position_ticks())
        self.table = QTableWidget(0, 8)
        self.table.setHorizontalHeaderLabels(["layer", "rank", "p", "top 1", "top 2", "top 3", "top 4", "top 5"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setWordWrap(False)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        split = QSplitter(Qt.Orientation.Vertical if vertical else Qt.Orientation.Horizontal)
        split.addWidget(self.plot)
        split.addWidget(self.table)
        split.setSizes([460, 300])
        split.setChildrenCollapsible(False)
        self.split = split
        self.stack = QStackedWidget()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(split)
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addWidget(self.title)
        root.addWidget(self.stack, 1)
        self.clear()

    def clear(self, message: str = EMPTY_TEXT) -> None:
        self.record = None
        self.image.clear()
        self.marker.setVisible(False)
        self.table.setRowCount(0)
        self.axis.setTicks([[], []])
        self.empty.setText(message)
        self.stack.setCurrentWidget(self.empty)
        self.plot.setRange(QRectF(0, 0, 1, 1), padding=0)
        self.title.setText("")

    def busy(self, text: str) -> None:
        """Say what is being computed: in the header over a record already drawn, else in the empty state
        (never over the plots)."""
        if self.record is None:
            self.empty.setText(text)
            self.stack.setCurrentWidget(self.empty)
        else:
            self.title.setText(text)

    def fit_width(self, n_top: int = 5) -> None:
        """Never scroll sideways: the first `n_top` top-k columns share the width left (elided; each cell's tooltip
        says it whole), the others are hidden."""
        header = self.table.horizontalHeader()
        for j in range(3, self.table.columnCount()):
            header.setSectionResizeMode(j, QHeaderView.ResizeMode.Stretch)
            self.table.setColumnHidden(j, j - 3 >= n_top)
        header.setStretchLastSection(False)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)

    def set_metric(self, metric: str) -> None:
        self.metric_key = metric
        if self.record is not None:
            self._draw_map()

    def set_record(self, rec: LogitLensRecord) -> None:
        self.record = rec
        self.column = rec.column(rec.selected)
        self._draw_map()
        self.select(rec.selected)

    def values(self) -> np.ndarray:
        """(L, P) what the heatmap shows: probability, or log10(rank + 1) capped at RANK_DECADES."""
        lens = self.record.lens  # type: ignore[union-attr]
        if self.metric_key == "rank":
            return np.minimum(np.log10(lens.rank + 1.0), RANK_DECADES).astype(np.float32)
        return lens.prob.astype(np.float32)

    def _draw_map(self) -> None:
        rec = self.record
        assert rec is not None
        lens = rec.lens
        v = self.values()
        n_l, n_p = v.shape
        self.stack.setCurrentWidget(self.split)
        rank = self.metric_key == "rank"
        top = RANK_DECADES if rank else 1.0
        self.image.setImage(v, autoLevels=False, levels=(0.0, top), rect=QRectF(0, 0, n_p, n_l))
        self.colorbar.setColorMap(_colours("viridis", reverse=rank))
        self.colorbar.setLevels((0.0, top))
        title, tip = COLOUR_TITLES[self.metric_key]  # short: a rotated title longer than the bar is cut
        self.colorbar.getAxis("left").setLabel(title)
        self.colorbar.setToolTip(tip)
        self._position_ticks()
        step = max(1, n_l // 12)
        self.plot.getAxis("left").setTicks([[(li + 0.5, self.layer_text(int(lens.layers[li])))
                                             for li in range(0, n_l, step)]])
        self.plot.setRange(QRectF(0, 0, n_p, n_l), padding=0)
        first = int(lens.positions[0]) if n_p else 0
        self.plot.setLabel("bottom", f"positions {first}–{first + n_p - 1}")  # short: a narrow panel cuts a long one
        self.plot.setToolTip("Columns: positions of the context, each with the token read there; rows: after each layer")

    def _position_ticks(self) -> None:
        """Positions every few columns, as many as fit apart in the plot's width; the tokens themselves where there
        is room (pyqtgraph drops texts that collide)."""
        rec = self.record
        if rec is None:
            return
        positions = rec.lens.positions
        n_p = len(positions)
        px = self.plot.getPlotItem().vb.width() / max(1, n_p)  # screen pixels per column
        need = self.fontMetrics().horizontalAdvance(str(int(positions[-1]) if n_p else 0)) + 10
        every = next((k for k in (1, 2, 3, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64) if k * px >= need), 128)
        self.tick_every = every
        major = [(c + 0.5, str(int(p))) for c, p in enumerate(positions) if c % every == 0]
        minor = [(c + 0.5, token_label(rec.token_texts[int(p)], 6)) for c, p in enumerate(positions)]
        self.axis.setTicks([major, minor])

    def select(self, position: int) -> None:
        """Fill the table with the layers' top 5 at `position` (one of the decoded positions)."""
        rec = self.record
        if rec is None:
            return
        lens = rec.lens
        c = rec.column(position)
        self.column = c
        n_l = len(lens.layers)
        self.marker.setRect(QRectF(c, 0, 1, n_l))
        self.marker.setVisible(True)
        target = int(lens.targets[c])
        pos = int(lens.positions[c])
        what = "the next token in the context" if lens.target_known[c] else "the model's own top token (nothing follows yet)"
        self.title.setText(f"{rec.label}: after position {pos} “{token_label(rec.token_texts[pos], 20)}”, "
                           f"the produced token is “{token_label(rec.text(target), 20)}” ({what}): "
                           f"{on_top_text(lens, c)}.")
        self.table.setRowCount(n_l)
        for li in range(n_l):
            cells = [self.layer_text(int(lens.layers[li])), str(int(lens.rank[li, c]) + 1), f"{float(lens.prob[li, c]):.3f}"]
            for k in range(lens.top_ids.shape[2]):
                t = int(lens.top_ids[li, c, k])
                cells.append(f"{token_label(rec.text(t), 14)}  {float(lens.top_probs[li, c, k]):.2f}")
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if j >= 3:
                    item.setToolTip(f"layer {lens.layers[li]}, top {j - 2}: {text}")
                if j >= 3 and int(lens.top_ids[li, c, j - 3]) == target:
                    item.setBackground(HIT)
                self.table.setItem(li, j, item)
        self.table.setToolTip("rank 1 = the layer's top token; p = its softmax probability at temperature 1; "
                              "green = the produced token")

    def layer_text(self, layer: int) -> str:
        """A layer's row label: '12', or '3 R' for a hybrid's recurrent layer."""
        return f"{layer} R" if layer in self.recurrent else str(layer)

    # ---- interaction

    def describe(self, li: int, c: int) -> str:
        rec = self.record
        assert rec is not None
        lens = rec.lens
        pos, target = int(lens.positions[c]), int(lens.targets[c])
        tops = ", ".join(f"“{token_label(rec.text(int(t)), 10)}”" for t in lens.top_ids[li, c, :3])
        kind = " (recurrent)" if int(lens.layers[li]) in self.recurrent else ""
        return (f"layer {lens.layers[li]}{kind}, position {pos} “{token_label(rec.token_texts[pos], 14)}” → "
                f"“{token_label(rec.text(target), 14)}”: rank {int(lens.rank[li, c]) + 1}, "
                f"p = {float(lens.prob[li, c]):.3f} · top: {tops}")

    def _cell(self, ev) -> tuple[int, int] | None:
        rec = self.record
        if rec is None:
            return None
        n_l, n_p = rec.lens.rank.shape
        li, c = int(np.floor(ev.pos().y())), int(np.floor(ev.pos().x()))
        return (li, c) if 0 <= li < n_l and 0 <= c < n_p else None

    def _hover(self, ev) -> None:
        if ev.isExit():
            return
        hit = self._cell(ev)
        if hit is not None:
            self.hovered.emit(self.describe(*hit))

    def _click(self, ev) -> None:
        hit = self._cell(ev)
        if hit is not None and ev.button() == Qt.MouseButton.LeftButton and self.record is not None:
            ev.accept()
            pos = int(self.record.lens.positions[hit[1]])
            self.select(pos)
            self.position_clicked.emit(pos)


class LogitLensView(QWidget):
    """Controls (position, width, metric) over a LogitLensPanel; asks with logit_requested(position, width).

    The position box is the one source of truth for the selected position: the header and the table always
    describe the position it shows (a record decoded for another position is shown at the box's position when
    it covers it, else the box moves to the record's; a position not decoded yet says so in the header).
    """

    logit_requested = Signal(int, int)  # position (-1 = the last), positions in the heatmap
    hovered = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.n_tokens = 0
        self.position = QSpinBox()
        self.position.setPrefix("position ")
        self.position.setKeyboardTracking(False)
        self.position.setToolTip("The token position whose top 5 per layer are listed (the heatmap ends there)")
        self.width_spin = QSpinBox()
        self.width_spin.setRange(4, 256)
        self.width_spin.setValue(LENS_WIDTH)
        self.width_spin.setSuffix(" positions")
        self.width_spin.setToolTip("Positions in the heatmap: each costs one output-head product per layer")
        self.metric_box = QComboBox()  # not `metric`: QWidget.metric() is a virtual Qt calls
        for text, key in METRICS:
            self.metric_box.addItem(text, key)
        self.run = QPushButton("Decode layers")
        self.run.setToolTip("Re-run the context once recording every layer's residual stream, "
                            "and decode each through the final norm and output head")
        bar = QWidget()
        flow = FlowLayout(bar)
        for w in (self.position, self.width_spin, self.metric_box, self.run):
            flow.addWidget(w)
        self.panel = LogitLensPanel()
        self.panel.fit_width()  # the top 5 share the pane's width: no sideways scrolling at 1280x800
        self.kinds = NoHfwLabel("")  # a hybrid: why its recurrent layers are rows like the others
        self.kinds.setWordWrap(True)
        self.kinds.setTextFormat(Qt.TextFormat.PlainText)
        self.kinds.setStyleSheet("color: #00796b;")
        self.kinds.setVisible(False)
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addWidget(bar)
        root.addWidget(self.kinds)
        root.addWidget(self.panel, 1)
        self.run.clicked.connect(self.request)
        self.position.valueChanged.connect(lambda _v: self._position_changed())
        self.metric_box.currentIndexChanged.connect(lambda _i: self.panel.set_metric(str(self.metric_box.currentData())))
        self.panel.position_clicked.connect(self._clicked)
        self.panel.hovered.connect(self.hovered)

    def clear(self, message: str = EMPTY_TEXT) -> None:
        self.n_tokens = 0
        self._set_position(0, 0)
        self.panel.clear(message)

    def set_recurrent(self, layers: tuple[int, ...] | list[int]) -> None:
        """A hybrid's recurrent layers: marked 'R'; every layer is decoded, whatever mixes its tokens."""
        self.panel.recurrent = frozenset(int(i) for i in layers)
        self.kinds.setVisible(bool(layers))
        self.kinds.setText("Every layer is decoded, recurrent (R, gated DeltaNet) and attention alike: each adds its "
                           "output to the same residual stream, which is what the lens reads." if layers else "")

    def set_tokens(self, n: int) -> None:
        """The context has n tokens; the position follows the end when it was there."""
        at_end = self.position.value() >= self.n_tokens - 1
        self.n_tokens = n
        self._set_position(self.position.value() if not at_end else max(0, n - 1), max(0, n - 1))
        if self.panel.record is not None and not self._shows(self.position.value()):
            self.panel.busy(f"Position {self.position.value()} of this context is not decoded yet: "
                            "press Decode layers.")

    def stale(self) -> bool:
        rec = self.panel.record
        return self.n_tokens > 0 and (rec is None or rec.n_tokens != self.n_tokens)

    def request(self) -> None:
        """Ask for the position in the box. With no tokens known yet the lens still asks (the chat shown is read
        once first); the answer, or why there is none, replaces the busy line."""
        p = self.position.value() if self.n_tokens else -1
        where = f" at position {p}" if p >= 0 else ""
        self.panel.busy(f"Decoding every layer{where}…")
        self.logit_requested.emit(p, self.width_spin.value())

    def show_position(self, index: int) -> None:
        """Select a position (e.g. a token clicked elsewhere): drawn at once when decoded, else asked for."""
        self.position.setValue(int(index))

    def set_record(self, rec: LogitLensRecord) -> None:
        """Draw a record at the box's position when it decoded that one, else at its own (the box follows)."""
        if self.n_tokens == 0:  # asked before the context's tokens were known here (a reopened chat)
            self.n_tokens = rec.n_tokens
            self._set_position(rec.selected, max(0, rec.n_tokens - 1))
        p = self.position.value()
        self.panel.set_record(rec)
        if rec.covers(p):
            self.panel.select(p)
        else:
            self._set_position(rec.selected)

    def _shows(self, p: int) -> bool:
        rec = self.panel.record
        return rec is not None and rec.n_tokens == self.n_tokens and rec.covers(p)

    def _set_position(self, value: int, top: int | None = None) -> None:
        """Move the box without asking (the caller draws or asks)."""
        self.position.blockSignals(True)
        if top is not None:
            self.position.setRange(0, top)
        self.position.setValue(int(value))
        self.position.blockSignals(False)

    def _position_changed(self) -> None:
        p = self.position.value()
        if self._shows(p):
            self.panel.select(p)
        else:
            self.request()

    def _clicked(self, pos: int) -> None:
        self._set_position(pos)
