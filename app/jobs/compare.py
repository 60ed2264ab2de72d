"""Compare jobs as plain generators (no Qt): A (the file) against B on the same tokens, heads of both, the preset sweep.

The jobs use their own models, never the chat's: A is the file loaded once more and never changed, B is
a second copy that the overrides are applied to (or A itself with another KV cache type, or another
GGUF). They live in a CompareWorkspace that only these jobs touch, one at a time (app/workers/ runs
them on one lane). Statistics come from engine.quality.compare; this module only runs the models.

The sweep and the mix search compare every variant with the file's log-probabilities on the evaluation
text: a Reference, made once (by a comparison whose A reads the text with an F32 cache, or by the sweep
itself) and shared by the workspaces. Its (tokens, vocabulary) rows, half a gigabyte for Gemma 3's 262k
vocabulary, wait in an unlinked scratch file and are read back a block of rows at a time; each variant's
logits are compared as its chunks come. B holds one variant at a time (Requantizer.apply(replace_first)).
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from app.data.overrides import OverrideSpec
from app.jobs.adapter_files import adapter_label, set_adapter
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
from engine.kernels.pages import trim_heap

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


def _spill_dir() -> str | None:
    """Where references wait: the user cache (a disk; /tmp may be memory), else the system's temporary folder."""
    try:
        import platformdirs  # noqa: PLC0415

        folder = os.path.join(platformdirs.user_cache_dir("gguf-lens"), "scratch")
        os.makedirs(folder, exist_ok=True)
        return folder
    except (ImportError, OSError):
        return None


