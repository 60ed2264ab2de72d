"""FlowBox: widgets side by side when there is room, one above the other when the pane is narrow; FillLayout."""
from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QBoxLayout, QVBoxLayout, QWidget


class FlowBox(QWidget):
    """Lays its widgets out left to right while it is at least `min_width` wide per widget, else top to bottom."""

    def __init__(self, widgets: list[QWidget], min_width: int = 420, stretches: list[int] | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.min_width = min_width
        self.box = QBoxLayout(QBoxLayout.Direction.LeftToRight, self)
        self.box.setContentsMargins(0, 0, 0, 0)
        for w, s in zip(widgets, stretches or [1] * len(widgets)):
            self.box.addWidget(w, s)
        self.n = len(widgets)

    @property
    def stacked(self) -> bool:
        return self.box.direction() == QBoxLayout.Direction.TopToBottom

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        """As narrow as the widest child alone (narrower panes stack the children), as tall as the layout needs."""
        widgets = [self.box.itemAt(i).widget() for i in range(self.box.count())]
        mins = [w.minimumSize().expandedTo(w.minimumSizeHint()) for w in widgets if w is not None]
        if not mins:
            return super().minimumSizeHint()
        width = max(m.width() for m in mins)
        height = sum(m.height() for m in mins) + self.box.spacing() * (len(mins) - 1) if self.stacked else max(
            m.height() for m in mins)
        return QSize(width, height)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt override
        want = (QBoxLayout.Direction.TopToBottom if event.size().width() < self.min_width * self.n
                else QBoxLayout.Direction.LeftToRight)
        if want != self.box.direction():
            self.box.setDirection(want)
            self.updateGeometry()  # the minimum height changes with the direction
        super().resizeEvent(event)


class FillLayout(QVBoxLayout):
    """A vertical layout that tells a QScrollArea it has no height-for-width: the scroll area then gives the
    widget the viewport's height (down to the minimum) instead of the sum of its children's preferred heights,
    which a word-wrapped label anywhere inside would otherwise ask for. The children are still laid out with
    their heights for the width."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return False
