"""Screenshots of the chat with reply versions, the Positions lens and the Quantization lens at given window sizes.

Drives the real window (run it under Xvfb, or with QT_QPA_PLATFORM=offscreen):
    xvfb-run -a -s "-screen 0 1920x1080x24" .venv/bin/python tools/shots_chat_lenses.py gemma3-270m \
        --out /tmp/shots --size 1280x800 --size 1920x1080
It sends one message, regenerates the reply once (so the reply shows `< 2/2 >`), opens a tensor in the
Quantization lens, and saves chat-WxH.png, positions-WxH.png and quantization-WxH.png per size.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _wait(app: object, done: Callable[[], bool], timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        app.processEvents()
        time.sleep(0.02)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--size", action="append", default=[], help="WxH (repeatable; default 1280x800 and 1920x1080)")
    p.add_argument("--prompt", default="The capital of France is")
    p.add_argument("--tensor", default="blk.0.attn_q.weight")
    p.add_argument("--tokens", type=int, default=24)
    args = p.parse_args()
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow

    app = QApplication.instance() or QApplication(["shots"])
    w = MainWindow(model=args.model)
    w.show()
    _wait(app, lambda: w.state.model is not None and not w.engine.loading, 600, "the model")
    w.state.settings = dataclasses.replace(w.state.settings, max_tokens=args.tokens, temperature=0.8, seed=-1)
    conv = w.conversation
    conv.new_chat()
    conv.send(args.prompt)
    _wait(app, lambda: not conv.generating, 600, "the reply")
    conv.regenerate()
    _wait(app, lambda: not conv.generating, 600, "the second version")
    _wait(app, lambda: w.state.attention_record is not None, 60, "the attention record")
    quant = w.lens_slots["Quantization"].widget
    args.out.mkdir(parents=True, exist_ok=True)
    for size in args.size or ["1280x800", "1920x1080"]:
        width, height = (int(v) for v in size.split("x"))
        w.resize(width, height)
        end = time.monotonic() + 0.5
        _wait(app, lambda end=end: time.monotonic() > end, 5, "the resize")
        w.reset_layout()  # the layout a first start gives at this size
        for tab, name in (("Positions", "positions"), ("Quantization", "quantization")):
            w.lens_tabs.setCurrentWidget(w.lens_slots[tab])
            if tab == "Quantization" and quant is not None:
                quant.open_tensor(args.tensor)
                _wait(app, lambda: quant.tensor is not None and quant.tensor.name == args.tensor, 60, "the tensor")
            end = time.monotonic() + 1.0
            _wait(app, lambda end=end: time.monotonic() > end, 5, "the repaint")
            w.grab().save(str(args.out / f"{name}-{size}.png"))
            if tab == "Positions":
                w.grab().save(str(args.out / f"chat-{size}.png"))
                lens = w.lens_slots["Positions"].widget
                lens.tabs.setCurrentIndex(1)  # q.k against distance and the unit circle
                end = time.monotonic() + 0.5
                _wait(app, lambda end=end: time.monotonic() > end, 5, "the repaint")
                w.grab().save(str(args.out / f"positions-qk-{size}.png"))
                lens.tabs.setCurrentIndex(0)
    w.close()
    print(f"saved to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
