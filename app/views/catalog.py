"""The model catalog dialog: known models, whether each is installed, and Load (downloading first if needed)."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog, QDialogButtonBox, QHBoxLayout, QLabel, QListWidget, QListWidgetItem, QVBoxLayout, QWidget,
)

from app.views.common.formatting import human_bytes


class CatalogDialog(QDialog):
    """Pick a catalog model; the main window fetches it (with progress and Cancel in the status bar) and loads it."""

    chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        from engine import catalog  # noqa: PLC0415

        self.setWindowTitle("GGUF Lens: model catalog")
        self.resize(560, 300)
        lay = QVBoxLayout(self)
        note = QLabel(f"Models are kept in {catalog.models_dir()}. A model not yet there is downloaded "
                      "(checked by sha256) before it loads; the download can be cancelled from the status bar.")
        note.setTextFormat(Qt.TextFormat.PlainText)
        note.setWordWrap(True)
        lay.addWidget(note)
        self.list = QListWidget()
        for name, e in catalog.CATALOG.items():
            installed = catalog.is_installed(e) is not None
            state = "installed" if installed else f"download {human_bytes(e.size)}"
            kind = "instruct model: follows instructions in a chat" if e.instruct else (
                "base model: continues text, does not follow instructions")
            item = QListWidgetItem(f"{e.title}\n    {name} · {state}\n    {kind}")
            item.setToolTip(kind)
            item.setData(Qt.ItemDataRole.UserRole, name)
            self.list.addItem(item)
            if name == catalog.DEFAULT_MODEL:
                self.list.setCurrentItem(item)
        self.list.itemDoubleClicked.connect(lambda _i: self._accept())
        lay.addWidget(self.list, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        load = buttons.addButton("Load", QDialogButtonBox.ButtonRole.AcceptRole)
        load.setDefault(True)
        buttons.accepted.connect(self._accept)
        buttons.rejected.connect(self.reject)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(buttons)
        lay.addLayout(row)

    def _accept(self) -> None:
        item = self.list.currentItem()
        if item is not None:
            self.chosen.emit(item.data(Qt.ItemDataRole.UserRole))
            self.accept()
