"""Compare jobs as plain generators (no Qt): A (the file) against B on the same tokens, heads of both, the preset sweep.

The jobs use their own models, never the chat's: A is the file loaded once more and never changed, B is
a second copy that the overrides are applied to (or A itself with another KV cache type, or another
GGUF). They live in a CompareWorkspace that only these jobs touch, one at a time (app/workers/ runs
them on one lane). Statistics come from engine.quality.compare; this module only runs the models.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from app.data.overrides import OverrideSpec
from app.jobs.session import Emit
from app.records.compare import (
    CompareOptions,
    HeadPair,
    SweepDone,
    SweepPoint,
    TaskProgress,
    make_compare_record,
    plan_label,
)
from engine.errors import LensError, SettingError
Say = Callable[[str, float], None]
SWEEP_PRESETS = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0",
                 "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")
CHUNK = 128  # prefill chunk: the step of progress and cancel


@dataclass
class Run:
    """One model's pass over the tokens: all logits, the recorder (queries, hidden states) and its own cache."""

    model: Any
    logits: np.ndarray | None
    recorder: Any
    cache: Any


@dataclass
class LastRun:
    """The two runs of the latest comparison, kept for the heads the view asks for next."""

    a: Run
    b: Run
    texts: list[str]


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
        self.last: LastRun | None = None
        self.reference: tuple[tuple[int, ...], np.ndarray] | None = None  # (ids, A's logits) for the sweep

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
        return self.a

    def model_b(self, spec: OverrideSpec, say: Say, cancel: threading.Event) -> tuple[Any, Any]:
        """A second copy of the file with the overrides applied; returns (model, engine Plan)."""
        from engine.quality.requantize import Requantizer  # noqa: PLC0415

        if self.b is None:
            say("loading a second copy for B", 0.0)
            self.b = self.load(str(self.path), warm=False)
            self.rq = Requantizer(self.b)
        preset, rules = spec.parsed()
        plan = self.rq.plan(preset, rules)
        if not self.rq.apply(plan, progress=lambda what, frac: say(f"B: {what}", frac), cancel=cancel):
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

    def close(self) -> None:
        """Close every model this workspace loaded."""
        self.last = None
        self.reference = None
        for m in (self.a, self.b, self.other[1] if self.other else None, self.float32):
            if m is not None:
                m.close()
        self.a = self.b = self.rq = self.other = self.float32 = None


def encode(model: Any, text: str, max_tokens: int) -> list[int]:
    """The text's token ids (with BOS, as the CLI's compare), cut to max_tokens and the context."""
    ids = list(model.tokenizer.encode(text, add_special=True, parse_special=False))
    ids = ids[: max(2, min(max_tokens, int(model.args.n_ctx)))]
    if len(ids) < 2:
        raise SettingError("the comparison needs a text of at least 2 tokens")
    return ids


def run_model(model: Any, ids: Sequence[int], cache_type: str, cancel: threading.Event, say: Say,
              what: str, heads: bool = True) -> Run:
    """All logits of `ids` on a fresh cache of `cache_type`, recording queries (for heads) and hidden states."""
    from engine.generate import prefill  # noqa: PLC0415
    from engine.observe.recorder import Recorder  # noqa: PLC0415

    rec = Recorder(capture_q=heads, capture_hidden=heads)
    cache = model.new_cache(max(len(ids), 16), cache_type)
    logits = prefill(model, ids, cache, all_logits=True, chunk_size=CHUNK, recorder=rec, cancel=cancel,
                     progress=lambda d, t: say(what, d / max(t, 1)))
    if logits is None:
        raise LensError("comparison cancelled")
    return Run(model, logits, rec, cache)


def tensor_size(model: Any) -> tuple[int, float]:
    """(bytes, bits per weight) of a model's tensors as in its file."""
    infos = model.gguf.tensors.values()
    nbytes = sum(int(t.nbytes) for t in infos)
    n = sum(int(np.prod(t.shape)) for t in infos)
    return nbytes, 8.0 * nbytes / max(1, n)


