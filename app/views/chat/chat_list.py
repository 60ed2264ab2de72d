"""The list of chats: new, open, rename (double-click or F2), delete, export to Markdown or JSON."""
from __future__ import annotations

import html
import time

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QHBoxLayout, QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget,
)

from app.data.chats import Chat

ID_ROLE = Qt.ItemDataRole.UserRole


def when(ts: float) -> str:
    """'14:02' today, else '3 Mar'."""
    t = time.localtime(ts)
    return time.strftime("%H:%M", t) if time.strftime("%Y%m%d", t) == time.strftime("%Y%m%d") else time.strftime("%d %b", t)


class ChatList(QWidget):
    """Shows chats newest first; asks the owner to open, rename, delete or export one."""

    open_requested = Signal(str)
    new_requested = Signal()
    rename_requested = Signal(str, str)
    delete_requested = Signal(str)
    export_requested = Signal(str, str)  # (chat id, 'md' | 'json')

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        row = QHBoxLayout()
        new = QPushButton("New chat")
        new.setToolTip("Ctrl+N")
        new.clicked.connect(self.new_requested)
        row.addWidget(new)
        lay.addLayout(row)
        self.list = QListWidget()
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.list.setEditTriggers(QListWidget.EditTrigger.DoubleClicked | QListWidget.EditTrigger.EditKeyPressed)
        self.list.currentItemChanged.connect(self._current_changed)
        self.list.itemChanged.connect(self._edited)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        lay.addWidget(self.list, 1)
        self._filling = False

    def show_chats(self, chats: list[Chat], current: Chat | None) -> None:
        """Refill the list (titles are plain text)."""
        self._filling = True
        self.list.clear()
        for chat in sorted(chats, key=lambda c: c.updated, reverse=True):
            item = QListWidgetItem(chat.title)
            item.setData(ID_ROLE, chat.id)
            tip = f"{chat.title}\n{len(chat.messages)} messages · {when(chat.updated)}"
            item.setToolTip("<qt>" + html.escape(tip).replace("\n", "<br>") + "</qt>")  # escaped: never markup
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
            self.list.addItem(item)
            if chat is current:
                self.list.setCurrentItem(item)
        self._filling = False

    def current_id(self) -> str:
        item = self.list.currentItem()
        return item.data(ID_ROLE) if item else ""

    def _current_changed(self, item: QListWidgetItem | None, _old: object) -> None:
        if item is not None and not self._filling:
            self.open_requested.emit(item.data(ID_ROLE))

    def _edited(self, item: QListWidgetItem) -> None:
        if not self._filling:  # emitted later: the owner refills this list, which must not happen inside the edit
            cid, text = item.data(ID_ROLE), item.text()
            QTimer.singleShot(0, lambda: self.rename_requested.emit(cid, text))

    def _menu(self, pos: object) -> None:
        item = self.list.itemAt(pos)
        if item is None:
            return
        cid = item.data(ID_ROLE)
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.editItem(item))
        menu.addAction("Export as Markdown…", lambda: self.export_requested.emit(cid, "md"))
        menu.addAction("Export as JSON…", lambda: self.export_requested.emit(cid, "json"))
        menu.addSeparator()
        menu.addAction("Delete…", lambda: self.delete_requested.emit(cid))
        menu.exec(self.list.viewport().mapToGlobal(pos))
