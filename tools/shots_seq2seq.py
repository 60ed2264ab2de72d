"""Screenshots of an encoder-decoder (T5) model's three attention kinds, its cross-attention step and its Positions
lens, at given window sizes.

Drives the real window (run it under Xvfb):
    xvfb-run -a -s "-screen 0 1920x1080x24" .venv/bin/python tools/shots_seq2seq.py T5.gguf --out /tmp/shots
(no T5 file is in the catalog: `tools/make_t5_model.py` writes the random-weight test model with a real UGM
vocabulary, `python -c "from tools.make_t5_model import write_t5; write_t5(Path('t5.gguf'), 't5')"`). It sends one
input, then saves encoder-, decoder-, cross-WxH.png (the Attention lens on each kind), step-WxH.png (a
cross-attention cell) and positions-WxH.png per size.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.shots_chat_lenses import _wait  # noqa: E402


def _pause(app: object, seconds: float) -> None:
    end = time.monotonic() + seconds
    _wait(app, lambda: time.monotonic() > end, seconds + 5, "the repaint")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--size", action="append", default=[], help="WxH (repeatable; default 1280x800 and 1920x1080)")
    p.add_argument("--prompt", default="translate English to German: The house is wonderful.")
    p.add_argument("--tokens", type=int, default=12)
    args = p.parse_args()
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    app = QApplication.instance() or QApplication(["shots"])
    w = MainWindow(model=args.model)
    w.show()
    _wait(app, lambda: w.state.model is not None and not w.engine.loading, 600, "the model")
    w.state.settings = dataclasses.replace(w.state.settings, max_tokens=args.tokens, temperature=0.0, seed=1)
    conv = w.conversation
    conv.new_chat()
    conv.send(args.prompt)
    _wait(app, lambda: not conv.generating, 600, "the reply")
    lens = w.lens_tabs.select("Attention")
    view = lens.seq2seq
    n = len(w.engine.session.cache.tokens)
    _wait(app, lambda: view.record is not None and len(view.record.output_texts) == n, 120, "the maps")
    args.out.mkdir(parents=True, exist_ok=True)
    for size in args.size or ["1280x800", "1920x1080"]:
        width, height = (int(v) for v in size.split("x"))
        w.resize(width, height)
        _pause(app, 0.5)
        w.reset_layout()
        w.lens_tabs.select("Attention")
        view.head.setValue(1)
        for index, name in ((0, "encoder"), (1, "decoder"), (2, "cross")):
            view.kind.setCurrentIndex(index)
            view.choose_output(min(3, n - 1))
            _pause(app, 0.8)
            w.grab().save(str(args.out / f"{name}-{size}.png"))
        view.step = None
        view.step_button.click()
        _wait(app, lambda: view.step is not None, 60, "the cross-attention step")
        _pause(app, 0.5)
        w.grab().save(str(args.out / f"step-{size}.png"))
        w.lens_tabs.select("Positions")
        _pause(app, 1.0)
        w.grab().save(str(args.out / f"positions-{size}.png"))
    w.close()
    print(f"saved to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
