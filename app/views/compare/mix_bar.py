"""The sweep chart's mix controls: a size slider, 'Find the best mix', and what to do with a clicked point."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSlider, QWidget

from app.records.compare import SweepPoint

STEP = 0.05  # bits per weight per slider step
LOW, HIGH = 2.5, 8.5  # the slider's range in bits per weight


class MixBar(QWidget):
    """Choose a size, ask for the best mix there; compare or apply the point last clicked."""

    find_requested = Signal(float)  # budget in bits per weight
    compare_requested = Signal(object)  # SweepPoint
    apply_requested = Signal(object)  # SweepPoint

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.n_weights = 0
        self.chosen: SweepPoint | None = None
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(0, round((HIGH - LOW) / STEP))
        self.slider.setValue(round((4.5 - LOW) / STEP))
        self.slider.setToolTip("The size budget of the searched mix: average bits per weight of the whole file")
        self.size = QLabel()
        self.size.setMinimumWidth(110)
        self.slider.setMinimumWidth(60)
        self.find = QPushButton("Find the best mix")
        self.find.setToolTip("Measure each tensor's sensitivity on the calibration text (cached per model, resumable), "
                             "choose the types with the least KLD under this size, and measure that mix like a preset")
        self.compare = QPushButton("Compare")
        self.compare.setToolTip("Compare the clicked point in full (B = that preset or mix)")
        self.apply = QPushButton("Apply")
        self.apply.setToolTip("Put the clicked point's preset or rules into the Quantization lens's overrides")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(QLabel("size ≤"))
        row.addWidget(self.slider, 1)
        row.addWidget(self.size)
        row.addWidget(self.find)  # compare and apply sit in the sweep's button row (SweepChart)
        self.slider.valueChanged.connect(lambda _v: self._show_size())
        self.find.clicked.connect(lambda: self.find_requested.emit(self.budget()))
        self.compare.clicked.connect(lambda: self.chosen is not None and self.compare_requested.emit(self.chosen))
        self.apply.clicked.connect(lambda: self.chosen is not None and self.apply_requested.emit(self.chosen))
        self.choose(None)
        self._show_size()

    def budget(self) -> float:
        """The chosen budget in bits per weight."""
        return round(LOW + STEP * self.slider.value(), 4)

    def set_budget(self, bpw: float) -> None:
        self.slider.setValue(round((min(HIGH, max(LOW, bpw)) - LOW) / STEP))

    def set_weights(self, n_weights: int) -> None:
        """The model's weight count (to show the budget in MiB)."""
        self.n_weights = n_weights
        self._show_size()

    def choose(self, point: SweepPoint | None) -> None:
        """A point was clicked: it can be compared in full or applied."""
        self.chosen = point
        self.compare.setEnabled(point is not None)
        self.apply.setEnabled(point is not None and point.kind in ("preset", "mix"))

    def set_running(self, running: bool) -> None:
        self.find.setEnabled(not running)

    def _show_size(self) -> None:
        b = self.budget()
        mib = f" · {b * self.n_weights / 8 / 2**20:,.1f} MiB" if self.n_weights else ""
        self.size.setText(f"{b:.2f} bpw{mib}")