def _check_pair(a: Any, b: Any) -> None:
    if a.args.n_vocab != b.args.n_vocab or a.args.n_layers != b.args.n_layers:
        raise SettingError("the two models differ in vocabulary or depth; they cannot be compared token by token")


def _side(ws: CompareWorkspace, opts: CompareOptions, spec: OverrideSpec | None, say: Say,
          cancel: threading.Event) -> tuple[Any, str, int, float]:
    """B's model, label, bytes and bits per weight."""
    if opts.b_source == "overrides":
        spec = spec or OverrideSpec()
        b, plan = ws.model_b(spec, say, cancel)
        return b, plan_label(spec.label(), plan) if not spec.empty else "file (no overrides set)", plan.new_bytes, plan.new_bpw
    if opts.b_source == "preset":
        b, plan = ws.model_b(OverrideSpec(opts.b_preset), say, cancel)
        return b, plan_label(f"{opts.b_preset} preset", plan), plan.new_bytes, plan.new_bpw
    if opts.b_source == "mix":
        if not opts.b_rules:
            raise SettingError("find a mix in the sweep chart first (Find the best mix), then click its point")
        b, plan = ws.model_b(OverrideSpec(None, tuple(opts.b_rules)), say, cancel)
        return b, opts.b_name or "searched mix", plan.new_bytes, plan.new_bpw
    if opts.b_source == "gguf":
        if not opts.b_path:
            raise SettingError("choose the other GGUF file for B first")
        b = ws.model_other(opts.b_path, say)
        _check_pair(ws.model_a(say), b)
        return b, Path(opts.b_path).name, *tensor_size(b)
    if opts.b_source == "numerics":
        b = ws.model_float32(say)
        return b, "file, float32 numerics", *tensor_size(b)
    a = ws.model_a(say)
    return a, "file", *tensor_size(a)


