"""Session: the live engine objects of the loaded model, which only jobs touch, and the Emit callback jobs get.

The loaded model, its KV cache and the Recorder live here and are only touched by jobs, under `Session.lock`;
the generate job releases the lock between tokens so lens jobs can run in between. app/workers/ owns the one
Session and runs the jobs on threads.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

Emit = Callable[[object], None]  # how a job sends an item to the GUI thread (also from callbacks inside it)


@dataclass
class Session:
    """The live engine objects of the loaded model; only jobs touch them, under `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    model: Any = None
    cache: Any = None
    recorder: Any = None
    context_limit: int = 4096
    cache_type: str = "F16"  # the type the next fresh cache holds (F32 | F16 | Q8_0 | Q4_0), set from the GUI
    backend: str = "auto"  # the array backend the next load uses (auto | numpy | cupy), set from the GUI
    numerics: str = "ggml"  # how the next load computes (ggml | float32), set from the GUI
    generating: threading.Event = field(default_factory=threading.Event)
    requantizer: Any = None  # engine.requantize.Requantizer of `model`, made by the first requantize job

    def n_ctx(self) -> int:
        return max(16, min(int(self.model.args.n_ctx), self.context_limit)) if self.model else 0

    def fresh_cache(self) -> None:
        """A new cache and recorder sized by the current context limit (call under lock)."""
        from engine.observe.recorder import Recorder  # noqa: PLC0415

        self.cache = self.model.new_cache(self.n_ctx(), self.cache_type)
        self.recorder = Recorder(capture_q=True)

    def token_texts(self) -> list[str]:
        tok = self.model.tokenizer
        return [tok.token_text(t) for t in self.cache.tokens]
