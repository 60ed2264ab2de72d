"""The Experiments tab: interventions on the chat's model above, activation patching below (a splitter between)."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QSplitter, QVBoxLayout, QWidget

from app.views.interventions import InterventionsPanel
from app.views.patching import PatchingView


class ExperimentsView(QWidget):
    """Holds the two panels; each asks through its own signals (app.controllers.experiments answers)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.interventions = InterventionsPanel()
        self.patching = PatchingView()
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.interventions)
        split.addWidget(self.patching)
        split.setStretchFactor(0, 2)
        split.setStretchFactor(1, 3)
        split.setChildrenCollapsible(False)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(split)

    def set_model(self, loaded: bool) -> None:
        self.interventions.set_model(loaded)
        self.patching.set_model(loaded)
