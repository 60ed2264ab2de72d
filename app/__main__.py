"""python -m app [MODEL] [--screenshot PATH [--prompt TEXT]]: the GGUF Lens desktop app."""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

DEFAULT_PROMPT = "In two sentences, what does attention do in a transformer?"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gguf-lens gui", description="GGUF Lens: run a GGUF model and look inside it.")
    p.add_argument("model", nargs="?", help="a .gguf path or catalog name (default: the last one used)")
    p.add_argument("--screenshot", metavar="PATH", help="load the model, send --prompt, wait for the reply, save a PNG, exit")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the message --screenshot sends")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds --screenshot waits for the reply")
    p.add_argument("--tab", default="Attention", help="the lens tab --screenshot shows")
    p.add_argument("--view", choices=("overview", "steps"), default="overview",
                   help="the Attention lens's view --screenshot shows ('steps': one attention cell, step by step)")
    p.add_argument("--step", metavar="LAYER,HEAD[,QUERY]", help="the cell --view steps shows (default: 0,0,last token)")
    p.add_argument("--override", action="append", default=[], metavar="PRESET|REGEX=TYPE",
                   help="type overrides set in the Quantization lens before --screenshot (B of --tab Compare)")
    return p


class Screenshot:
    """Drives the real window: waits for the model, sends the prompt, waits for the reply and lenses, saves a PNG."""

    def __init__(self, window: object, path: Path, prompt: str, timeout_s: float, tab: str, view: str = "overview",
                 step: str | None = None):
        from PySide6.QtCore import QTimer  # noqa: PLC0415

        self.window = window
        self.path = path
        self.prompt = prompt
        self.tab = tab
        self.view = view
        self.step = [int(v) for v in step.split(",")] if step else []
        self.steps_asked = False
        self.overrides: list[str] = []
        self.layout: tuple[object, object] | None = None
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
            if getattr(w, "load_error_box", None) is not None and w.state.model is None:
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
        """A tab with prepare_screenshot()/screenshot_ready() (the Compare view) computes what it shows first."""
        widget = self.window.lens_tabs.currentWidget()
        if not hasattr(widget, "screenshot_ready"):
            return True
        if not getattr(self, "prepared", False):
            self.prepared = True
            editor = getattr(getattr(self.window, "quant_bridge", None), "editor", None)
            if self.overrides and editor is not None:
                from app.overrides import OverrideSpec  # noqa: PLC0415

                preset = [o for o in self.overrides if "=" not in o]
                editor.set_spec(OverrideSpec(preset[0] if preset else None, tuple(o for o in self.overrides if "=" in o)))
            widget.prepare_screenshot()
            self._make_room()
            return False
        return bool(widget.screenshot_ready())

    def _make_room(self) -> None:
        """Hide the docks and narrow the chat so the tab is wide; finish() puts the saved layout back before closing."""
        w = self.window
        self.layout = (w.saveState(), w.split.saveState())
        w.chat_dock.hide()
        w.sampling_dock.hide()
        w.split.setSizes([380, max(600, w.split.width() - 380)])

    def _show_tab(self) -> None:
        tabs = self.window.lens_tabs
        for i in range(tabs.count()):
            if tabs.tabText(i).lower() == self.tab.lower():
                tabs.setCurrentIndex(i)

    def _steps_ready(self, now: float) -> bool:
        """Show the step-through view of the chosen cell; True once its record is drawn (or after 20 s)."""
        lens = self.window.lens_slots["Attention"].widget
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
        want = tuple(self.step[:2])
        return (rec is not None and (not want or (rec.cell.layer, rec.cell.head) == want)) or now - self.done_at > 20

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


def main(argv: Sequence[str] | None = None) -> int:
    """Open the app (called by `gguf-lens gui`); returns the exit status."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from PySide6.QtWidgets import QApplication  # noqa: PLC0415

    from app.main_window import MainWindow  # noqa: PLC0415

    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "gguf-lens"])
    app.setApplicationName("GGUF Lens")
    window = MainWindow(model=args.model)
    window.show()
    shot = Screenshot(window, Path(args.screenshot), args.prompt, args.timeout, args.tab, args.view,
                      args.step) if args.screenshot else None
    if shot is not None:
        shot.overrides = list(args.override)
    code = app.exec()
    if not window.closed:
        window.shutdown()
    return shot.code if shot is not None else code


if __name__ == "__main__":
    raise SystemExit(main())
