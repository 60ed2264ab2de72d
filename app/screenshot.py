"""Screenshot: `python -m app --screenshot PATH` drives the real window to a finished reply and saves a PNG."""
from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from app.views.attention.lens import AttentionLens

if TYPE_CHECKING:
    from PySide6.QtCore import QByteArray

    from app.main_window import MainWindow


class Screenshot:
    """Drives the real window: waits for the model, sends the prompt, waits for the reply and lenses, saves a PNG."""

    def __init__(self, window: MainWindow, path: Path, prompt: str, timeout_s: float, tab: str, view: str = "overview",
                 step: str | None = None):
        from PySide6.QtCore import QTimer  # noqa: PLC0415

        self.window = window
        self.path = path
        self.prompt = prompt
        self.tab = tab
        self.view = view
        self.step = [int(v) for v in step.split(",")] if step else []
        self.steps_asked = False
        self.overrides: list[str] = []  # type overrides set in the Quantization lens first (B of --tab Compare)
        self.prepared = False  # the Compare view was asked for its comparison and sweep
        self.layout: tuple[QByteArray, QByteArray] | None = None
        self.sent = False
        self.done_at = 0.0
        self.deadline = time.monotonic() + timeout_s
        self.code = 1
        self.timer = QTimer(interval=200)
        self.timer.timeout.connect(self.tick)
        self.timer.start()

    def tick(self) -> None:
        w = self.window
        now = time.monotonic()
        if now > self.deadline:
            logging.error("screenshot: timed out waiting for the reply; saving what is on screen")
            return self.finish(1)
        if not self.sent:
            if w.load_error_box is not None and w.state.model is None:
                logging.error("screenshot: the model could not be loaded")
                return self.finish(1)
            if w.state.model is not None and not w.engine.loading:
                w.conversation.new_chat()
                w.chat_view.input.setPlainText(self.prompt)
                self.sent = w.conversation.send(self.prompt)
            return None
        if w.conversation.generating:
            return None
        if not self.done_at:
            self.done_at = now
            self._show_tab()
        if w.state.attention_record is None and now - self.done_at < 20:
            return None  # give the attention overview time to arrive
        if self.view == "steps" and not self._steps_ready(now):
            return None
        if not self._tab_ready():
            return None
        if now - self.done_at > 1.5:
            return self.finish(0)
        return None

    def _tab_ready(self) -> bool:
        """The Compare tab computes what it shows first (prepare_screenshot, then screenshot_ready until done); the
        Patching tab runs its default prompts; the Why lens explains the reply's last token."""
        why = self.window.lens_tabs.content("Why")
        if why is not None and self.window.lens_tabs.showing("Why"):
            return not getattr(why, "busy", False) and getattr(why, "record", None) is not None
        patching = self.window.patching_view
        if self.window.lens_tabs.currentWidget() is self.window.experiments_view:
            if not self.prepared:
                self.prepared = True
                patching.run_button.click()
                self._make_room()
            return patching.record is not None
        view = self.window.compare_view
        if self.window.lens_tabs.currentWidget() is not view:
            return True
        if not self.prepared:
            self.prepared = True
            editor = self.window.quant_bridge.editor
            if self.overrides and editor is not None:
                from app.data.overrides import OverrideSpec  # noqa: PLC0415

                preset = [o for o in self.overrides if "=" not in o]
                editor.set_spec(OverrideSpec(preset[0] if preset else None, tuple(o for o in self.overrides if "=" in o)))
            view.prepare_screenshot()
            self._make_room()
            return False
        return view.screenshot_ready()

    def _make_room(self) -> None:
        """Hide the docks and narrow the chat so the tab is wide; finish() puts the saved layout back before closing."""
        w = self.window
        self.layout = (w.saveState(), w.split.saveState())
        w.chat_dock.hide()
        w.sampling_dock.hide()
        w.split.setSizes([380, max(600, w.split.width() - 380)])

    def _show_tab(self) -> None:
        self.window.lens_tabs.select(self.tab)

    def _steps_ready(self, now: float) -> bool:
        """Show the step-through view of the chosen cell; True once its record is drawn (or after 20 s)."""
        lens = self.window.lens_tabs.lens(AttentionLens)
        if lens is None:
            return now - self.done_at > 20
        if not self.steps_asked:
            self.steps_asked = True
            self.done_at = now
            lens.show_steps()
            if self.step:
                lens.steps.select(*self.step[:3])
            lens.steps.request()
            return False
        rec = lens.steps.record
        want = tuple(self.step[:3])
        got = None if rec is None else (rec.cell.layer, rec.cell.head, rec.cell.query_index)[: len(want)]
        if got is not None and want and got != want and lens.steps.picks()[: len(want)] != want:
            lens.steps.select(*want)  # the lens re-read the chat after the reply (its query back on the last token)
            lens.steps.request()
        return (rec is not None and (not want or got == want)) or now - self.done_at > 20

    def finish(self, code: int) -> None:
        from PySide6.QtWidgets import QApplication  # noqa: PLC0415

        self.timer.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        ok = self.window.grab().save(str(self.path))
        print(f"screenshot {'saved to' if ok else 'could not be saved to'} {self.path}", file=sys.stderr)
        self.code = code if ok else 2
        if self.layout is not None:  # the layout the user had, not the screenshot's
            self.window.restoreState(self.layout[0])
            self.window.split.restoreState(self.layout[1])
        self.window.close()
        QApplication.instance().exit(self.code)
