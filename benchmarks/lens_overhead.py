"""What a lens on screen costs the chat: generation speed with each lens tab open against no lens visible, in the
real window (offscreen), with the window's repaint rate and how long Esc takes to stop a reply.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/lens_overhead.py [MODEL] [-n 96] [--rounds 2] [--json]

For each view (none: the Model tab; then the Attention overview, Head roles, Logit lens, Step through, the State view
of a hybrid, Positions, Experts, Quantization) one greedy reply of -n tokens to the same message in a new chat, in
--rounds rounds taking turns (a slow spell of a shared machine then falls on every view); each view keeps its best
tokens/s. From the reply's first token to its end, a 10 ms timer counts the event loop's turns: the longest gap
between two turns is the worst repaint interval (10 Hz means gaps under 100 ms). Then a reply is stopped (Esc's action) half-way with the Head roles
view open, timed from the stop to the chat's generating flag going off. After each reply it checks that the
Attention lens covers every token the chat shows. Prints one JSON object per view and one for the stop, each with
`/proc/cpuinfo`'s model name. Run it on a quiet machine: a compile or another benchmark beside it moves everything.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MESSAGE = "Write a long story about a dragon who learns to paint. Give every character a name."
VIEWS = ("none", "overview", "roles", "logit", "steps", "state", "Positions", "Experts", "Quantization")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


class Loop:
    """Counts the event loop's turns with a 10 ms timer; `worst` is the longest gap since `reset`."""

    def __init__(self) -> None:
        from PySide6.QtCore import QTimer  # noqa: PLC0415

        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(self._tick)
        self.reset()
        self.timer.start()

    def reset(self) -> None:
        self.last = time.perf_counter()
        self.worst = 0.0

    def _tick(self) -> None:
        now = time.perf_counter()
        self.worst = max(self.worst, now - self.last)
        self.last = now


def wait(app, until, timeout_s: float = 600.0) -> None:  # noqa: ANN001
    end = time.perf_counter() + timeout_s
    while not until():
        app.processEvents()
        time.sleep(0.002)
        if time.perf_counter() > end:
            raise SystemExit("timed out waiting for the window")


def show(w, view: str) -> None:  # noqa: ANN001
    """Put `view` on screen (none: the Model tab, no lens)."""
    if view == "none":
        w.lens_tabs.select("Model")
        return
    if view in ("Positions", "Experts", "Quantization"):
        w.lens_tabs.select(view)
        return
    lens = w.lens_tabs.select("Attention")
    target = {"overview": lens.overview, "roles": lens.roles, "logit": lens.logit, "steps": lens.steps,
              "state": lens.state_view}[view]
    lens.views.setCurrentWidget(target)


def covered(w) -> bool:  # noqa: ANN001
    """Whether the Attention lens's record covers every token the cache holds (the chat shown)."""
    rec = w.state.attention_record
    cache = w.engine.session.cache
    return rec is not None and cache is not None and rec.n_tokens >= cache.length


def reply(app, w, loop: Loop, n: int) -> tuple[float, float, bool]:  # noqa: ANN001
    """One greedy reply in a new chat: (tokens/s, worst event-loop gap in s, lenses cover it all after)."""
    done: list[object] = []
    w.conversation.reply_done.connect(done.append)
    w.conversation.new_chat()
    settle = time.perf_counter() + 0.5  # the view just put on screen paints first: not the reply's doing
    wait(app, lambda: time.perf_counter() > settle)
    first: list[int] = []

    def token(*_a: object) -> None:
        if not first:  # the gaps are counted from the reply's first token to its end
            first.append(1)
            loop.reset()

    w.conversation.message_updated.connect(token)
    assert w.conversation.send(MESSAGE)
    wait(app, lambda: done and not w.conversation.generating)
    worst = loop.worst
    w.conversation.message_updated.disconnect(token)
    w.conversation.reply_done.disconnect(done.append)
    end = time.perf_counter() + 30
    while not covered(w) and time.perf_counter() < end:
        app.processEvents()
        time.sleep(0.01)
    return float(done[0].gen_tok_s), worst, covered(w)


def stop_latency(app, w, loop: Loop, n: int) -> dict[str, float]:  # noqa: ANN001
    """Stop a reply half-way with Head roles open: seconds from the stop to the chat's generating flag off."""
    show(w, "roles")
    w.conversation.new_chat()
    steps: list[int] = []
    w.conversation.message_updated.connect(lambda *_a: steps.append(1))
    assert w.conversation.send(MESSAGE)
    wait(app, lambda: len(steps) >= n // 2 or not w.conversation.generating)
    t = time.perf_counter()
    w.conversation.stop()
    wait(app, lambda: not w.conversation.generating)
    return {"stop_s": time.perf_counter() - t}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?", default=None, help="a .gguf file or catalog name (default: the default model)")
    ap.add_argument("-n", type=int, default=96, help="tokens per reply")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="JSON lines only")
    args = ap.parse_args()
    from PySide6.QtWidgets import QApplication  # noqa: PLC0415

    from app.data.store import Store  # noqa: PLC0415
    from app.main_window import MainWindow  # noqa: PLC0415
    from engine.catalog import DEFAULT_MODEL  # noqa: PLC0415

    app = QApplication.instance() or QApplication(sys.argv)
    with tempfile.TemporaryDirectory() as data:
        w = MainWindow(model=args.model or DEFAULT_MODEL, store=Store(Path(data)))
        w.resize(1280, 800)
        w.show()
        wait(app, lambda: w.state.model is not None)
        w.state.settings = dataclasses.replace(w.state.settings, temperature=0.0, max_tokens=args.n, seed=1)
        rec = w.state.model_record
        views = [v for v in VIEWS if (v != "state" or rec.hybrid) and (v != "Experts" or rec.n_expert)]
        loop = Loop()
        show(w, "none")
        reply(app, w, loop, args.n)  # warm-up: kernels, first BLAS calls
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.rounds):
            for view in views:
                show(w, view)
                tok_s, worst, full = reply(app, w, loop, args.n)
                b = best.setdefault(view, {"tok_s": 0.0, "worst_gap_s": 0.0, "covers_all": True})
                b["tok_s"] = max(b["tok_s"], tok_s)
                b["worst_gap_s"] = max(b["worst_gap_s"], worst)
                b["covers_all"] = b["covers_all"] and full
        cpu = cpu_name()
        base = best["none"]["tok_s"]
        for view in views:
            b = best[view]
            print(json.dumps({"view": view, **{k: round(v, 4) if isinstance(v, float) else v for k, v in b.items()},
                              "ratio": round(b["tok_s"] / base, 3) if base else None, "cpu": cpu}))
        print(json.dumps({"stop": round(stop_latency(app, w, loop, args.n)["stop_s"], 3), "cpu": cpu}))
        w.close()
        w.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
