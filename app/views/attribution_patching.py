"""The Why lens's "Patching" tab: attribution patching of the token the lens explains, checked against real patching.

The clean prompt is the conversation's tokens before that token, as the lens reads it; the user gives a corrupted prompt
of as many tokens (the clean one with a word changed: "Use the clean prompt" puts it in the field to edit). The engine
estimates, from one gradient, how much of the logit difference (the token minus the contrast, else minus the corrupted
run's top token) patching each head from the clean run into the corrupted one would restore, then patches every head
for real: the two layers x heads maps side by side (the head map's style: blue restores, red pushes the other way),
their Spearman rank correlation and top-10 overlap, and the logit difference on both prompts.

It asks through `patching_requested((token index, contrast, corrupted text))` and `stop_requested()`, and draws what it
is given: `set_record` (the AttributionRecord the lens shows: the token), `set_patching` (PatchingRecord),
`progress(text, fraction)`, `failed(message)` (what was shown stays), `stopped()`, `clear()`.
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QPlainTextEdit, QProgressBar, QPushButton, QSizePolicy,
                               QVBoxLayout, QWidget)

from app.records.attribution import AttributionRecord, PatchingRecord
from app.views.attribution_plots import draw_head_grid, head_grid
from app.views.common.tokens import token_label

INTRO_TEXT = ("Attribution patching: give the prompt with a word or two changed (as many tokens as the clean one). "
              "One gradient estimates how much of the logit difference patching each head back from the clean run "
              "restores; every head is then patched for real to check the estimate.")
NO_RECORD_TEXT = "Explain a token first (the Run above): its conversation up to it is the clean prompt."
EMPTY_TEXT = "The corrupted prompt is empty: give the clean prompt with a word or two changed."
FAILED_STYLE = "color:#b03020"


class PatchingPanel(QWidget):
    """Attribution patching of the lens's token (see the module docstring)."""

    patching_requested = Signal(object)  # (token index, contrast '' or '#id', corrupted text)
    stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.record: AttributionRecord | None = None  # the token explained
        self.result: PatchingRecord | None = None
        self.busy = False
        self._build()

    def _build(self) -> None:
        intro = QLabel(INTRO_TEXT)
        intro.setWordWrap(True)
        intro.setStyleSheet("color:#666")
        self.clean_label = QLabel(NO_RECORD_TEXT)
        self.clean_label.setWordWrap(True)
        self.corrupt_edit = QPlainTextEdit()
        self.corrupt_edit.setPlaceholderText("Corrupted prompt: the clean prompt with a word or two changed")
        self.corrupt_edit.setToolTip("The corrupted prompt, read as the clean one is written (a chat template's "
                                     "special tokens as text): as many tokens as the clean prompt")
        self.corrupt_edit.setFixedHeight(64)
        self.fill_button = QPushButton("Use the clean prompt")
        self.fill_button.setToolTip("Put the clean prompt in the field, to change a word of it")
        self.run_button = QPushButton("Estimate patching")
        self.run_button.setToolTip("Attribution patching of the token for these two prompts, checked by patching "
                                   "every head for real (one run per head)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        buttons = QVBoxLayout()
        for b in (self.fill_button, self.run_button, self.stop_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        field = QHBoxLayout()
        field.addWidget(self.corrupt_edit, 1)
        field.addLayout(buttons)
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.bar.setTextVisible(False)
        self.bar.setMaximumHeight(8)
        self.bar.setVisible(False)
        self.status = QLabel("")
        self.status.setTextFormat(Qt.TextFormat.PlainText)
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.agreement = QLabel("")
        self.agreement.setWordWrap(True)
        self.agreement.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setBackground("w")
        # its size hint ignored: with the wrapped labels above it would make the tab taller than the lens's room
        self.plots.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.plots.setMinimumHeight(160)
        grid = self.plots.ci
        self.est_map, self.est_image, self.est_bar = head_grid(grid, 0, 0, "")  # one scale for both: the real's bar
        self.real_map, self.real_image, self.real_bar = head_grid(grid, 0, 1, "share of the difference restored")
        self.est_map.setTitle("attribution patching (estimate)", size="9pt")
        self.real_map.setTitle("activation patching (real)", size="9pt")
        for image in (self.est_image, self.real_image):
            image.hoverEvent = self._hover
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 4, 0, 0)
        lay.addWidget(intro)
        lay.addWidget(self.clean_label)
        lay.addLayout(field)
        lay.addWidget(self.bar)
        lay.addWidget(self.status)
        lay.addWidget(self.agreement)
        lay.addWidget(self.plots, 1)
        self.fill_button.clicked.connect(self.fill_clean)
        self.run_button.clicked.connect(self.run)
        self.stop_button.clicked.connect(self.stop_requested)
        self._set_busy(False)

    # ---- what the lens tells it

    def set_record(self, rec: AttributionRecord | None) -> None:
        """The token the lens explains now (None: none): its clean prompt is the conversation before it."""
        self.record = rec
        if rec is None:
            self.clean_label.setText(NO_RECORD_TEXT)
        else:
            target = html.escape(token_label(rec.target_text, 24))
            self.clean_label.setText(f"Token {rec.token_index} <b>{target}</b>: the clean prompt is the "
                                     f"{rec.token_index} tokens before it.")
        self._set_busy(self.busy)

    def clear(self) -> None:
        """Another chat or model: the result and the token go (the text typed stays)."""
        self.result = None
        self.set_record(None)
        self._set_busy(False)
        self.status.setText("")
        self.agreement.setText("")
        for image in (self.est_image, self.real_image):
            image.clear()

    def fill_clean(self) -> None:
        """Put the clean prompt in the field, to edit."""
        rec = self.record
        if rec is not None:
            self.corrupt_edit.setPlainText("".join(rec.token_texts[: rec.token_index]))

    def run(self) -> None:
        """Ask for attribution patching of the lens's token with the corrupted prompt typed."""
        rec, text = self.record, self.corrupt_edit.toPlainText()
        if rec is None:
            self.failed(NO_RECORD_TEXT)
            return
        if not text.strip():
            self.failed(EMPTY_TEXT)
            return
        self._set_busy(True)
        self.status.setStyleSheet("")
        self.status.setText("Estimating, then patching each head for real…")
        contrast = f"#{rec.contrast_id}" if rec.contrast_id is not None else ""
        self.patching_requested.emit((rec.token_index, contrast, text))

    def progress(self, text: str, fraction: float) -> None:
        """How far the running job is."""
        if self.busy:
            self.status.setText(text)
            self.bar.setValue(int(max(0.0, min(1.0, fraction)) * 1000))

    def failed(self, message: str) -> None:
        """The engine (or the panel) refused: say why; what was shown stays."""
        self._set_busy(False)
        self.status.setText(message)
        self.status.setStyleSheet(FAILED_STYLE)

    def stopped(self) -> None:
        if self.busy:
            self._set_busy(False)
            self.status.setStyleSheet("")
            self.status.setText("Stopped.")

    def set_patching(self, rec: PatchingRecord) -> None:
        """Draw a result: the two maps on one colour scale, the agreement and the logit differences."""
        self._set_busy(False)
        self.result = rec
        self.status.setStyleSheet("")
        self.status.setText(f"{rec.diff_text()} ({rec.elapsed_s:.1f} s)")
        self.agreement.setText(f"<b>{html.escape(rec.agreement_text())}</b>")
        both = np.concatenate([rec.estimate.ravel(), rec.real.ravel()])
        finite = both[np.isfinite(both)]
        lim = float(np.max(np.abs(finite))) if finite.size else 1.0
        draw_head_grid(self.est_map, self.est_image, self.est_bar, rec.estimate, lim)
        draw_head_grid(self.real_map, self.real_image, self.real_bar, rec.real, lim)

    # ---- text (also what the tests read)

    def agreement_text(self) -> str:
        return self.result.agreement_text() if self.result is not None else ""

    def describe_head(self, layer: int, head: int) -> str:
        """The hover text of a cell of either map."""
        rec = self.result
        if rec is None or not (0 <= layer < rec.real.shape[0] and 0 <= head < rec.real.shape[1]):
            return ""
        est, real = rec.estimate[layer, head], rec.real[layer, head]
        if not np.isfinite(real):
            return f"layer {layer} has no head {head}"
        return f"head L{layer}.{head}: estimate {est:+.3f}, real patching {real:+.3f} of the difference restored"

    def _hover(self, ev) -> None:  # noqa: ANN001 - pyqtgraph event
        if ev.isExit():
            self.plots.setToolTip("")
            return
        self.plots.setToolTip(self.describe_head(int(np.floor(ev.pos().y())), int(np.floor(ev.pos().x()))))

    def _set_busy(self, on: bool) -> None:
        self.busy = on
        self.stop_button.setEnabled(on)
        self.run_button.setEnabled(not on and self.record is not None)
        self.fill_button.setEnabled(self.record is not None)
        self.bar.setVisible(on)
        if on:
            self.bar.setValue(0)
