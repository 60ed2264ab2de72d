"""python -m app [MODEL] [--screenshot PATH [--prompt TEXT]]: the GGUF Lens desktop app."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Sequence

from app.screenshot import Screenshot

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


def main(argv: Sequence[str] | None = None) -> int:
    """Open the app (called by `gguf-lens gui`); returns the exit status."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from engine.kernels.pages import limit_arenas  # noqa: PLC0415

    limit_arenas()  # before any thread starts: what jobs free comes back to fewer arenas (issue 43's memory)
    from engine.runtime.warmup import APART_ENV  # noqa: PLC0415

    os.environ.setdefault(APART_ENV, "1")  # a new weight type's kernels compile in a helper, not in this process
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
