"""The logit lens of A and B side by side (the Compare tab): where quantization changes the decision.

Self-contained: Compare hosts it, hands it the selected token (`show_position`) and a LogitLensPair when it
arrives; it asks with `logit_requested(position, width)` and the bridge runs both models of the last comparison.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.records.logit_lens import LogitLensPair, on_top_text
from app.views.attention.controls import FlowLayout
from app.views.attention.logit_view import METRICS, LogitLensPanel
from app.views.attention.scaling import FitLabel
from app.views.common.tokens import token_label

PAIR_WIDTH = 24  # positions per side: two models, so half the single lens's width
WIDE_SIDE = 460  # px: a side at least this wide shows all five top tokens per layer, a narrower one the first three


class LogitPairView(QWidget):
    """Two LogitLensPanels (A left, B right) on the same positions, and a line on where their decisions part."""

    logit_requested = Signal(int, int)  # position in the comparison's tokens, positions per side
    hovered = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.pair: LogitLensPair | None = None
        self.position = 0
        self.n_tokens = 0
        self.run = QPushButton("Logit lens of A and B")
        self.run.setToolTip("Decode every layer's residual stream of A and of B at the selected token "
                            "(each model re-runs the comparison text once)")
        self.width_spin = QSpinBox()
        self.width_spin.setRange(4, 128)
        self.width_spin.setValue(PAIR_WIDTH)
        self.width_spin.setSuffix(" positions")
        self.metric_box = QComboBox()  # not `metric`: QWidget.metric() is a virtual Qt calls
        for text, key in METRICS:
            self.metric_box.addItem(text, key)
        self.summary = FitLabel()  # plain text as tall as its lines: no gap above the heatmaps, nothing cut
        self.summary.setText("Run a comparison, pick a token, then ask for the logit lens of A and B.")
        bar = QWidget()
        flow = FlowLayout(bar)
        for w in (self.run, self.width_spin, self.metric_box):
            flow.addWidget(w)
        # Compare gives this view a page of its own: each side has its heatmap over its table
        self.a, self.b = LogitLensPanel(vertical=True), LogitLensPanel(vertical=True)
        for panel in (self.a, self.b):  # the summary line says it for both: the heatmaps get the height
            panel.title.setVisible(False)
            panel.split.setSizes([520, 380])
            panel.fit_width()
        sides = QHBoxLayout()
        sides.addWidget(self.a, 1)  # A and B get the same width whatever their tables hold
        sides.addWidget(self.b, 1)
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addWidget(bar)
        root.addWidget(self.summary)
        root.addLayout(sides, 1)
        self.run.clicked.connect(self.request)
        self.metric_box.currentIndexChanged.connect(lambda _i: self._metric())
        for panel in (self.a, self.b):
            panel.position_clicked.connect(self.show_position)
            panel.hovered.connect(self.hovered)
        self.clear()

    def clear(self, message: str = "Run a comparison, then ask for the logit lens of A and B.") -> None:
        """Forget both sides (a new model or a new comparison)."""
        self.pair = None
        self.n_tokens = 0
        self.a.clear("")
        self.b.clear("")
        self.summary.setText(message)  # a side is narrow: the message goes on the line above both
        self.run.setEnabled(False)

    def set_tokens(self, n: int) -> None:
        """A comparison of n tokens finished: the lens can be asked for."""
        self.clear("Pick a token and press “Logit lens of A and B”.")
        self.n_tokens = n
        self.run.setEnabled(n > 0)

    def request(self) -> None:
        if self.n_tokens:
            self.summary.setText("Decoding every layer of A and B…")
            self.logit_requested.emit(int(self.position), self.width_spin.value())

    def show_position(self, index: int) -> None:
        """Select a token: both tables follow when it was decoded."""
        self.position = int(index)
        if self.pair is not None and index in set(self.pair.a.lens.positions.tolist()):
            self.a.select(index)
            self.b.select(index)
            self._summarise()

    def set_pair(self, pair: LogitLensPair) -> None:
        self.pair = pair
        self.position = pair.a.selected
        self.a.set_record(pair.a)
        self.b.set_record(pair.b)
        self._summarise()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt override
        n_top = 5 if event.size().width() >= 2 * WIDE_SIDE else 3
        for panel in (self.a, self.b):
            panel.fit_width(n_top)
        super().resizeEvent(event)

    def _metric(self) -> None:
        key = str(self.metric_box.currentData())
        self.a.set_metric(key)
        self.b.set_metric(key)

    def _summarise(self) -> None:
        pair = self.pair
        if pair is None:
            return
        la, lb = pair.a.lens, pair.b.lens
        c = pair.a.column(self.position)
        ta, tb = int(la.top_ids[-1, c, 0]), int(lb.top_ids[-1, c, 0])
        differ = np.flatnonzero(la.top_ids[:, c, 0] != lb.top_ids[:, c, 0])
        first = f"top tokens first differ after layer {la.layers[int(differ[0])]}" if differ.size else \
            "the same top token at every layer"
        final = (f"both end on “{token_label(pair.a.text(ta), 14)}”" if ta == tb else
                 f"A ends on “{token_label(pair.a.text(ta), 14)}”, B on “{token_label(pair.b.text(tb), 14)}”")
        target = pair.a.text(int(la.targets[c]))
        # the same words as the single lens's header, from the ranks the tables show
        self.summary.setText(f"Position {int(la.positions[c])} → “{token_label(target, 14)}”: {final}; {first}. "
                             f"The produced token is {on_top_text(la, c)} in A; {on_top_text(lb, c)} in B.")
        self.a.setToolTip(self.a.title.text())
        self.b.setToolTip(self.b.title.text())
