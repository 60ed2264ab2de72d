"""The Quantization lens's Layers × tensors table: a column per tensor role, each as wide as the types in it need.

A role's name is written one word per line (`ffn_down_exps` as ffn / down / exps). When the names do not all fit
the pane (1280x800 beside the chat, a Mixture-of-Experts or hybrid file's 12-28 roles), each column still gets the
width of its types, the room left goes to the narrowest names first, and a name longer than its column is cut with
… line by line, whole in the header's tooltip. The table scrolls sideways only where the types alone are wider than
the pane.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem, QWidget

ROLE = Qt.ItemDataRole.UserRole  # a header item's whole role name (its text may be cut)
SMALLER_PT = 1.0  # the table's font is this much smaller than the app's: a 15-role table (Gemma 3) fits 1280x800


def fit_widths(cells: list[int], heads: list[int], room: int) -> list[int]:
    """Column widths for `room` pixels: every header whole where they all fit, else each column at least its cells'
    width and the room left shared so that the narrowest headers are whole first (water-filling up to one level)."""
    whole = [max(c, h) for c, h in zip(cells, heads)]
    if sum(whole) <= room:
        return whole
    if sum(cells) >= room:
        return list(cells)
    lo, hi = 0, max(whole)
    while lo < hi:  # the highest level that fits: every column min(whole, max(cells, level)) wide
        mid = (lo + hi + 1) // 2
        if sum(min(w, max(c, mid)) for c, w in zip(cells, whole)) <= room:
            lo = mid
        else:
            hi = mid - 1
    return [min(w, max(c, lo)) for c, w in zip(cells, whole)]


class TypeGrid(QTableWidget):
    """Rows: the model-wide tensors, then blk.0..; a column per role (see the module docstring)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        self.verticalHeader().setDefaultSectionSize(20)
        font = self.font()
        if font.pointSizeF() > SMALLER_PT + 5:  # a font set in pixels (pointSizeF -1) stays as it is
            font.setPointSizeF(font.pointSizeF() - SMALLER_PT)
            self.setFont(font)
        self.heads: list[int] = []  # the width each role's name needs, whole

    def set_roles(self, roles: list[str]) -> None:
        """One column per role, its name a word per line, the whole name in its tooltip."""
        self.setColumnCount(len(roles))
        for j, role in enumerate(roles):
            item = QTableWidgetItem(role.replace("_", "\n"))
            item.setData(ROLE, role)
            item.setToolTip(role)
            self.setHorizontalHeaderItem(j, item)
        header = self.horizontalHeader()
        self.heads = [header.sectionSizeFromContents(j).width() for j in range(len(roles))]

    def role(self, column: int) -> str:
        """The whole role name of `column` (its header may show it cut)."""
        item = self.horizontalHeaderItem(column)
        return str(item.data(ROLE) or "") if item is not None else ""

    def natural_width(self) -> int:
        """The width every column needs with its header whole."""
        return sum(max(self.sizeHintForColumn(j), h) for j, h in enumerate(self.heads))

    def fit_columns(self) -> None:
        """Widths for the room there is (fit_widths), and each header's name cut to its column."""
        n = min(self.columnCount(), len(self.heads))
        if n == 0:
            return
        cells = [self.sizeHintForColumn(j) for j in range(n)]
        widths = fit_widths(cells, self.heads[:n], self.viewport().width())
        metrics = self.horizontalHeader().fontMetrics()
        for j, width in enumerate(widths):
            if self.columnWidth(j) != width:
                self.setColumnWidth(j, width)
            item = self.horizontalHeaderItem(j)
            lines = self.role(j).split("_")
            room = max(1, width - (self.heads[j] - max(metrics.horizontalAdvance(line) for line in lines)))
            text = "\n".join(lines if width >= self.heads[j] else
                              (metrics.elidedText(line, Qt.TextElideMode.ElideRight, room) for line in lines))
            if item is not None and item.text() != text:
                item.setText(text)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self.fit_columns()
