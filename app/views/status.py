"""The status bar: model, backend, tokens/s, context used, KV-cache type and bytes (now and at the full context),
the last prefill's attention path, process memory, load progress."""
from __future__ import annotations

import os
import resource
import sys

from PySide6.QtCore import QSize, Qt, QTimer, Signal
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel, QProgressBar, QSizePolicy, QStatusBar, QToolButton, QWidget

from app.state import AppState
from app.views.common.formatting import human_bytes


def process_memory() -> int:
    """Resident memory of this process in bytes (peak RSS where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class ElidedLabel(QLabel):
    """A one-line plain-text label that, short of room, shows its text cut with '…' (the whole text stays in
    text()): its minimum width is a few characters, so a long model or file name never widens the window."""

    MIN_CHARS = 6

    def __init__(self, text: str = "", parent: QWidget | None = None,
                 elide: Qt.TextElideMode = Qt.TextElideMode.ElideMiddle):
        self.about = ""  # what the segment is: its tooltip, with the whole text above it while the text is cut
        self.elide = elide  # where the … goes (a hover readout reads best cut at its end)
        super().__init__(text, parent)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)

    def elided(self) -> bool:
        return self.fontMetrics().horizontalAdvance(self.text()) > self.contentsRect().width()

    def setText(self, text: str) -> None:  # noqa: N802 - Qt override
        super().setText(text)
        self._tip()

    def setToolTip(self, tip: str) -> None:  # noqa: N802 - Qt override
        self.about = tip
        self._tip()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._tip()

    def _tip(self) -> None:
        whole = self.text() if self.text() and self.elided() and self.text() != self.about else ""
        super().setToolTip("\n".join(t for t in (whole, self.about) if t))

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        hint = super().minimumSizeHint()
        m = self.contentsMargins()
        width = self.fontMetrics().horizontalAdvance("x" * self.MIN_CHARS + "…") + m.left() + m.right()
        return QSize(min(hint.width(), width), hint.height())

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt override
        rect = self.contentsRect()
        text = self.fontMetrics().elidedText(self.text(), self.elide, rect.width())
        if text == self.text():
            super().paintEvent(event)
            return
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        painter.drawText(rect, int(self.alignment()) | int(Qt.AlignmentFlag.AlignVCenter), text)


LENS_SHOW_MS = 1000  # a lens job's progress shows once it has run this long


def _segment(tip: str) -> ElidedLabel:
    label = ElidedLabel("")
    label.setToolTip(tip)
    label.setContentsMargins(6, 0, 6, 0)
    return label


class StatusPanel(QStatusBar):
    """Mirrors AppState into status-bar segments; shows a progress bar with Cancel while a model loads."""

    cancel_load = Signal()
    stop_lens = Signal()  # the lens job that reads a long chat: stop it

    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.model = _segment("the loaded model")
        self.backend = _segment("the compute backend")
        self.speed = _segment("generation speed of the last reply")
        self.ctx = _segment("tokens in the KV cache / its context length")
        self.kv = _segment("memory the KV cache holds now")
        self.kv_cost = _segment("the KV cache's type (as llama.cpp's --cache-type-k/v) and what it would hold at "
                                "its full context: 2 × layers × context × KV heads × head_dim × bytes per value")
        self.path = _segment("the attention path of the last prefill: plain, or tiled (online softmax) for long prompts")
        self.memory = _segment("resident memory of the app")
        self.late = _segment("A first start: the faster kernels (the compiled decode step, the prompt attention, the "
                             "AVX512-VNNI batch kernels) compile in a background process and are cached for later "
                             "starts. Until they are ready, tokens take a slower path that gives the same numbers.")
        self.progress = QProgressBar()
        self.progress.setMaximumWidth(220)
        self.progress.setRange(0, 1000)
        self.progress_label = _segment("")
        self.cancel = QToolButton()
        self.cancel.setText("Cancel")
        self.cancel.clicked.connect(self.cancel_load)
        for w in (self.progress_label, self.progress, self.cancel):
            self.addWidget(w)
            w.hide()
        self.lens_label = _segment("a lens is reading the chat: its tokens run through the model once")
        self.lens_bar = QProgressBar()
        self.lens_bar.setMaximumWidth(160)
        self.lens_bar.setRange(0, 1000)
        self.lens_stop = QToolButton()
        self.lens_stop.setText("Stop")
        self.lens_stop.clicked.connect(self.stop_lens)
        for w in (self.lens_label, self.lens_bar, self.lens_stop):
            self.addWidget(w)
            w.hide()
        self._lens_due = QTimer(self, singleShot=True, interval=LENS_SHOW_MS)  # only a job that takes a while shows
        self._lens_due.timeout.connect(lambda: self._show_lens(True))
        self._lens_at: object = None
        for w in (self.late, self.model, self.backend, self.speed, self.ctx, self.kv, self.kv_cost, self.path,
                  self.memory):
            self.addPermanentWidget(w)
        self.late.hide()
        state.model_changed.connect(self._model)
        state.backend_changed.connect(self._backend)
        state.tok_s_changed.connect(self._speed)
        state.ctx_used_changed.connect(lambda _v: self._ctx())
        state.ctx_size_changed.connect(lambda _v: self._ctx())
        for signal in (state.kv_bytes_changed, state.kv_type_changed, state.kv_full_bytes_changed, state.ctx_size_changed,
                       state.model_record_changed):
            signal.connect(lambda _v: self._kv())
        state.attention_path_changed.connect(self._path)
        state.memory_bytes_changed.connect(lambda v: self.memory.setText(f"memory {human_bytes(v)}"))
        state.loading_changed.connect(self._loading)
        self._model(state.model)
        self.backend_note = ""
        self._backend(state.backend)
        self._speed(state.tok_s)
        self._ctx()
        self._kv()
        self._path(state.attention_path)
        self.timer = QTimer(self, interval=1000)
        self.timer.timeout.connect(lambda: setattr(state, "memory_bytes", process_memory()))
        self.timer.timeout.connect(self.show_late)
        self.timer.start()
        state.memory_bytes = process_memory()

    def show_late(self) -> None:
        """While a first start's background compile runs (engine.kernels.precompile): how long it has run."""
        from engine.kernels import precompile  # noqa: PLC0415

        running = precompile.late_status()
        self.late.setVisible(running is not None)
        if running is not None:
            self.late.setText(f"compiling faster kernels · {running:.0f} s")

    def _model(self, info: object) -> None:
        """The model's name (a file of the user's: its file name) and, in the tooltip, its file; a new model has
        no speed yet (the last model's tok/s is not this one's)."""
        self.model.setText(getattr(info, "name", None) or "no model")
        path = getattr(info, "path", "")
        self.model.setToolTip(f"the loaded model\n{path}" if path else "the loaded model")
        self._speed(0.0)

    def _speed(self, value: float) -> None:
        self.speed.setText(f"{value:.1f} tok/s" if value else "– tok/s")

    def _backend(self, name: str) -> None:
        """Where the products run, quietly: 'CPU · numba kernels', 'CPU · NumPy fallback (why)', 'GPU · cupy'."""
        name = str(name or "")
        self.backend.setText(name if name.startswith("CPU") else f"GPU · {name}" if name and name != "numpy" else "CPU")
        tip = "where the model computes (Backend in the sampling panel chooses it for the next load)"
        if name.startswith("CPU (") and "numba" in name:
            from engine.kernels.isa import describe  # noqa: PLC0415

            tip += f"\nggml numerics: {describe().note}"
        self.backend.setToolTip(f"{tip}\n{self.backend_note}" if self.backend_note else tip)

    def set_backend_note(self, note: str) -> None:
        """Why this backend runs, when that is the ordinary case (auto without CuPy): a tooltip, not a warning."""
        self.backend_note = note
        self._backend(self.state.backend)

    def _ctx(self) -> None:
        self.ctx.setText(f"context {self.state.ctx_used:,} / {self.state.ctx_size:,}")

    def _kv(self) -> None:
        st = self.state
        full = st.kv_full_bytes
        tail = f" · {human_bytes(full)} at {st.ctx_size:,}" if full is not None and st.ctx_size else ""
        states = int(getattr(st.model_record, "state_total", 0) or 0)  # a hybrid's recurrent layers: constant
        if states and st.kv_bytes >= states:
            self.kv.setText(f"KV {human_bytes(st.kv_bytes - states)} + state {human_bytes(states)}")
            self.kv.setToolTip("KV rows of the attention layers (they grow with the context) + the recurrent layers' "
                               "state (the same at any length)")
        else:
            self.kv.setText(f"KV {human_bytes(st.kv_bytes)}")
            self.kv.setToolTip("memory the KV cache holds now")
        self.kv_cost.setText(f"{st.kv_type}{tail}")

    def _path(self, path: str) -> None:
        self.path.setText(f"attention: {path}" if path else "")
        self.path.setVisible(bool(path))

    def set_lens_progress(self, item: object) -> None:
        """A lens job's progress (app.jobs.lens.LensProgress), None when it ended: shown with Stop after a second."""
        self._lens_at = item
        if item is None:
            self._lens_due.stop()
            self._show_lens(False)
            return
        self.lens_label.setText(str(getattr(item, "what", "")))
        self.lens_bar.setValue(int(max(0.0, min(1.0, float(getattr(item, "fraction", 0.0)))) * 1000))
        if not self.lens_bar.isVisible() and not self._lens_due.isActive():
            self._lens_due.start()

    def _show_lens(self, on: bool) -> None:
        for w in (self.lens_label, self.lens_bar, self.lens_stop):
            w.setVisible(on and self._lens_at is not None)

    def _loading(self, value: tuple[str, float] | None) -> None:
        on = value is not None
        for w in (self.progress_label, self.progress, self.cancel):
            w.setVisible(on)
        if on:
            what, frac = value
            self.progress_label.setText(what)  # cut with '…' to the room there is; the whole text in the tooltip
            self.progress_label.setToolTip(what)
            self.progress.setValue(int(max(0.0, min(1.0, frac)) * 1000))
