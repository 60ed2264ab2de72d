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
    return p


class Screenshot:
    """Drives the real window: waits for the model, sends the prompt, waits for the reply and lenses, saves a PNG."""

    def __init__(self, window: object, path: Path, prompt: str, timeout_s: float, tab: str):
        from PySide6.QtCore import QTimer  # noqa: PLC0415

        self.window = window
        self.path = path
        self.prompt = prompt
        self.tab = tab
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
        if now - self.done_at > 1.5:
            return self.finish(0)
        return None

    def _show_tab(self) -> None:
        tabs = self.window.lens_tabs
        for i in range(tabs.count()):
            if tabs.tabText(i).lower() == self.tab.lower():
                tabs.setCurrentIndex(i)

    def finish(self, code: int) -> None:
        from PySide6.QtWidgets import QApplication  # noqa: PLC0415

        self.timer.stop()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        ok = self.window.grab().save(str(self.path))
        print(f"screenshot {'saved to' if ok else 'could not be saved to'} {self.path}", file=sys.stderr)
        self.code = code if ok else 2
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
    shot = Screenshot(window, Path(args.screenshot), args.prompt, args.timeout, args.tab) if args.screenshot else None
    code = app.exec()
    if not window.closed:
        window.shutdown()
    return shot.code if shot is not None else code


if __name__ == "__main__":
    raise SystemExit(main())
