"""python -m tools.warm_kernels: compile the numba CPU kernels into their cache (run by ./dev before the app or tests).

On a fresh checkout this takes minutes; each step prints one line on stderr ('kernels 3/30 (12 s): ...') so the
terminal shows what is being compiled and how far it got. A run on a warm cache is quiet: lines start only once
the work has taken longer than QUIET_S, and the last line says how long it took.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

Step = tuple[str, Callable[..., Any]]  # (what is compiled, a function; called with a Progress if it takes one)
QUIET_S = 2.0  # a warm cache finishes well within this: no step lines then
REPEAT_S = 10.0  # within a long step that reports its progress, a line this often (with that progress)
PREFIX = "[dev] "


class Reporter:
    """Prints 'kernels n/m (elapsed s): what' lines, once the run has lasted longer than quiet_s (a step that
    starts before then and runs past it gets its line then, from a timer)."""

    def __init__(self, total: int, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
                 quiet_s: float = QUIET_S, repeat_s: float = REPEAT_S):
        self.total = total
        self.out = out if out is not None else sys.stderr
        self.clock = clock
        self.quiet_s = quiet_s
        self.repeat_s = repeat_s
        self.start = clock()
        self.index = 0
        self.what = ""
        self.detail = ""
        self.shown = False  # whether the current step's line was printed
        self.last_line = self.start
        self.lock = threading.RLock()
        self.timer: threading.Timer | None = None

    def elapsed(self) -> float:
        return self.clock() - self.start

    def _print(self, text: str) -> None:
        self.out.write(f"{PREFIX}{text}\n")
        self.out.flush()
        self.last_line = self.clock()

    def _line(self, detail: str = "") -> None:
        tail = f": {detail}" if detail else ""
        self._print(f"kernels {self.index}/{self.total} ({self.elapsed():.0f} s): {self.what}{tail}")
        self.shown = True

    def _loud(self) -> bool:
        return self.elapsed() >= self.quiet_s

    def step(self, what: str) -> None:
        """The next step starts."""
        self._stop_timer()
        with self.lock:
            self.index += 1
            self.what, self.detail, self.shown = what, "", False
            if self._loud():
                self._line()
                return
        self.timer = threading.Timer(max(0.0, self.quiet_s - self.elapsed()), self._late, (self.index,))
        self.timer.daemon = True
        self.timer.start()

    def _late(self, index: int) -> None:
        with self.lock:
            if index == self.index and not self.shown:
                self._line(self.detail)

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def progress(self, detail: str | float, fraction: float | None = None) -> None:
        """Within a step: (what, fraction) as engine.model.load_model reports it, or a bare fraction."""
        if isinstance(detail, (int, float)):
            detail, fraction = "", float(detail)
        text = str(detail) + (f" {100 * max(0.0, min(1.0, fraction)):.0f}%" if fraction is not None else "")
        with self.lock:
            self.detail = str(detail)
            if self._loud() and self.clock() - self.last_line >= self.repeat_s:
                self._line(text.strip())

    def done(self) -> None:
        self._stop_timer()
        with self.lock:
            if self._loud() or self.shown:
                self._print(f"kernels ready ({self.total} steps, {self.elapsed():.0f} s)")


def run(steps: Sequence[Step], out: TextIO | None = None, clock: Callable[[], float] = time.monotonic,
        quiet_s: float = QUIET_S) -> Reporter:
    """Run each step, reporting it; a failing step's error names it."""
    report = Reporter(len(steps), out, clock, quiet_s)
    try:
        for what, fn in steps:
            report.step(what)
            try:
                if getattr(fn, "takes_progress", False):
                    fn(report.progress)
                else:
                    fn()
            except Exception as exc:
                raise RuntimeError(f"compiling the CPU kernels failed at {what}: {type(exc).__name__}: {exc}") from exc
    finally:
        report._stop_timer()
    report.done()
    return report


