"""A popup listing the ten most likely tokens at one position of a reply, with their probabilities."""
from __future__ import annotations

import math

from PySide6.QtCore import QPoint, QRect, Qt, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QFrame, QGridLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from app.records.model_info import escape_text
from app.records.reply import TokenRecord


def show_token(text: str) -> str:
    """A token's text made visible: quotes around it, spaces as '·', control characters escaped."""
    return "'" + escape_text(text, 60).replace(" ", "·") + "'"


DISTRIBUTION_NOTE = ("model p: the model's own distribution, softmax of its logits at temperature 1, before the "
                     "repeat penalty, top-k, top-p and min-p; the token was drawn from that distribution after "
                     "the sampling settings reshaped it.")


class ProbBar(QWidget):
    """A horizontal bar for one probability."""

    def __init__(self, p: float, chosen: bool, parent: QWidget | None = None):
        super().__init__(parent)
        self.p = max(0.0, min(1.0, p))
        self.chosen = chosen
        self.setFixedSize(120, 12)

    def paintEvent(self, event: object) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        painter.fillRect(self.rect(), QColor("#eeeeee"))
        color = QColor("#e8822a") if self.chosen else QColor("#5b8fd6")
        painter.fillRect(QRect(0, 0, int(self.width() * self.p), self.height()), color)
        painter.end()


class TokenPopup(QFrame):
    """The alternatives at one position: rank, token, probability; the sampled token is highlighted. "Why this
    token?" asks the Why lens to explain it (why_requested with the token's position in its reply)."""

    why_requested = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, Qt.WindowType.Popup)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setObjectName("tokenPopup")
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(10, 8, 10, 8)
        self._title = _label("", bold=True)
        self._layout.addWidget(self._title)
        self.note = _label(DISTRIBUTION_NOTE)
        self.note.setStyleSheet("color: #666;")
        self.note.setWordWrap(True)
        self.note.setMaximumWidth(420)
        self._layout.addWidget(self.note)
        self._grid_host = QWidget()
        self._layout.addWidget(self._grid_host)
        self.rows: list[tuple[str, str]] = []  # (token shown, probability shown), for tests
        self.position = 0
        self.why_button = QPushButton("Why this token?")
        self.why_button.setToolTip("Split its logit into the embedding, every head, FFN and expert (the Why lens)")
        self.why_button.clicked.connect(self._why)
        self._layout.addWidget(self.why_button)

    def _why(self) -> None:
        self.hide()
        self.why_requested.emit(self.position)

    def set_token(self, position: int, token: TokenRecord) -> None:
        self.position = position
        tid, text, logprob, alts = token
        self._title.setText(f"Token {position + 1}: {show_token(text)}  (id {tid}, model p = {_pct(logprob)})")
        old = self._grid_host
        self._grid_host = QWidget()
        self._layout.replaceWidget(old, self._grid_host)
        old.deleteLater()
        grid = QGridLayout(self._grid_host)
        grid.setContentsMargins(0, 4, 0, 0)
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(2)
        for col, head in enumerate(("#", "token", "id", "model p", "")):
            grid.addWidget(_label(head, bold=True), 0, col)
        self.rows = []
        listed = {a[0] for a in alts}
        shown = list(alts)
        if tid not in listed:  # sampled outside the top ten: show it last
            shown.append((tid, text, logprob))
        for r, (aid, atext, alp) in enumerate(shown, start=1):
            chosen = aid == tid
            cells = (str(r) if aid in listed else "–", show_token(atext), str(aid), _pct(alp))
            for col, cell in enumerate(cells):
                grid.addWidget(_label(cell, bold=chosen, mono=col == 1), r, col)
            grid.addWidget(ProbBar(math.exp(min(0.0, alp)), chosen), r, 4)
            self.rows.append((cells[1], cells[3]))
        if not alts:
            grid.addWidget(_label("no alternatives were recorded for this token"), 1, 0, 1, 5)
        self.adjustSize()

    def popup_at(self, global_pos: QPoint) -> None:
        """Show near global_pos, kept on screen."""
        self.adjustSize()
        screen = self.screen().availableGeometry() if self.screen() else QRect(0, 0, 1600, 1000)
        x = min(global_pos.x(), screen.right() - self.width())
        y = global_pos.y() + 16
        if y + self.height() > screen.bottom():
            y = global_pos.y() - self.height() - 8
        self.move(max(screen.left(), x), max(screen.top(), y))
        self.show()


def _pct(logprob: float) -> str:
    p = math.exp(min(0.0, logprob)) * 100
    return f"{p:.2f} %" if p >= 0.01 else f"{p:.1e} %"


def _label(text: str, bold: bool = False, mono: bool = False) -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    style = []
    if bold:
        style.append("font-weight: bold;")
    if mono:
        style.append("font-family: monospace;")
    if style:
        label.setStyleSheet(" ".join(style))
    return label
