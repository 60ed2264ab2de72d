"""Attention maps for display: whole layers of heads recomputed at once, pooled to thumbnails, aggregated.

Everything is recomputed from the recorded post-RoPE queries and the keys in the KV cache
(engine/observe/recorder.py), so no layers x heads x N x N tensor is ever stored. Query rows are processed in
chunks so memory stays at about heads x chunk x N floats whatever the context length.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import numpy.typing as npt

from engine.ops.reference import causal_mask, soft_cap

if TYPE_CHECKING:
    from engine.cache import KVCache
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
ROW_CHUNK = 256  # query rows per matmul: bounds the (heads, rows, N) scratch to ~18 MB at N = 2000


def attention_rows(
    recorder: Recorder, cache: KVCache, layer: int, rows: npt.ArrayLike, heads: Sequence[int] | None = None
) -> F32:
    """Softmax attention of query rows `rows` for the heads `heads` (default all): (H, R, N) float32."""
    n = min(recorder.length, cache.length)
    spec = recorder.specs[layer]
    pos = np.atleast_1d(np.asarray(rows, dtype=np.int64))
    q_all = recorder.q[layer]  # (Hq, capacity, d)
    hq = q_all.shape[0]
    heads = list(range(hq)) if heads is None else [int(h) for h in heads]
    # (Hkv, d, N) contiguous: multi-threaded OpenBLAS is ~50x slower on the transposed (N, d) view for these shapes
    kt = np.ascontiguousarray(cache.keys(layer, n).transpose(0, 2, 1))
    g = spec.group
    if heads == list(range(hq)):  # all heads: one 2-D matmul per KV head (grouped-query attention)
        scores = np.empty((hq, len(pos), n), np.float32)
        for kv in range(kt.shape[0]):
            q = q_all[kv * g : (kv + 1) * g, pos].reshape(g * len(pos), -1)  # (G*R, d): heads kv*G + i share kv
            # 2-D matmuls: NumPy's stacked matmul misses BLAS for these shapes and is far slower
            scores[kv * g : (kv + 1) * g] = (q @ kt[kv]).reshape(g, len(pos), n)
    else:
        scores = np.stack([q_all[h, pos] @ kt[h // g] for h in heads])
    if spec.softcap is not None:  # Gemma 2 caps the raw scores before the scale (build_attn_mha)
        scores = soft_cap(scores, spec.softcap)
    scores *= np.float32(spec.scale)
    allowed = causal_mask(pos, n, spec.window)  # (R, N)
    np.putmask(scores, np.broadcast_to(~allowed, scores.shape), np.float32(-np.inf))
    sinks = None if spec.sinks is None else np.asarray(spec.sinks, np.float32)[heads][:, None, None]
    return _softmax_inplace(scores, sinks)


def sink_share(recorder: Recorder, cache: KVCache, layer: int, rows: npt.ArrayLike,
               heads: Sequence[int] | None = None) -> F32 | None:
    """(H, R): the share of each query row's attention that goes to the layer's learned sink (gpt-oss: "attention to
    nothing", one logit per head in every softmax row that carries no value); None where the layer has no sinks."""
    if recorder.specs[layer].sinks is None:
        return None
    w = attention_rows(recorder, cache, layer, rows, heads)
    return np.clip(np.float32(1.0) - w.sum(axis=-1, dtype=np.float64), 0.0, 1.0).astype(np.float32)


def _softmax_inplace(s: F32, sinks: F32 | None = None) -> F32:
    """Softmax over the last axis, in place; every row has at least one finite score (its own key). `sinks`
    (H, 1, 1): one more logit per head in each row's sum, with no column of its own (the row sums to less than 1)."""
    m = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        m = np.maximum(m, sinks)
    np.subtract(s, m, out=s)
    np.exp(s, out=s)
    total = s.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total += np.exp(sinks - m)
    s /= total
    return s


def bin_starts(n: int, bins: int) -> I64:
    """Start index of each of min(n, bins) near-equal bins covering [0, n)."""
    k = max(1, min(n, bins))
    return (np.arange(k, dtype=np.int64) * n) // k


def sample_rows(n: int, max_rows: int | None, bins: int) -> I64:
    """All rows when they fit, else the last row of every bin plus evenly spaced rows up to about max_rows."""
    if max_rows is None or n <= max_rows:
        return np.arange(n, dtype=np.int64)
    starts = bin_starts(n, bins)
    ends = np.append(starts[1:], n) - 1  # the last row of a bin sees the most keys, and the newest row is in
    extra = max(0, max_rows - len(ends))
    even = np.round(np.linspace(0, n - 1, extra)).astype(np.int64) if extra else ends[:0]
    return np.unique(np.concatenate([even, ends]))


def allowed_mask(rows: npt.ArrayLike, n: int, window: int | None) -> npt.NDArray[np.bool_]:
    """(R, n) True where query row may attend key (causal, and within the sliding window)."""
    return causal_mask(np.asarray(rows, dtype=np.int64).reshape(-1), n, window)


def allowed_counts(rows: I64, n: int, window: int | None, col_starts: I64) -> I64:
    """(R, C) how many keys of each column bin each query row may attend (interval overlap, no N-wide mask)."""
    col_ends = np.append(col_starts[1:], n)
    lo = np.zeros_like(rows) if window is None else np.maximum(0, rows - window + 1)
    hi = rows + 1
    return np.maximum(0, np.minimum(hi[:, None], col_ends[None]) - np.maximum(lo[:, None], col_starts[None]))


def pool_rows(x: npt.NDArray, row_bins: I64, n_bins: int, how: str) -> npt.NDArray:
    """Reduce axis -2 of x (..., R, C) by bin id (sorted) to (..., n_bins, C); empty bins are NaN (max) or 0 (sum)."""
    out_shape = x.shape[:-2] + (n_bins, x.shape[-1])
    fill = np.nan if how == "max" else 0.0
    out = np.full(out_shape, fill, dtype=np.float64 if how == "sum" else np.float32)
    if x.shape[-2] == 0:
        return out
    present, first = np.unique(row_bins, return_index=True)
    red = np.maximum if how == "max" else np.add
    out[..., present, :] = red.reduceat(x, first, axis=-2)
    return out


@dataclass(frozen=True)
class AttentionGrid:
    """Pooled maps of every head of some layers: (L, H, T, T) each, plus per-head summaries (L, H)."""

    max_pooled: F32
    mean_pooled: F32
    nosink_pooled: F32  # max-pooled without the hidden keys (key 0, the BOS / attention sink, unless told otherwise)
    nosink_mean: F32  # mean-pooled without the hidden keys (they count as weight 0)
    rows: I64  # query rows computed
    sink: F32
    prev: F32
    self_: F32
    learned_sink: F32 | None = None  # (L, H) mean share taken by the learned sink (gpt-oss); None without sinks


def attention_grid(
    recorder: Recorder,
    cache: KVCache,
    layers: Sequence[int],
    *,
    thumb: int = 32,
    max_rows: int | None = None,
    chunk: int = ROW_CHUNK,
    hidden: Sequence[int] = (0,),
) -> AttentionGrid:
    """Max- and mean-pool every head's (N, N) attention of `layers` to at most thumb x thumb bins.

    The nosink maps leave out the keys `hidden` (the attention sinks a view hides).
    """
    n = min(recorder.length, cache.length)
    t = max(1, min(n, thumb))
    rows = sample_rows(n, max_rows, t)
    row_starts = bin_starts(n, t)
    col_starts = row_starts
    row_bins = np.searchsorted(row_starts, rows, side="right") - 1
    hq = recorder.q[layers[0]].shape[0] if layers else 0
    shape = (len(layers), hq, t, t)
    mx, mean, nosink, nosink_mean = (np.full(shape, np.nan, np.float32) for _ in range(4))
    sink, prev, self_ = (np.zeros(shape[:2], np.float32) for _ in range(3))
    has_sinks = any(recorder.specs[i].sinks is not None for i in layers)
    learned = np.zeros(shape[:2], np.float32) if has_sinks else None
    if n == 0 or not layers:
        return AttentionGrid(mx, mean, nosink, nosink_mean, rows, sink, prev, self_)
    drop = np.array(sorted({int(k) for k in hidden if 0 <= int(k) < n}), np.int64)
    kept = np.ones(n, np.int64)
    kept[drop] = 0
    all_hidden = np.add.reduceat(kept, col_starts) == 0  # (T,) column bins of hidden keys only: drawn as masked
    r_idx = np.arange(len(rows))
    for li, layer in enumerate(layers):
        window = recorder.specs[layer].window
        counts = allowed_counts(rows, n, window, col_starts)  # (R, T)
        cmax = np.empty((hq, len(rows), t), np.float32)
        csum = np.empty((hq, len(rows), t), np.float32)
        cns_max = np.empty((hq, len(rows), t), np.float32)
        cns_sum = np.empty((hq, len(rows), t), np.float32)
        for s in range(0, len(rows), chunk):
            sl = slice(s, s + chunk)
            w = attention_rows(recorder, cache, layer, rows[sl])  # (H, r, N)
            cmax[:, sl] = np.maximum.reduceat(w, col_starts, axis=2)
            csum[:, sl] = np.add.reduceat(w, col_starts, axis=2)
            sink[li] += w[:, :, 0].sum(axis=1)
            if learned is not None:  # what the row's weights leave to 1 went to the learned sink
                learned[li] += (1.0 - w.sum(axis=2, dtype=np.float64)).sum(axis=1).astype(np.float32)
            rr = rows[sl]
            self_[li] += w[:, r_idx[: len(rr)], rr].sum(axis=1)
            has_prev = rr >= 1
            prev[li] += w[:, r_idx[: len(rr)][has_prev], rr[has_prev] - 1].sum(axis=1)
            w[:, :, drop] = 0.0  # the hidden keys, once the full rows have been summarised
            cns_max[:, sl] = np.maximum.reduceat(w, col_starts, axis=2)
            cns_sum[:, sl] = np.add.reduceat(w, col_starts, axis=2)
        bin_allowed = pool_rows(counts.astype(np.float64)[None], row_bins, t, "sum")[0]  # (T, T)
        masked = bin_allowed == 0
        m = pool_rows(cmax, row_bins, t, "max")
        m[:, masked] = np.nan
        mx[li] = m
        mean[li] = np.where(masked, np.nan, pool_rows(csum, row_bins, t, "sum") / np.maximum(bin_allowed, 1))
        ns = pool_rows(cns_max, row_bins, t, "max")
        gone = masked | all_hidden[None, :]
        ns[:, gone] = np.nan
        nosink[li] = ns
        nosink_mean[li] = np.where(gone, np.nan, pool_rows(cns_sum, row_bins, t, "sum") / np.maximum(bin_allowed, 1))
    k = max(1, len(rows))
    n_prev = max(1, int((rows >= 1).sum()))
    return AttentionGrid(mx, mean, nosink, nosink_mean, rows, sink / k, prev / n_prev, self_ / k,
                         None if learned is None else np.clip(learned / k, 0.0, 1.0))


def aggregate_attention(
    recorder: Recorder,
    cache: KVCache,
    layers: Sequence[int],
    head: int | str,
    rows: npt.ArrayLike,
    *,
    layer_how: str = "mean",
    chunk: int = ROW_CHUNK,
) -> F32:
    """(R, N) attention of one head, or its 'mean'/'max' over heads, then 'mean'/'max' over `layers`."""
    n = min(recorder.length, cache.length)
    pos = np.atleast_1d(np.asarray(rows, dtype=np.int64))
    out = np.zeros((len(pos), n), np.float32) if layer_how == "mean" else np.full((len(pos), n), -np.inf, np.float32)
    for layer in layers:
        for s in range(0, len(pos), chunk):
            sl = slice(s, s + chunk)
            if isinstance(head, str):
                w = attention_rows(recorder, cache, layer, pos[sl])  # (H, r, N)
                w = w.mean(axis=0) if head == "mean" else w.max(axis=0)
            else:
                w = attention_rows(recorder, cache, layer, pos[sl], heads=[int(head)])[0]
            if layer_how == "mean":
                out[sl] += w
            else:
                np.maximum(out[sl], w, out=out[sl])
    if layer_how == "mean":
        out /= max(1, len(layers))
    return np.where(np.isfinite(out), out, np.float32(0.0)).astype(np.float32)


def fit_side(
    w: F32, allowed: npt.NDArray[np.bool_], max_rows: int, max_cols: int | None = None
) -> tuple[F32, npt.NDArray[np.bool_], int, int]:
    """Max-pool (R, C) by whole steps until R <= max_rows and C <= max_cols; returns (w, allowed, row_step, col_step)."""
    r, c = w.shape
    rs = max(1, -(-r // max_rows))
    cs = max(1, -(-c // (max_cols or max_rows)))
    if rs == 1 and cs == 1:
        return w, allowed, 1, 1
    ri = np.arange(0, r, rs)
    ci = np.arange(0, c, cs)
    w = np.maximum.reduceat(np.maximum.reduceat(w, ri, axis=0), ci, axis=1)
    allowed = np.logical_or.reduceat(np.logical_or.reduceat(allowed, ri, axis=0), ci, axis=1)
    return w, allowed, rs, cs