def _with_progress(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn.takes_progress = True  # type: ignore[attr-defined]
    return fn


def steps() -> list[Step]:
    """The kernels the app and the tests use: every weight type's products, the ops, and both catalog
    architectures' prompt and decode paths (small synthetic models with the catalog models' tensor types)."""
    import numpy as np  # noqa: PLC0415

    from engine.kernels import dispatch  # noqa: PLC0415
    from engine.kernels.dispatch import VEC_DOT_TYPE, warm_up  # noqa: PLC0415

    out: list[Step] = [("loading the kernel modules", dispatch.compiled)]
    for qtype in sorted(VEC_DOT_TYPE):
        out.append((f"{qtype.name} weight products", lambda t=qtype: warm_up({t})))
    state: dict[str, Any] = {}

    def ops_import() -> None:
        from engine.ops import attention_ggml, ggml  # noqa: PLC0415

        state["attn"], state["ops"] = attention_ggml, ggml

    def rope() -> None:
        ops = state["ops"]
        x = np.linspace(-2, 2, 2 * 4 * 64, dtype=np.float32).reshape(2, 4, 64)
        cos, sin = ops.rope_cache(np.arange(4), 64, 10000.0)
        state["x"], state["q"] = x, ops.rope(x, cos, sin, "norm")

    def attention(dtype: Any) -> None:
        x, q = state["x"], state["q"]
        for t in (1, 4):
            state["attn"].attention(q[:, :t], x[:1].astype(dtype), x[:1].astype(dtype), None, 0.125)

    def flash() -> None:
        from engine.ops.attention_flash import TILE_Q, flash_attention  # noqa: PLC0415

        k = np.ones((1, TILE_Q, 64), np.float16).view(np.uint16)
        for t in (1, TILE_Q):  # the one-row kernel, the tiled one
            q = np.ones((2, t, 64), np.float32)
            flash_attention(q, k, k, TILE_Q, np.ones((t, TILE_Q), bool), 0.125, 256)

    def activations() -> None:
        ops, x = state["ops"], state["x"]
        ops.swiglu(x, x)
        ops.geglu(x, x)
        ops.rms_norm(x, np.ones(64, np.float32), 1e-6)

    out += [("loading the ops", ops_import), ("RoPE", rope),
            ("attention (float32 cache)", lambda: attention(np.float32)),
            ("attention (float16 cache)", lambda: attention(np.float16)),
            ("flash attention", flash),
            ("SwiGLU, GeGLU and RMSNorm", activations)]
    for name, dims in (("smollm2-135m-instruct", dict(head_dim=64, n_heads=2, n_kv_heads=1)),
                       ("gemma3-270m", dict(head_dim=128, n_heads=2, n_kv_heads=1, window=8))):
        out.append((f"{name}: prompt and decode step, on a small model of its shape",
                    _with_progress(lambda progress, n=name, d=dims: _model_paths(n, d, progress))))
    smol = dict(head_dim=64, n_heads=2, n_kv_heads=1)
    out.append(("smollm2-135m-instruct: the decode step with flash attention",  # engine.runtime.decode_flash
                _with_progress(lambda progress: _model_paths("smollm2-135m-instruct", smol, progress, "on"))))
    return out


def _model_paths(name: str, dims: dict[str, int], progress: Callable[[str, float], None],
                 flash_attn: str = "off") -> None:
    """Load a small synthetic model (its warm-up runs a two-token prompt and one step), then a longer prompt."""
    import pathlib  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from benchmarks.synthetic_model import spec, write_synthetic  # noqa: PLC0415
    from engine.model import load_model  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        s = spec(name, dim=256, hidden=256, n_layers=1, n_vocab=300, n_ctx=512, **dims)
        model = load_model(write_synthetic(pathlib.Path(tmp) / f"{name}.gguf", s), progress=progress,
                           flash_attn=flash_attn)
        try:
            progress("a 20-token prompt", 1.0)
            model.forward(list(range(5, 25)), model.new_cache(64))
        finally:
            model.close()


def main() -> int:
    # every kernel now, the late ones too (a first start of the app compiles those in the background; the tests
    # and a warm start run them from the first token)
    os.environ["GGUF_LENS_LATE_KERNELS"] = "now"
    run(steps())  # a failing step raises: its traceback is the error to read
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
