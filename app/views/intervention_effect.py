"""What an Apply (or Clear) in the Experiments tab did to the chat: the measurement's progress with Stop, then the
next token after the chat before and after (its KLD, whether the top token changed, the top 5 of each with their
probabilities) and the KLD at every position of the chat as a curve. Draws InterventionRecords; the Patching view's
cell effect (app.views.patching_effect) is drawn by the same widget and words."""
from __future__ import annotations

import html

import numpy as np
import numpy.typing as npt
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QVBoxLayout, QWidget

from app.records.interventions import InterventionRecord
from app.views.common.tokens import token_label

SHOW_BUSY_MS = 400  # progress and Stop appear only when the measurement takes longer than this
NOTHING = "the file as it is"
STOP_TIP = "Stop measuring the effect (what was asked is set all the same)"
Top = tuple[tuple[str, float], ...]  # tokens and their probabilities, the most likely first


def quoted(text: str, limit: int = 24) -> str:
    """A token in quotes with its spaces as they are (newlines and tabs made visible), cut past `limit`."""
    shown = text.replace("\n", "⏎").replace("\t", "⇥")
    shown = shown if len(shown) <= limit else shown[: limit - 1] + "…"
    return f"'{shown}'"


def top_line(before: Top, after: Top) -> str:
    """"top token: ' Paris' -> ' London'", or "top token unchanged: ' Paris'"."""
    if before[0][0] != after[0][0]:
        return f"top token: {quoted(before[0][0])} -> {quoted(after[0][0])}"
    return f"top token unchanged: {quoted(after[0][0])}"


def next_token_html(kld: float, before: Top, after: Top) -> str:
    """The next token's KLD(before || after), whether its top token changed, and the top tokens before and after, as
    rich text lines."""
    pairs = lambda top: ", ".join(f"{html.escape(quoted(t, 14), quote=False)} {p:.3f}" for t, p in top)  # noqa: E731
    changed = "color:#b00020" if before[0][0] != after[0][0] else "color:#2e7d32"
    return (f"<b>KLD {kld:.5f}</b> · <b style='{changed}'>{html.escape(top_line(before, after), quote=False)}</b><br>"
            f"before: {pairs(before)}<br>after: {pairs(after)}")


def kld_line(kld: npt.NDArray[np.float64], texts: tuple[str, ...], over: str) -> str:
    """"KLD over the chat's 40 positions: mean 0.0123, most at “ the” (0.456)" (`over`: 'the chat')."""
    worst = int(np.argmax(kld))
    at = html.escape(token_label(texts[worst], 16))
    return f"KLD over {over}'s {len(texts)} positions: mean {kld.mean():.4f}, most at “{at}” ({kld[worst]:.3f})"


def effect_html(rec: InterventionRecord) -> str:
    """The record's effect as rich text (the record must be measured)."""
    return (f"Before ({html.escape(rec.before or NOTHING)}) → after ({html.escape(rec.description or NOTHING)}), "
            f"the next token after the chat:<br>{next_token_html(rec.next_kld, rec.top_before, rec.top_after)}<br>"
            f"{kld_line(rec.kld, rec.token_texts, 'the chat')} · {rec.elapsed_s:.1f} s")


class EffectView(QWidget):
    """Progress and Stop while the effect is measured; then the effect's text and its KLD curve."""

    stop_requested = Signal()

    def __init__(self, text: str, parent: QWidget | None = None, stop_tip: str = STOP_TIP,
                 positions: str | None = "chat position", refused: str = " Nothing was changed."):
        super().__init__(parent)
        self.curve_shown = positions is not None  # None: the text only (the KLD curve is not drawn)
        self.refused = refused  # said after a failure's message
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.stop = QPushButton("Stop")
        self.stop.setToolTip(stop_tip)
        self.stop.clicked.connect(self.stop_requested)
        self._busy_timer = QTimer(self, singleShot=True, interval=SHOW_BUSY_MS)
        self._busy_timer.timeout.connect(lambda: self._show_busy(True))
        self.text = QLabel(text)
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plot = pg.PlotWidget(background="w")
        self.plot.setLabel("left", "KLD")
        self.plot.setLabel("bottom", positions or "")
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
        self.show_effect(effect_html(rec), rec.kld)

    def show_effect(self, text: str, kld: npt.NDArray[np.float64]) -> None:
        """An effect's rich text and its KLD at every position (drawn where the view draws the curve)."""
        self._shown = text
        self.text.setText(text)
        self.curve.setData(np.arange(len(kld)), kld)
        self.plot.setVisible(self.curve_shown)

    def show_failure(self, message: str) -> None:
        """A refused Apply: the reason, then what was shown before (it still holds)."""
        self.busy(False)
        self.text.setText(f"<span style='color:#b00020'>{html.escape(message)}</span>{self.refused}"
                          + (f"<br>{self._shown}" if self._shown else ""))

    def _show_busy(self, on: bool) -> None:
        self.progress.setVisible(on)
        self.stop.setVisible(on)
