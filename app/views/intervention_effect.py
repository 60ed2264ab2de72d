"""What an Apply (or Clear) in the Experiments tab did to the chat: the measurement's progress with Stop, then the
next token after the chat before and after (its KLD, whether the top token changed, the top 5 of each with their
probabilities) and the KLD at every position of the chat as a curve. Draws InterventionRecords only."""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.records.interventions import InterventionRecord
from app.views.common.tokens import token_label

SHOW_BUSY_MS = 400  # progress and Stop appear only when the measurement takes longer than this
NOTHING = "the file as it is"


def quoted(text: str, limit: int = 24) -> str:
    """A token in quotes with its spaces as they are (newlines and tabs made visible), cut past `limit`."""
    shown = text.replace("\n", "⏎").replace("\t", "⇥")
    shown = shown if len(shown) <= limit else shown[: limit - 1] + "…"
    return f"'{shown}'"


def top_line(rec: InterventionRecord) -> str:
    """"top token: ' Paris' -> ' London'", or "top token unchanged: ' Paris'"."""
    if rec.top_changed:
        return f"top token: {quoted(rec.top_before[0][0])} -> {quoted(rec.top_after[0][0])}"
    return f"top token unchanged: {quoted(rec.top_after[0][0])}"


def effect_html(rec: InterventionRecord) -> str:
    """The record's effect as rich text (the record must be measured)."""
    pairs = lambda top: ", ".join(f"{html.escape(quoted(t, 14), quote=False)} {p:.3f}" for t, p in top)  # noqa: E731
    worst = int(np.argmax(rec.kld))
    at = html.escape(token_label(rec.token_texts[worst], 16))
    changed = "color:#b00020" if rec.top_changed else "color:#2e7d32"
    return (f"Before ({html.escape(rec.before or NOTHING)}) → after ({html.escape(rec.description or NOTHING)}), "
            f"the next token after the chat:<br>"
            f"<b>KLD {rec.next_kld:.5f}</b> · <b style='{changed}'>{html.escape(top_line(rec), quote=False)}</b><br>"
            f"before: {pairs(rec.top_before)}<br>after: {pairs(rec.top_after)}<br>"
            f"KLD over the chat's {len(rec.token_texts)} positions: mean {rec.mean_kld:.4f}, most at "
            f"“{at}” ({rec.kld[worst]:.3f}) · {rec.elapsed_s:.1f} s")


class EffectView(QWidget):
    """Progress and Stop while the effect is measured; then the effect's text and its KLD curve."""

    stop_requested = Signal()

    def __init__(self, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.stop = QPushButton("Stop")
        self.stop.setToolTip("Stop measuring the effect (what was asked is set all the same)")
        self.stop.clicked.connect(self.stop_requested)
        self._busy_timer = QTimer(self, singleShot=True, interval=SHOW_BUSY_MS)
        self._busy_timer.timeout.connect(lambda: self._show_busy(True))
        self.text = QLabel(text)
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plot = pg.PlotWidget(background="w")
        self.plot.setLabel("left", "KLD")
        self.plot.setLabel("bottom", "chat position")
        self.plot.setMaximumHeight(120)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.curve = self.plot.plot(pen=pg.mkPen((40, 80, 200), width=1.5))
        self.plot.setVisible(False)  # shown with a measured effect
        busy = QHBoxLayout()
        busy.setContentsMargins(0, 0, 0, 0)
        busy.addWidget(self.progress, 1)
        busy.addWidget(self.stop)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(busy)
        lay.addWidget(self.text)
        lay.addWidget(self.plot)
        self._shown = text  # the effect (or help) on screen, kept under a failure's message
        self._show_busy(False)

    def busy(self, on: bool) -> None:
        """A measurement runs (progress and Stop once it takes a while) or none does."""
        if on:
            self.progress.setValue(0)
            self.progress.setFormat("%p%")
            self._busy_timer.start()
        else:
            self._busy_timer.stop()
            self._show_busy(False)

    def set_progress(self, what: str, fraction: float) -> None:
        self.progress.setValue(int(1000 * max(0.0, min(1.0, fraction))))
        self.progress.setFormat(f"{what} %p%")

    def show_text(self, text: str) -> None:
        """Plain words instead of an effect (help, 'set', a note); the curve goes."""
        self._shown = text
        self.text.setText(text)
        self.curve.setData([], [])
        self.plot.setVisible(False)

    def show_record(self, rec: InterventionRecord) -> None:
        """The measured effect: its text and the KLD at every chat position."""
        self._shown = effect_html(rec)
        self.text.setText(self._shown)
        self.curve.setData(np.arange(len(rec.kld)), rec.kld)
        self.plot.setVisible(True)

    def show_failure(self, message: str) -> None:
        """A refused Apply: the reason, then what was shown before (it still holds)."""
        self.busy(False)
        self.text.setText(f"<span style='color:#b00020'>{html.escape(message)}</span> Nothing was changed."
                          + (f"<br>{self._shown}" if self._shown else ""))

    def _show_busy(self, on: bool) -> None:
        self.progress.setVisible(on)
        self.stop.setVisible(on)
