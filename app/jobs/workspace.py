"""The compare lane's own models (no Qt): A, the file loaded once more and never changed, and B, a second copy.

B is the copy the overrides are applied to (or A itself with another KV cache type, another GGUF, the file with
float32 numerics or with an adapter). Only the jobs of one lane touch a workspace, one at a time
(app/workers/ runs them). A job loads what it needs and `release`s it when it ends, so the app's memory
comes back to what it was before the job; what the view asks of a comparison next (its heads) is kept apart
by app.jobs.compare, in scratch files.
"""
from __future__ import annotations

import contextlib

import threading
from pathlib import Path
from typing import Any, Callable

from app.data.overrides import OverrideSpec
from app.jobs.adapter_files import set_adapter
from app.jobs.reference import forget_references
from engine.errors import LensError, SettingError
from engine.kernels.pages import trim_heap

Say = Callable[[str, float], None]


class CompareWorkspace:
    """The compare lane's own models; only compare jobs touch it, one job at a time."""

    def __init__(self, load: Callable[..., Any] | None = None):
        self._load = load
        self.path: str | None = None
        self.a: Any = None
        self.b: Any = None
        self.rq: Any = None
        self.other: tuple[str, Any] | None = None
        self.float32: Any = None  # the file with float32 numerics (B when comparing numerics)
        self.adapted: tuple[str, float, Any] | None = None  # (adapter path, scale, the file with it applied)
        self.last: Any = None  # the last comparison's runs as the heads read them (app.jobs.compare.LastRun)

    def load(self, path: str, warm: bool = True, **kw: Any) -> Any:
        if self._load is None:
            from engine.model import load_model  # noqa: PLC0415

            self._load = load_model
        return self._load(path, warm=warm, **kw)

    def use(self, path: str) -> None:
        """Work on this file from now on (models of another file are closed)."""
        if path != self.path:
            self.close()
            self.path = path

    def model_a(self, say: Say) -> Any:
        """The file, loaded once and never requantized."""
        if self.a is None:
            say(f"loading {Path(self.path or '').name} as A", 0.0)
            self.a = self.load(str(self.path))
        if getattr(self.a.net, "is_encoder_decoder", False):
            raise SettingError("Compare, the preset sweep and the mix search read one text through one stack of "
                               "layers: an encoder-decoder (T5) model is not compared yet")
        return self.a

    def load_b(self, say: Say) -> Any:
        """B, the second copy of the file, loaded (holding whatever was last applied to it)."""
        from engine.quality.requantize import Requantizer  # noqa: PLC0415

        if self.b is None:
            say("loading a second copy for B", 0.0)
            self.b = self.load(str(self.path), warm=False)
            self.rq = Requantizer(self.b)
        return self.b

    def model_b(self, spec: OverrideSpec, say: Say, cancel: threading.Event, prefix: str = "B: ",
                replace_first: bool = False) -> tuple[Any, Any]:
        """A second copy of the file with the overrides applied; returns (model, engine Plan).

        replace_first (the sweep, the mix search): the previous variant's blocks are given back before the new
        ones are made (one requantized copy at a time; see Requantizer.apply)."""
        self.load_b(say)
        preset, rules = spec.parsed()
        plan = self.rq.plan(preset, rules)
        if not self.rq.apply(plan, progress=lambda what, frac: say(f"{prefix}{what}", frac), cancel=cancel,
                             replace_first=replace_first):
            raise LensError("cancelled while requantizing B")
        return self.b, plan

    def model_other(self, path: str, say: Say) -> Any:
        """Another GGUF file (kept until a different one is asked for)."""
        if self.other is None or self.other[0] != path:
            if self.other is not None:
                self.other[1].close()
            self.other = None
            say(f"loading {Path(path).name} as B", 0.0)
            self.other = (path, self.load(path))
        return self.other[1]

    def model_float32(self, say: Say) -> Any:
        """The file with float32 numerics (dequantized weights, float32 activations): B against ggml's numbers."""
        if self.float32 is None:
            say("loading the file with float32 numerics as B", 0.0)
            self.float32 = self.load(str(self.path), numerics="float32")
        return self.float32

    def model_adapter(self, adapter: str, scale: float, say: Say) -> Any:
        """The file with an adapter applied at `scale`, a LoRA adapter or a control vector (loaded once; the adapter
        swapped when another is asked for). A bad adapter is refused before anything is applied
        (app.jobs.adapter_files)."""
        if self.adapted is None:
            say("loading the file for B (with the adapter)", 0.0)
            self.adapted = ("", 0.0, self.load(str(self.path)))
        old_path, old_scale, model = self.adapted
        if (old_path, old_scale) != (adapter, scale):
            say(f"applying {Path(adapter).name} x{scale:g}", 0.5)
            set_adapter(model, adapter, scale)
            self.adapted = (adapter, scale, model)
        return model

    def release(self) -> None:
        """Close every model this workspace loaded (the next job loads what it needs again); the shared references
        and the last comparison's runs stay. Called when each job ends: the memory comes back."""
        for m in (self.a, self.b, self.other[1] if self.other else None, self.float32,
                  self.adapted[2] if self.adapted else None):
            if m is not None:
                m.close()
        self.a = self.b = self.rq = self.other = self.float32 = self.adapted = None
        trim_heap()

    def close(self) -> None:
        """Close every model this workspace loaded, forget the last comparison and stop sharing the file's references."""
        self.last = None
        if self.path is not None:
            forget_references(self.path)
        self.release()


def early_paths() -> contextlib.AbstractContextManager[None]:
    """For a whole job on the workspace's models: when a first start's late kernels are still compiling as it
    starts, its models keep the paths without them to its end (engine.kernels.precompile.without_late, this thread):
    the late kernels' code then comes into the process when the chat's model takes them up (a pause, or its next
    pass), not half way through a comparison whose memory is measured around it."""
    from engine.kernels import precompile  # noqa: PLC0415

    return contextlib.nullcontext() if precompile.late_ready() else precompile.without_late()


def encode(model: Any, text: str, max_tokens: int) -> list[int]:
    """The text's token ids (with BOS, as the CLI's compare), cut to max_tokens and the context."""
    ids = list(model.tokenizer.encode(text, add_special=True, parse_special=False))
    ids = ids[: max(2, min(max_tokens, int(model.args.n_ctx)))]
    if len(ids) < 2:
        raise SettingError("the comparison needs a text of at least 2 tokens")
    return ids
