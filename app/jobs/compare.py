"""Compare jobs as plain generators (no Qt): A (the file) against B on the same tokens, and the heads of both.

The jobs use their own models, never the chat's: A is the file loaded once more and never changed, B is
a second copy that the overrides are applied to (or A itself with another KV cache type, or another
GGUF), in a CompareWorkspace (app.jobs.workspace) that only these jobs touch, one at a time (app/workers/ runs
them on one lane). Statistics come from engine.quality.compare; this module only runs the models.

A and B run in step, CHUNK (128) positions a forward pass (a quantized cache's numbers depend on the chunk), and
their logits are taken from the last residual stream a block of rows at a time (chunk_rows: as many as 48 MiB of
logit rows a side hold, as the CLI's compare); each block's logits go into the running statistics (TokenStats),
the top tokens (TopUnion) and, when A reads with an F32 cache, the file's Reference (app.jobs.reference) that the
sweep and the mix search reuse; then they are dropped: neither run's (tokens, vocabulary) logits are ever whole in
memory (1 GiB a side for Gemma 3 on 1,024 tokens). When the job ends its models are closed; what the view asks
next of the comparison (another head) is read from the recorded queries and keys, kept in scratch files.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from app.data.overrides import OverrideSpec
from app.jobs.adapter_files import adapter_label
from app.jobs.reference import CHUNK, Reference, chunk_rows, keep_reference, reference_key, spill_dir
from app.jobs.session import Emit
from app.jobs.workspace import CompareWorkspace, Say, early_paths, encode
from app.records.compare import CompareOptions, HeadPair, TaskProgress, TopUnion, make_compare_record, plan_label
from engine.errors import LensError, SettingError
from engine.kernels import pages

__all__ = ["CompareWorkspace", "chunk_rows", "encode", "compare_job", "head_job", "head_pair", "release_job",
           "run_pair"]


@dataclass(frozen=True)
class Shape:
    """What the heads of a finished comparison need of a model once it is closed: its hyperparameters and file."""

    args: Any
    path: str


@dataclass
class Run:
    """One model's pass over the tokens: the model (its Shape once closed), the recorder (queries, hidden states)
    and its own cache."""

    model: Any
    recorder: Any
    cache: Any


@dataclass
class LastRun:
    """The two runs of the latest comparison, kept for the heads the view asks for next (their queries and keys in
    scratch files), and how B was made (the logit lens loads both models again)."""

    a: Run
    b: Run
    texts: list[str]
    opts: CompareOptions | None = None
    spec: OverrideSpec | None = None


def run_pair(a: Any, b: Any, ids: Sequence[int], caches: tuple[str, str], cancel: threading.Event, say: Say,
             reference: bool = False) -> tuple[Run, Run, dict[str, object], tuple[Any, Any, Any], Reference | None]:
    """A and B on `ids`, each on a fresh cache of its type, in step: CHUNK positions of A, the same of B (the forward
    passes, and so the numbers, of two whole runs prefilled that many at a time), recording queries and hidden
    states; then their logits chunk_rows(vocabulary) rows at a time from the last residual stream.
    Each block's log-probabilities go into the statistics, the top tokens and (reference=True) the file's
    Reference, then are dropped. Returns both runs, token_stats's dictionary, top_union's arrays, the Reference."""
    from engine.generate import logit_blocks, run_for_logits  # noqa: PLC0415
    from engine.observe.recorder import Recorder  # noqa: PLC0415
    from engine.quality.compare import TokenStats, log_softmax_rows  # noqa: PLC0415

    n = len(ids)
    runs = [Run(m, Recorder(capture_q=True, capture_hidden=True), m.new_cache(max(n, 16), t))
            for m, t in zip((a, b), caches)]
    acc, top = TokenStats(ids, base_logp=True, other_logp=True), TopUnion()
    ref = Reference(reference_key(a, ids), ids, int(a.args.n_vocab)) if reference else None
    # the forward passes run CHUNK positions at a time (a quantized cache's numbers depend on the chunk: its own
    # keys are read before they are stored quantized) and their logits are taken about chunk_rows(vocabulary) rows
    # at a time from the residual stream (head_blocks: Gemma 3 48 rows, 48 MiB a side; the whole chunk's numbers); a model that cannot stop before its head (a
    # GPU runner) runs chunk_rows positions a pass with F32 caches (whose numbers do not depend on it), else CHUNK
    exact = all(str(t).upper() == "F32" for t in caches)
    rows_at_once = chunk_rows(int(a.args.n_vocab))
    split = all(getattr(r.model, "stops_before_head", False) for r in runs)
    chunk = CHUNK if split or not exact else rows_at_once
    what = f"running A and B on {n} tokens"
    say(what, 0.0)

    def fold(rows: list[np.ndarray]) -> None:
        if ref is not None:
            ref.append(rows[0])
        acc.add(rows[0], rows[1])
        top.add(rows[0], rows[1])

    for r0 in range(0, n, chunk):
        r1 = min(r0 + chunk, n)
        outs, hidden = [], []
        for side, run in enumerate(runs):
            if cancel.is_set():
                raise LensError("comparison cancelled")
            out, h = run_for_logits(run.model, list(ids[r0:r1]), run.cache, run.recorder)
            outs.append(out)
            hidden.append(h)
            to_scratch(run.recorder, n)
            say(what, (r0 + (side + 1) * (r1 - r0) / 2) / n)
        for rows in logit_blocks([run.model for run in runs], outs, hidden, rows_at_once):
            fold([log_softmax_rows(r, out=r) for r in rows])  # in place: the logits are not needed again
            del rows  # before the next block's are made
        del outs
    return runs[0], runs[1], acc.result(), top.result(), ref


def to_scratch(rec: Any, n: int) -> None:
    """Move what the recorder holds of a run (queries, hidden states, a recurrent layer's inputs) into scratch files,
    sized for all n positions: the recorder writes the next chunks' rows in place (a shared mapping: they reach the
    page cache) and the pages written leave this process after each chunk. Neither run's recordings (Gemma 3 on
    1,024 tokens: 72 MiB of queries, 45 MiB of hidden states a run) are resident while the logits of a chunk are."""
    stores = [(rec.q, 1), (rec.hidden, 0), *((r, 0) for r in rec.recurrent.values())]
    for store, axis in stores:
        for key, x in store.items():
            if not isinstance(x, np.memmap):
                store[key] = _scratch_array(x, max(n, x.shape[axis]), axis)
            view = store[key].view()
            view.flags.writeable = False  # pages.release drops a read-only mapping's pages (here: written back first)
            pages.release(view)


def _scratch_array(x: np.ndarray, length: int, axis: int) -> np.ndarray:
    """x in a writable scratch file (unlinked) of `length` positions along `axis`; x itself where none can be made."""
    import tempfile  # noqa: PLC0415

    shape = list(x.shape)
    shape[axis] = length
    nbytes = int(np.prod(shape)) * x.dtype.itemsize
    try:
        with tempfile.TemporaryFile(dir=spill_dir(), prefix="gguf-lens-record-") as f:
            os.posix_fallocate(f.fileno(), 0, nbytes)  # the blocks reserved now: a full disk is an OSError, not SIGBUS
            out = np.memmap(f, dtype=x.dtype, mode="r+", shape=tuple(shape))
    except (OSError, ValueError, AttributeError):  # no space, no folder, no posix_fallocate: x stays in memory
        return x
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(0, x.shape[axis])
    out[tuple(idx)] = x
    return out


def _for_heads(run: Run) -> Run:
    """The run as the heads read it after the job: the model's Shape (the model is closed), the hidden states and
    routing gone, the recorded queries and the cache's keys and values in scratch files (pages.spill: mapped
    read-only, resident only while a head is read)."""
    rec, cache, folder = run.recorder, run.cache, spill_dir()
    rec.hidden.clear()
    rec.routing.clear()
    spilled: dict[int, np.ndarray] = {}  # by id: a layer that reads another's rows keeps reading the same array

    def out(x: np.ndarray) -> np.ndarray:
        if isinstance(x, np.memmap):  # in its scratch file already (to_scratch): read-only from now on
            x.flags.writeable = False
            return x
        if id(x) not in spilled:
            spilled[id(x)] = pages.spill(np.ascontiguousarray(x), folder)
        return spilled[id(x)]

    rec.q = {i: out(x) for i, x in rec.q.items()}
    rec.recurrent = {i: {k: out(x) for k, x in r.items()} for i, r in rec.recurrent.items()}
    cache.k, cache.v = [out(x) for x in cache.k], [out(x) for x in cache.v]
    return Run(Shape(run.model.args, str(run.model.path)), rec, cache)


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
    """Run A and B on the text; yields progress, the CompareRecord, then the HeadPair of opts.layer/head. The models
    are closed when the job ends, however it ends (the heads stay readable: LastRun)."""
    t0 = time.perf_counter()
    phase = [0.0, 0.1]  # (start, width) of the current phase in the overall fraction

    def say(what: str, frac: float) -> None:
        emit(TaskProgress("compare", what, phase[0] + phase[1] * min(1.0, frac)))

    ws.use(path)
    ws.last = None
    try:
        with early_paths():
            yield TaskProgress("compare", "preparing A", 0.0)
            record = yield from _compare(ws, path, opts, spec, cancel, say, phase, t0)
            yield head_pair(ws, opts.layer, opts.head)
    finally:
        ws.release()
    return record


def _compare(ws: CompareWorkspace, path: str, opts: CompareOptions, spec: OverrideSpec | None, cancel: threading.Event,
             say: Say, phase: list[float], t0: float) -> Iterator[object]:
    """compare_job's comparison: both models prepared and run, the record yielded (and returned), LastRun kept."""
    from engine.quality.compare import Comparison, compare_routing, layer_divergence  # noqa: PLC0415
    from engine.quality.layer_damage import own_layer_divergence  # noqa: PLC0415

    a = ws.model_a(say)
    ids = encode(a, opts.text, opts.max_tokens)
    phase[:] = [0.1, 0.3]
    b, b_label, b_bytes, b_bpw = _side(ws, opts, spec, say, cancel)
    phase[:] = [0.4, 0.58]
    # A's run with an F32 cache is the file's reference run: the sweep and the mix search reuse it
    ra, rb, stats, top, ref = run_pair(a, b, ids, (opts.a_cache, opts.b_cache), cancel, say,
                                       reference=opts.a_cache == "F32")
    if ref is not None:
        keep_reference(ref)
    n = len(ids)
    cmp = Comparison(per_layer=layer_divergence(ra.recorder.hidden, rb.recorder.hidden, n),
                     routing=compare_routing(ra.recorder, rb.recorder, int(a.args.n_layers), n), **stats)
    yield TaskProgress("compare", "each layer's own share (B's layer on A's input)", 0.98)
    own = own_layer_divergence(a, b, ids, ra.recorder.hidden, cache_type=opts.b_cache, cancel=cancel)
    a_bytes, a_bpw = tensor_size(a)
    tok = a.tokenizer
    record = make_compare_record(
        cmp, None, None, ids, tok.token_text, top=top,
        labels=(f"{Path(path).name} (file)", b_label), caches=(opts.a_cache, opts.b_cache), sizes=(a_bytes, b_bytes),
        bpws=(a_bpw, b_bpw), n_heads=max_heads(a), elapsed_s=time.perf_counter() - t0, own=own,
        recurrent=getattr(a.net, "mixers", None) or (),
    )
    ws.last = LastRun(_for_heads(ra), _for_heads(rb), list(record.token_texts), opts, spec)
    del ra, rb, top, stats
    yield record
    return record


def last_models(ws: CompareWorkspace, cancel: threading.Event | None = None) -> tuple[Any, Any]:
    """A and B of the last comparison, loaded again (B made as it was then): the logit lens runs them. The caller
    releases the workspace when done with them."""
    last = ws.last
    if last is None or last.opts is None:
        raise LensError("run a comparison first")
    quiet: Say = lambda what, frac: None  # noqa: E731
    a = ws.model_a(quiet)
    return a, _side(ws, last.opts, last.spec, quiet, cancel or threading.Event())[0]


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
    for run in (last.a, last.b):  # the scratch files' pages just read leave this process again
        recurrent = [x for r in run.recorder.recurrent.values() for x in r.values()]
        for x in (*run.recorder.q.values(), *recurrent, *run.cache.k, *run.cache.v):
            pages.release(x)
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
