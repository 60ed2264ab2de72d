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
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.records.logit_lens import LENS_WIDTH, LogitLensRecord
from app.views.attention.controls import FlowLayout, NoHfwLabel
from app.views.common.colours import colormap
from app.views.common.tokens import token_label

METRICS = (("probability of the produced token", "prob"), ("rank of the produced token (log)", "rank"))
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
        self.metric = "prob"
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
        self.marker = QGraphicsRectItem()
        self.marker.setPen(pg.mkPen((230, 30, 30), width=2, cosmetic=True))
        self.marker.setVisible(False)
        self.plot.addItem(self.marker)
        self.empty = pg.TextItem("", color="#555", anchor=(0.5, 0.5))
        self.plot.addItem(self.empty)
        self.image.hoverEvent = self._hover
        self.image.mouseClickEvent = self._click
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
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addWidget(self.title)
        root.addWidget(split, 1)
        self.clear()

    def clear(self, message: str = "Send a message to see the logit lens.") -> None:
        self.record = None
        self.image.clear()
        self.marker.setVisible(False)
        self.table.setRowCount(0)
        self.axis.setTicks([[], []])
        self.empty.setText(message)
        self.empty.setPos(0.5, 0.5)
        self.plot.setRange(QRectF(0, 0, 1, 1), padding=0)
        self.title.setText("")

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
        self.metric = metric
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
        if self.metric == "rank":
            return np.minimum(np.log10(lens.rank + 1.0), RANK_DECADES).astype(np.float32)
        return lens.prob.astype(np.float32)

    def _draw_map(self) -> None:
        rec = self.record
        assert rec is not None
        lens = rec.lens
        v = self.values()
        n_l, n_p = v.shape
        self.empty.setText("")
        rank = self.metric == "rank"
        top = RANK_DECADES if rank else 1.0
        self.image.setImage(v, autoLevels=False, levels=(0.0, top), rect=QRectF(0, 0, n_p, n_l))
        self.colorbar.setColorMap(_colours("viridis", reverse=rank))
        self.colorbar.setLevels((0.0, top))
        self.colorbar.getAxis("left").setLabel("log₁₀(rank + 1)" if rank else "p (softmax, temperature 1)")
        # positions every few columns, the tokens themselves where there is room (pyqtgraph drops texts that collide)
        every = max(1, n_p // 8)
        major = [(c + 0.5, str(int(p))) for c, p in enumerate(lens.positions) if c % every == 0]
        minor = [(c + 0.5, token_label(rec.token_texts[int(p)], 6)) for c, p in enumerate(lens.positions)]
        self.axis.setTicks([major, minor])
        step = max(1, n_l // 12)
        self.plot.getAxis("left").setTicks([[(li + 0.5, str(lens.layers[li])) for li in range(0, n_l, step)]])
        self.plot.setRange(QRectF(0, 0, n_p, n_l), padding=0)
        first = int(lens.positions[0]) if n_p else 0
        self.plot.setLabel("bottom", f"positions {first}–{first + n_p - 1}")  # short: a narrow panel cuts a long one
        self.plot.setToolTip("Columns: positions of the context, each with the token read there; rows: after each layer")

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
        decided = int(lens.decided_at()[c])
        when = f"top token from layer {decided} on" if decided >= 0 else "never the top token"
        self.title.setText(f"{rec.label}: after position {pos} “{token_label(rec.token_texts[pos], 20)}”, "
                           f"the produced token is “{token_label(rec.text(target), 20)}” ({what}): {when}.")
        self.table.setRowCount(n_l)
        for li in range(n_l):
            cells = [str(lens.layers[li]), str(int(lens.rank[li, c]) + 1), f"{float(lens.prob[li, c]):.3f}"]
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

    # ---- interaction

    def describe(self, li: int, c: int) -> str:
        rec = self.record
        assert rec is not None
        lens = rec.lens
        pos, target = int(lens.positions[c]), int(lens.targets[c])
        tops = ", ".join(f"“{token_label(rec.text(int(t)), 10)}”" for t in lens.top_ids[li, c, :3])
        return (f"layer {lens.layers[li]}, position {pos} “{token_label(rec.token_texts[pos], 14)}” → "
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
    """Controls (position, width, metric) over a LogitLensPanel; asks with logit_requested(position, width)."""

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
        self.metric = QComboBox()
        for text, key in METRICS:
            self.metric.addItem(text, key)
        self.run = QPushButton("Decode layers")
        self.run.setToolTip("Re-run the context once recording every layer's residual stream, "
                            "and decode each through the final norm and output head")
        bar = QWidget()
        flow = FlowLayout(bar)
        for w in (self.position, self.width_spin, self.metric, self.run):
            flow.addWidget(w)
        self.panel = LogitLensPanel()
        self.panel.fit_width()  # the top 5 share the pane's width: no sideways scrolling at 1280x800
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addWidget(bar)
        root.addWidget(self.panel, 1)
        self.run.clicked.connect(self.request)
        self.position.valueChanged.connect(lambda _v: self._position_changed())
        self.metric.currentIndexChanged.connect(lambda _i: self.panel.set_metric(str(self.metric.currentData())))
        self.panel.position_clicked.connect(self._clicked)
        self.panel.hovered.connect(self.hovered)

    def clear(self) -> None:
        self.n_tokens = 0
        self.position.blockSignals(True)
        self.position.setRange(0, 0)
        self.position.blockSignals(False)
        self.panel.clear()

    def set_tokens(self, n: int) -> None:
        """The context has n tokens; the position follows the end when it was there."""
        at_end = self.position.value() >= self.n_tokens - 1
        self.n_tokens = n
        self.position.blockSignals(True)
        self.position.setRange(0, max(0, n - 1))
        if at_end:
            self.position.setValue(max(0, n - 1))
        self.position.blockSignals(False)

    def stale(self) -> bool:
        rec = self.panel.record
        return self.n_tokens > 0 and (rec is None or rec.n_tokens != self.n_tokens)

    def request(self) -> None:
        if self.n_tokens:
            self.panel.empty.setText("decoding every layer…")
            self.logit_requested.emit(self.position.value(), self.width_spin.value())

    def show_position(self, index: int) -> None:
        """Select a position (e.g. a token clicked elsewhere): drawn at once when decoded, else asked for."""
        self.position.setValue(int(index))

    def set_record(self, rec: LogitLensRecord) -> None:
        self.panel.set_record(rec)

    def _position_changed(self) -> None:
        rec = self.panel.record
        p = self.position.value()
        if rec is not None and rec.n_tokens == self.n_tokens and p in set(rec.lens.positions.tolist()):
            self.panel.select(p)
        else:
            self.request()

    def _clicked(self, pos: int) -> None:
        self.position.blockSignals(True)
        self.position.setValue(pos)
        self.position.blockSignals(False)