def compare_job(ws: CompareWorkspace, path: str, opts: CompareOptions, spec: OverrideSpec | None,
                cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Run A and B on the text; yields progress, the CompareRecord, then the HeadPair of opts.layer/head."""
    from engine.generate import log_softmax  # noqa: PLC0415
    from engine.quality.compare import Comparison, layer_divergence, token_stats  # noqa: PLC0415
    from engine.quality.layer_damage import own_layer_divergence  # noqa: PLC0415

    t0 = time.perf_counter()
    phase = [0.0, 0.1]  # (start, width) of the current phase in the overall fraction

    def say(what: str, frac: float) -> None:
        emit(TaskProgress("compare", what, phase[0] + phase[1] * min(1.0, frac)))

    ws.use(path)
    ws.last = None
    yield TaskProgress("compare", "preparing A", 0.0)
    a = ws.model_a(say)
    ids = encode(a, opts.text, opts.max_tokens)
    phase[:] = [0.1, 0.3]
    b, b_label, b_bytes, b_bpw = _side(ws, opts, spec, say, cancel)
    phase[:] = [0.4, 0.3]
    ra = run_model(a, ids, opts.a_cache, cancel, say, f"running A on {len(ids)} tokens")
    phase[:] = [0.7, 0.3]
    rb = run_model(b, ids, opts.b_cache, cancel, say, f"running B on {len(ids)} tokens")
    stats = token_stats(ra.logits, rb.logits, ids)
    cmp = Comparison(per_layer=layer_divergence(ra.recorder.hidden, rb.recorder.hidden, len(ids)), **stats)
    yield TaskProgress("compare", "each layer's own share (B's layer on A's input)", 0.98)
    own = own_layer_divergence(a, b, ids, ra.recorder.hidden, cache_type=opts.b_cache, cancel=cancel)
    a_bytes, a_bpw = tensor_size(a)
    tok = a.tokenizer
    record = make_compare_record(
        cmp, log_softmax(ra.logits), log_softmax(rb.logits), ids, tok.token_text,
        labels=(f"{Path(path).name} (file)", b_label), caches=(opts.a_cache, opts.b_cache), sizes=(a_bytes, b_bytes),
        bpws=(a_bpw, b_bpw), n_heads=int(a.args.n_heads), elapsed_s=time.perf_counter() - t0, own=own,
    )
    for run in (ra, rb):  # what the heads need stays; logits and hidden states go
        run.logits = None
        run.recorder.hidden.clear()
    ws.last = LastRun(ra, rb, list(record.token_texts))
    yield record
    yield head_pair(ws, opts.layer, opts.head)
    return record


def head_pair(ws: CompareWorkspace, layer: int, head: int) -> HeadPair:
    """The attention of (layer, head) in both runs of the last comparison."""
    from app.records.attention import make_head_record  # noqa: PLC0415

    last = ws.last
    if last is None:
        raise LensError("run a comparison first")
    n_layers = len(last.a.recorder.specs)
    n_heads = int(last.a.model.args.n_heads)
    layer, head = int(np.clip(layer, 0, n_layers - 1)), int(np.clip(head, 0, n_heads - 1))
    ha = make_head_record(last.a.model, last.a.recorder, last.a.cache, layer, head, None, last.texts)
    hb = make_head_record(last.b.model, last.b.recorder, last.b.cache, layer, head, None, last.texts)
    return HeadPair(layer, head, ha, hb)


def release_job(ws: CompareWorkspace) -> Iterator[object]:
    """Close the workspace's models (another file was loaded); runs on the workspace's lane, after its jobs."""
    ws.close()
    ws.path = None
    yield from ()


def head_job(ws: CompareWorkspace, layer: int, head: int) -> Iterator[object]:
    """Yield the HeadPair of (layer, head) of the last comparison."""
    yield head_pair(ws, layer, head)


def sweep_job(ws: CompareWorkspace, path: str, text: str, spec: OverrideSpec | None, cancel: threading.Event,
              emit: Emit, presets: Sequence[str] = SWEEP_PRESETS, max_tokens: int = 512) -> Iterator[object]:
    """For the overrides (when set) and each preset: requantize B, run it on the text, yield a SweepPoint.

    Only one model is loaded (B, a copy of the file): reset to the file's weights it gives the reference.
    """
    from engine.quality.compare import token_stats  # noqa: PLC0415

    same_as_preset = spec is not None and not spec.rules and spec.preset in presets
    variants = ([("overrides", spec)] if spec is not None and not spec.empty and not same_as_preset else [])
    variants += [("preset", OverrideSpec(p)) for p in presets]
    n = len(variants) + 1
    step = [0]

    def say(what: str, frac: float) -> None:
        emit(TaskProgress("sweep", what, (step[0] + min(1.0, frac)) / n))

    ws.use(path)  # the sweep's workspace only loads B: reset to the file, it gives the reference logits
    b, _ = ws.model_b(OverrideSpec(), say, cancel)
    ids = encode(b, text, max_tokens)
    if ws.reference is None or ws.reference[0] != tuple(ids):
        run = run_model(b, ids, "F32", cancel, say, f"running the file on {len(ids)} tokens", heads=False)
        ws.reference = (tuple(ids), run.logits)
    reference = ws.reference[1]
    done = 0
    for i, (kind, s) in enumerate(variants):
        step[0] = i + 1
        name = s.label() if kind == "overrides" else str(s.preset)
        try:
            b, plan = ws.model_b(s, lambda what, frac, nm=name: say(f"{nm}: {what}", 0.5 * frac), cancel)
            run = run_model(b, ids, "F32", cancel, lambda what, frac, nm=name: say(f"{nm}: {what}", 0.5 + 0.5 * frac),
                            "running", heads=False)
        except LensError:
            if cancel.is_set():
                break
            raise
        st = token_stats(reference, run.logits, ids)
        done += 1
        yield SweepPoint(name, kind, plan.new_bytes, plan.new_bpw, float(st["kld_mean"]), float(st["kld_p99"]),
                         float(st["same_top_pct"]), float(st["ppl_ratio"]), len(ids))
    yield SweepDone(done, cancel.is_set())
    return done