class Reference:
    """The file's log-probabilities (float32, log_softmax of its logits) at each position of `ids`, in an unlinked
    scratch file: written a chunk of rows at a time, read back the same way (os.pread, from any thread)."""

    def __init__(self, key: tuple[Any, ...], ids: Sequence[int], n_vocab: int):
        self.key = key
        self.ids = tuple(int(i) for i in ids)
        self.n_vocab = int(n_vocab)
        self.rows_done = 0
        self._file = tempfile.TemporaryFile(dir=_spill_dir(), prefix="reference-")
        self._row_bytes = 4 * self.n_vocab
        self._close = weakref.finalize(self, self._file.close)  # when no job holds it any more

    @property
    def complete(self) -> bool:
        return self.rows_done == len(self.ids)

    def append(self, logp: np.ndarray) -> None:
        """The next rows, (r, n_vocab) float32 log-probabilities."""
        rows = np.ascontiguousarray(logp, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[1] != self.n_vocab or self.rows_done + rows.shape[0] > len(self.ids):
            raise LensError(f"reference rows of shape {rows.shape} do not fit")
        view, offset = memoryview(rows).cast("B"), self.rows_done * self._row_bytes
        while len(view):  # a write may take fewer bytes than it was given
            n = os.pwrite(self._file.fileno(), view, offset)
            view, offset = view[n:], offset + n
        self.rows_done += rows.shape[0]

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows [r0, r1) as a (r1 - r0, n_vocab) float32 array."""
        if not 0 <= r0 <= r1 <= self.rows_done:
            raise LensError(f"reference rows {r0}..{r1} of {self.rows_done}")
        out = np.empty((r1 - r0, self.n_vocab), np.float32)
        view, offset, fd = memoryview(out).cast("B"), r0 * self._row_bytes, self._file.fileno()
        while len(view):
            n = os.preadv(fd, [view], offset) if hasattr(os, "preadv") else _pread_into(fd, view, offset)
            if n <= 0:
                raise LensError("the reference's scratch file was cut short")
            view, offset = view[n:], offset + n
        return out

    def close(self) -> None:
        self._close()


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    data = os.pread(fd, len(view), offset)
    view[: len(data)] = data
    return len(data)


_REFERENCES: dict[tuple[Any, ...], Reference] = {}  # the latest references, shared by the workspaces
_REFERENCES_KEPT = 2
_REFERENCES_LOCK = threading.Lock()


def reference_key(model: Any, ids: Sequence[int]) -> tuple[Any, ...]:
    """What the file's logits on `ids` depend on: the file (and its version on disk), the numerics, the tokens."""
    path = os.path.realpath(str(model.path))
    try:
        st = os.stat(path)
        version: tuple[int, int] = (st.st_size, st.st_mtime_ns)
    except OSError:
        version = (-1, -1)
    return (path, version, str(getattr(model, "numerics", "")), tuple(int(i) for i in ids))


def find_reference(model: Any, ids: Sequence[int]) -> Reference | None:
    """The complete reference of this file on these tokens, if a job made one."""
    with _REFERENCES_LOCK:
        ref = _REFERENCES.get(reference_key(model, ids))
    return ref if ref is not None and ref.complete else None


def keep_reference(ref: Reference) -> None:
    """Share a complete reference; only the last few are kept (a job still reading an older one keeps it alive,
    its scratch file goes when the job lets go of it)."""
    with _REFERENCES_LOCK:
        _REFERENCES.pop(ref.key, None)
        _REFERENCES[ref.key] = ref
        for k in list(_REFERENCES)[:-_REFERENCES_KEPT]:
            del _REFERENCES[k]


def forget_references(path: str | None = None) -> None:
    """Stop sharing the references of a file (every reference when None)."""
    real = os.path.realpath(path) if path is not None else None
    with _REFERENCES_LOCK:
        for k in [k for k in _REFERENCES if real is None or k[0] == real]:
            del _REFERENCES[k]


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
        self.last: LastRun | None = None

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

    def close(self) -> None:
        """Close every model this workspace loaded (and stop sharing the file's references)."""
        self.last = None
        if self.path is not None:
            forget_references(self.path)
        for m in (self.a, self.b, self.other[1] if self.other else None, self.float32,
                  self.adapted[2] if self.adapted else None):
            if m is not None:
                m.close()
        self.a = self.b = self.rq = self.other = self.float32 = self.adapted = None


def encode(model: Any, text: str, max_tokens: int) -> list[int]:
    """The text's token ids (with BOS, as the CLI's compare), cut to max_tokens and the context."""
    ids = list(model.tokenizer.encode(text, add_special=True, parse_special=False))
    ids = ids[: max(2, min(max_tokens, int(model.args.n_ctx)))]
    if len(ids) < 2:
        raise SettingError("the comparison needs a text of at least 2 tokens")
    return ids


def run_model(model: Any, ids: Sequence[int], cache_type: str, cancel: threading.Event, say: Say,
              what: str, heads: bool = True) -> Run:
    """All logits of `ids` on a fresh cache of `cache_type`, recording queries (for heads) and hidden states.

    The forward passes of prefill(chunk_size=CHUNK), each chunk's logits written into one (N, n_vocab) array
    (prefill keeps the chunks and concatenates them: a second copy, 0.4 GB for Gemma 3 on 420 tokens)."""
    from engine.generate import run_checked  # noqa: PLC0415
    from engine.observe.recorder import Recorder  # noqa: PLC0415

    rec = Recorder(capture_q=heads, capture_hidden=heads)
    cache = model.new_cache(max(len(ids), 16), cache_type)
    logits = np.empty((len(ids), int(model.args.n_vocab)), np.float32)
    say(what, 0.0)
    for r0 in range(0, len(ids), CHUNK):
        if cancel.is_set():
            raise LensError("comparison cancelled")
        r1 = min(r0 + CHUNK, len(ids))
        logits[r0:r1] = run_checked(model, list(ids[r0:r1]), cache, rec, all_logits=True)
        say(what, r1 / len(ids))
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
    """B's model, label, bytes and bits per weight (the last comparison is over: B's old blocks go first)."""
    if opts.b_source == "overrides":
        spec = spec or OverrideSpec()
        b, plan = ws.model_b(spec, say, cancel, replace_first=True)
        return b, plan_label(spec.label(), plan) if not spec.empty else "file (no overrides set)", plan.new_bytes, plan.new_bpw
    if opts.b_source == "preset":
        b, plan = ws.model_b(OverrideSpec(opts.b_preset), say, cancel, replace_first=True)
        return b, plan_label(f"{opts.b_preset} preset", plan), plan.new_bytes, plan.new_bpw
    if opts.b_source == "mix":
        if not opts.b_rules:
            raise SettingError("find a mix in the sweep chart first (Find the best mix), then click its point")
        b, plan = ws.model_b(OverrideSpec(None, tuple(opts.b_rules)), say, cancel, replace_first=True)
        return b, opts.b_name or "searched mix", plan.new_bytes, plan.new_bpw
    if opts.b_source == "gguf":
        if not opts.b_path:
            raise SettingError("choose the other GGUF file for B first")
        b = ws.model_other(opts.b_path, say)
        _check_pair(ws.model_a(say), b)
        return b, Path(opts.b_path).name, *tensor_size(b)
    if opts.b_source == "adapter":
        if not opts.b_path:
            raise SettingError("choose the LoRA adapter for B first")
        b = ws.model_adapter(opts.b_path, opts.b_scale, say)
        nbytes, bpw = tensor_size(b)
        total = nbytes + Path(opts.b_path).stat().st_size
        return b, f"file + {adapter_label(opts.b_path, opts.b_scale)}", total, bpw
    if opts.b_source == "numerics":
        b = ws.model_float32(say)
        return b, "file, float32 numerics", *tensor_size(b)
    a = ws.model_a(say)
    return a, "file", *tensor_size(a)


def compare_job(ws: CompareWorkspace, path: str, opts: CompareOptions, spec: OverrideSpec | None,
                cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Run A and B on the text; yields progress, the CompareRecord, then the HeadPair of opts.layer/head."""
    from engine.quality.compare import (  # noqa: PLC0415
        Comparison,
        compare_routing,
        layer_divergence,
        log_softmax_rows,
        token_stats,
    )
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
    logp_a = log_softmax_rows(ra.logits, out=ra.logits)  # in place: the logits are not needed again
    logp_b = logp_a if rb.logits is ra.logits else log_softmax_rows(rb.logits, out=rb.logits)
    if opts.a_cache == "F32":  # A's run is the file's reference run: the sweep and the mix search reuse it
        keep_reference(reference_from(a, ids, logp_a))
    stats = token_stats(logp_a, logp_b, ids, logp=True)
    cmp = Comparison(per_layer=layer_divergence(ra.recorder.hidden, rb.recorder.hidden, len(ids)),
                     routing=compare_routing(ra.recorder, rb.recorder, int(a.args.n_layers), len(ids)), **stats)
    yield TaskProgress("compare", "each layer's own share (B's layer on A's input)", 0.98)
    own = own_layer_divergence(a, b, ids, ra.recorder.hidden, cache_type=opts.b_cache, cancel=cancel)
    a_bytes, a_bpw = tensor_size(a)
    tok = a.tokenizer
    record = make_compare_record(
        cmp, logp_a, logp_b, ids, tok.token_text,
        labels=(f"{Path(path).name} (file)", b_label), caches=(opts.a_cache, opts.b_cache), sizes=(a_bytes, b_bytes),
        bpws=(a_bpw, b_bpw), n_heads=max_heads(a), elapsed_s=time.perf_counter() - t0, own=own,
        recurrent=getattr(a.net, "mixers", None) or (),
    )
    for run in (ra, rb):  # what the heads need stays; logits and hidden states go
        run.logits = None
        run.recorder.hidden.clear()
    ws.last = LastRun(ra, rb, list(record.token_texts))
    del logp_a, logp_b
    trim_heap()
    yield record
    yield head_pair(ws, opts.layer, opts.head)
    return record


def max_heads(model: Any) -> int:
    """The most heads a layer of `model` has: query heads, or a hybrid's recurrent value heads when more."""
    dims = getattr(model.args, "deltanet", None)
    return max(int(model.args.n_heads), int(dims.v_heads) if dims is not None else 0)


def head_pair(ws: CompareWorkspace, layer: int, head: int) -> HeadPair:
    """The attention of (layer, head) in both runs of the last comparison (a hybrid's recurrent layer: the value
    head's read maps, app.records.recurrent)."""
    from app.records.attention import make_head_record  # noqa: PLC0415

    last = ws.last
    if last is None:
        raise LensError("run a comparison first")
    rec = last.a.recorder
    n_layers = int(last.a.model.args.n_layers)
    layer = int(np.clip(layer, 0, n_layers - 1))
    if layer in rec.q:
        n_heads = int(rec.q[layer].shape[0])
    elif layer in rec.recurrent:
        n_heads = int(rec.recurrent[layer]["v"].shape[1])
    else:
        raise LensError(f"layer {layer} was not recorded")
    head = int(np.clip(head, 0, n_heads - 1))
    ha = make_head_record(last.a.model, last.a.recorder, last.a.cache, layer, head, None, last.texts)
    hb = make_head_record(last.b.model, last.b.recorder, last.b.cache, layer, head, None, last.texts)
    if ha is None or hb is None:
        raise LensError(f"layer {layer} was not recorded in both runs")
    return HeadPair(layer, head, ha, hb)


def release_job(ws: CompareWorkspace) -> Iterator[object]:
    """Close the workspace's models (another file was loaded); runs on the workspace's lane, after its jobs."""
    ws.close()
    ws.path = None
    yield from ()


def head_job(ws: CompareWorkspace, layer: int, head: int) -> Iterator[object]:
    """Yield the HeadPair of (layer, head) of the last comparison."""
    yield head_pair(ws, layer, head)


def reference_from(model: Any, ids: Sequence[int], logp: np.ndarray) -> Reference:
    """A Reference holding these log-probabilities of the file's run on `ids`."""
    ref = Reference(reference_key(model, ids), ids, logp.shape[-1])
    ref.append(logp)
    return ref


def make_reference(model: Any, ids: Sequence[int], cancel: threading.Event, say: Say, what: str) -> Reference:
    """Run the model (holding the file's weights) on `ids` with an F32 cache, a chunk at a time into a Reference."""
    from engine.quality.compare import log_softmax_rows  # noqa: PLC0415

    ref = Reference(reference_key(model, ids), ids, int(model.args.n_vocab))
    for logits in _chunks(model, ids, cancel, say, what):
        ref.append(log_softmax_rows(logits, out=logits))
    return ref


def _chunks(model: Any, ids: Sequence[int], cancel: threading.Event, say: Say, what: str) -> Iterator[np.ndarray]:
    """The logits of `ids` on a fresh F32 cache, CHUNK rows at a time (the forward passes run_model makes), each
    chunk's logits handed over as it comes. The weights stream: a measuring run reads each once per chunk, so
    their file pages (the GGUF's, or a requantized variant's scratch file) are given back after each product."""
    from engine.generate import run_checked  # noqa: PLC0415
    from engine.kernels.pages import streaming  # noqa: PLC0415

    cache = model.new_cache(max(len(ids), 16), "F32")
    say(what, 0.0)
    for r0 in range(0, len(ids), CHUNK):
        if cancel.is_set():
            raise LensError("comparison cancelled")
        r1 = min(r0 + CHUNK, len(ids))
        with streaming():  # each weight's file pages go once its batch is done (one layer resident at a time)
            logits = run_checked(model, list(ids[r0:r1]), cache, None, all_logits=True)
        yield logits
        say(what, r1 / len(ids))


def measure_against(model: Any, ids: Sequence[int], ref: Reference, cancel: threading.Event, say: Say,
                    what: str) -> dict[str, object]:
    """token_stats of the model's run on `ids` against the file's reference, a chunk of rows at a time (and the
    reference read back a block of rows at a time): neither side's (tokens, vocabulary) logits are ever whole
    in memory."""
    from engine.quality import compare as stats  # noqa: PLC0415

    acc = stats.TokenStats(ids, base_logp=True)
    step = max(1, stats.STATS_BLOCK_BYTES // max(1, 8 * ref.n_vocab))
    for logits in _chunks(model, ids, cancel, say, what):
        for r0 in range(0, len(logits), step):
            block = logits[r0 : r0 + step]
            acc.add(ref.rows(acc.done, acc.done + len(block)), block)
        del logits
    trim_heap()
    return acc.result()


def file_reference(ws: CompareWorkspace, ids: Sequence[int], cancel: threading.Event, say: Say) -> Reference:
    """The file's reference on `ids`: the one a comparison (or an earlier sweep) made, else B reset to the file's
    weights runs it once."""
    b = ws.load_b(say)
    ref = find_reference(b, ids)
    if ref is None:
        ws.model_b(OverrideSpec(), lambda what, frac: say(what, 0.0), cancel, prefix="the file: ", replace_first=True)
        ref = make_reference(b, ids, cancel, say, f"running the file on {len(ids)} tokens")
        keep_reference(ref)
    return ref


def _duration(seconds: float) -> str:
    if seconds < 55:
        return f"{max(5, 5 * round(seconds / 5))} s"
    if seconds < 3570:
        return f"{max(1, round(seconds / 60))} min"
    return f"{int(seconds // 3600)} h {round(seconds % 3600 / 60)} min"


class TimeLeft:
    """'about 3 min left' from the time so far and the fraction done (nothing until there is something to go on)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.t0 = clock()

    def __call__(self, fraction: float) -> str:
        elapsed = self.clock() - self.t0
        if fraction < 0.02 or elapsed < 1.0:
            return "estimating the time left"
        if fraction >= 1.0:
            return "finishing"
        return f"about {_duration(elapsed * (1.0 - fraction) / fraction)} left"


def sweep_job(ws: CompareWorkspace, path: str, text: str, spec: OverrideSpec | None, cancel: threading.Event,
              emit: Emit, presets: Sequence[str] = SWEEP_PRESETS, max_tokens: int = 512) -> Iterator[object]:
    """For the overrides (when set) and each preset: requantize B, run it on the text, yield a SweepPoint.

    Only one model is loaded (B, a copy of the file), holding one variant at a time: each variant's blocks
    replace the previous one's (Requantizer.apply(replace_first=True)). Every variant is compared with the
    file's reference run (file_reference: the comparison's A when it read the same tokens, else run once
    here) a chunk of rows at a time. Progress says which variant of how many and the time left.
    """
    same_as_preset = spec is not None and not spec.rules and spec.preset in presets
    variants = ([("overrides", spec)] if spec is not None and not spec.empty and not same_as_preset else [])
    variants += [("preset", OverrideSpec(p)) for p in presets]
    left = TimeLeft()
    steps = [len(variants) + 1, 0]  # (steps: the reference run when one is needed, then each variant; current)

    def say(what: str, frac: float) -> None:
        done = (steps[1] + min(1.0, max(0.0, frac))) / steps[0]
        emit(TaskProgress("sweep", f"{what} · {left(done)}", done))

    ws.use(path)
    b = ws.load_b(say)
    ids = encode(b, text, max_tokens)
    reuse = find_reference(b, ids) is not None
    if reuse:
        steps[0] = len(variants)
    try:
        ref = file_reference(ws, ids, cancel, say)
    except LensError:
        if not cancel.is_set():
            raise
        yield SweepDone(0, True)
        return 0
    done = 0
    for i, (kind, s) in enumerate(variants):
        steps[1] = i + (not reuse)
        name = s.label() if kind == "overrides" else str(s.preset)
        head = f"{name} ({i + 1} of {len(variants)})"
        try:
            b, plan = ws.model_b(s, lambda what, frac, h=head: say(f"{h}: {what}", 0.5 * frac), cancel,
                                 prefix="", replace_first=True)
            trim_heap()
            st = measure_against(b, ids, ref, cancel, lambda what, frac, h=head: say(f"{h}: {what}", 0.5 + 0.5 * frac),
                                 f"running on {len(ids)} tokens")
        except LensError:
            if cancel.is_set():
                break
            raise
        done += 1
        yield SweepPoint(name, kind, plan.new_bytes, plan.new_bpw, float(st["kld_mean"]), float(st["kld_p99"]),
                         float(st["same_top_pct"]), float(st["ppl_ratio"]), len(ids))
    yield SweepDone(done, cancel.is_set())
    return done
