"""softmax(QK^T / sqrt(d_k)) V one step at a time, on the numbers a real model computed.

`attention_cell` takes one (layer, head, query position) from a Recorder and the KV cache and returns every
intermediate: the query, each key's dot product with it, the scaling (the model's own scale next to the
textbook 1/sqrt(d_k)), the causal (and sliding-window) mask, the softmax row and the weighted sum of values.
`scaling_stats` measures the argument for sqrt(d_k): raw q.k scores have a variance that grows with d_k,
and without the scaling the softmax collapses toward one key (its entropy drops).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.ops.reference import soft_cap
from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class AttentionCell:
    """Every step of one query row's attention, with the shapes written beside each step."""

    layer: int
    head: int
    kv_head: int  # which KV head this query head reads (GQA)
    group: int  # query heads per KV head
    query_index: int
    d_k: int
    q: F32  # (d_k,)
    keys: F32  # (N, d_k): keys 0..N-1
    values: F32  # (N, d_k)
    dots: F32  # (N,): q . k_j
    scale: float  # the scale the model applies (Gemma's query_pre_attn_scalar, ...)
    textbook_scale: float  # 1 / sqrt(d_k)
    scaled: F32  # (N,): dots * scale
    visible: npt.NDArray[np.bool_]  # (N,): causal (and sliding-window) mask
    masked: F32  # (N,): scaled, -inf where not visible
    weights: F32  # (N,): softmax(masked), sums to 1 (less the sink's share)
    output: F32  # (d_k,): weights @ values
    window: int | None
    sink: float | None = None  # gpt-oss: the head's learned sink logit, in the softmax's sum with no value
    sink_share: float = 0.0  # the share of the row the sink takes

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of each step, for display."""
        return {"q": self.q.shape, "K": self.keys.shape, "q·Kᵀ": self.dots.shape, "softmax": self.weights.shape,
                "V": self.values.shape, "output": self.output.shape}


def softmax_1d(x: np.ndarray) -> np.ndarray:
    finite = np.isfinite(x)
    m = x[finite].max() if finite.any() else 0.0
    e = np.where(finite, np.exp(x - m), 0.0)
    return e / e.sum()


def textbook_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """softmax(q K^T * scale) V for one query (no mask); scale defaults to 1/sqrt(d_k). Returns (weights, output)."""
    q, keys, values = (np.asarray(a, dtype=np.float64) for a in (q, keys, values))
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    w = softmax_1d(keys @ q * s)
    return w, w @ values


def attention_cell(recorder: Recorder, cache: KVCache, layer: int, head: int, query_index: int) -> AttentionCell:
    """One attention cell of a recorded run, step by step (keys 0..N-1 where N = positions recorded)."""
    n = min(recorder.length, cache.length)
    if not (0 <= query_index < n):
        raise IndexError(f"query position {query_index} outside 0..{n - 1}")
    spec = recorder.specs[layer]
    kv = head // spec.group
    q = recorder.q[layer][head, query_index].astype(np.float32)
    keys = cache.keys(layer, n)[kv]
    values = cache.values(layer, n)[kv]
    dots = keys @ q
    capped = dots if spec.softcap is None else soft_cap(dots.astype(np.float32), spec.softcap)  # Gemma 2
    scaled = capped * np.float32(spec.scale)
    j = np.arange(n)
    visible = j <= query_index
    if spec.window is not None:
        visible &= (query_index - j) < spec.window
    masked = np.where(visible, scaled, np.float32(-np.inf)).astype(np.float32)
    sink = None if spec.sinks is None else float(spec.sinks[head])
    if sink is None:
        w = softmax_1d(masked.astype(np.float64)).astype(np.float32)
        share = 0.0
    else:  # the sink joins the row as one more logit and takes its share; its "value" is zero
        both = softmax_1d(np.append(masked.astype(np.float64), sink))
        w, share = both[:-1].astype(np.float32), float(both[-1])
    return AttentionCell(layer, head, kv, spec.group, query_index, q.shape[0], q, keys, values, dots.astype(np.float32),
                         float(spec.scale), 1.0 / math.sqrt(q.shape[0]), scaled.astype(np.float32), visible, masked, w,
                         (w @ values).astype(np.float32), spec.window, sink, share)


@dataclass(frozen=True)
class ScalingStats:
    """The sqrt(d_k) argument measured on one head: score variance and softmax entropy with and without scaling."""

    d_k: int
    n_pairs: int  # visible (query, key) pairs measured
    var_raw: float  # variance of q.k over those pairs
    var_scaled: float  # variance of q.k * scale
    q_var: float  # mean per-component variance of q
    k_var: float  # mean per-component variance of k
    entropy_scaled: float  # mean softmax entropy per row (nats) with the model's scale
    entropy_unscaled: float  # the same with no scaling
    entropy_uniform: float  # mean of log(number of visible keys): the most spread-out a row could be


def _row_entropy(scores: np.ndarray, visible: np.ndarray) -> np.ndarray:
    s = np.where(visible, scores, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.where(visible, np.exp(s - m), 0.0)
    p /= p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(-1)


def scaling_stats(recorder: Recorder, cache: KVCache, layer: int, head: int) -> ScalingStats:
    """Variance of raw and scaled q.k scores, and row entropies with and without the scale, for one head."""
    n = min(recorder.length, cache.length)
    spec = recorder.specs[layer]
    q = recorder.q[layer][head, :n].astype(np.float64)  # (N, d)
    k = cache.keys(layer, n)[head // spec.group].astype(np.float64)  # (N, d)
    raw = q @ k.T  # (N, N)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    visible = j <= i
    if spec.window is not None:
        visible &= (i - j) < spec.window
    vals = raw[visible]
    return ScalingStats(
        d_k=q.shape[1], n_pairs=int(vals.size), var_raw=float(vals.var()), var_scaled=float((vals * spec.scale).var()),
        q_var=float(q.var(0).mean()), k_var=float(k.var(0).mean()),
        entropy_scaled=float(_row_entropy(raw * spec.scale, visible).mean()),
        entropy_unscaled=float(_row_entropy(raw, visible).mean()),
        entropy_uniform=float(np.log(visible.sum(-1)).mean()),
    )
