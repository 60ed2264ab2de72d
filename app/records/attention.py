"""Attention records: the layers x heads grid, one head (or an aggregate) up close, and one cell step by step.

Made on the worker from the Recorder and KV cache (engine.observe.attention_maps and attention_steps do the
math); what crosses to the GUI are frozen records of numpy arrays and plain values, the step records holding
the engine's frozen AttentionCell and ScalingStats, plus token labels.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from engine.observe import attention_maps as amaps
from engine.observe.attention_steps import AttentionCell, ScalingStats, attention_cell, scaling_stats

if TYPE_CHECKING:
    from engine.cache import KVCache
    from engine.model import Model
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
Aggregate = Literal["mean", "max"]
STATS_MAX_TOKENS = 1024  # the sqrt(d_k) statistics build an N x N score matrix: past this, the first N positions


@dataclass(frozen=True)
class AttentionRecord:
    """The layers x heads grid of small pooled attention maps (BertViz's model view)."""

    n_tokens: int
    n_layers: int
    n_heads: int
    thumbs: F32  # (L, H, T, T) max-pooled weights; NaN where every cell of the bin is masked
    thumbs_mean: F32  # (L, H, T, T) mean-pooled weights, same mask
    thumbs_nosink: F32  # (L, H, T, T) max-pooled without the hidden keys (key 0, the BOS / sink, by default)
    thumbs_nosink_mean: F32  # (L, H, T, T) mean-pooled without them
    rows: npt.NDArray[np.int64]  # the query rows that were computed (all of them when `full`)
    full: bool  # every query row computed (else a strided sample that always has the last row)
    sink: F32  # (L, H) mean weight on key 0 over the computed rows
    prev: F32  # (L, H) mean weight on the previous token
    self_: F32  # (L, H) mean weight on the query's own position
    token_texts: tuple[str, ...]
    elapsed_s: float
    hidden_keys: tuple[int, ...] = (0,)  # the keys the nosink maps leave out
    learned_sink: F32 | None = None  # (L, H) mean share of attention to the learned sink (gpt-oss), else None


def make_attention_record(
    model: Model,
    recorder: Recorder,
    cache: KVCache,
    token_texts: list[str],
    *,
    thumb: int = 32,
    max_rows: int | None = None,
    hidden_keys: tuple[int, ...] = (0,),
) -> AttentionRecord:
    """Pool every head's attention to thumb x thumb; max_rows caps the query rows computed (None = all)."""
    t0 = time.perf_counter()
    n = min(recorder.length, cache.length)
    layers = sorted(recorder.specs)
    g = amaps.attention_grid(recorder, cache, layers, thumb=thumb, max_rows=max_rows, hidden=hidden_keys)
    return AttentionRecord(
        n_tokens=n,
        n_layers=len(layers),
        n_heads=g.max_pooled.shape[1] if g.max_pooled.ndim == 4 else model.args.n_heads,
        thumbs=g.max_pooled,
        thumbs_mean=g.mean_pooled,
        thumbs_nosink=g.nosink_pooled,
        thumbs_nosink_mean=g.nosink_mean,
        rows=g.rows,
        full=g.rows.size == n,
        sink=g.sink,
        prev=g.prev,
        self_=g.self_,
        token_texts=tuple(token_texts[:n]),
        elapsed_s=time.perf_counter() - t0,
        hidden_keys=tuple(int(k) for k in hidden_keys),
        learned_sink=g.learned_sink,
    )


@dataclass(frozen=True)
class HeadRecord:
    """One head's attention (or an aggregate over heads and/or layers) for a window of query rows."""

    layer: int | str  # layer index, or 'mean' / 'max' over all layers
    head: int | str  # query head index, or 'mean' / 'max' over the heads
    weights: F32  # (R, C) attention of query rows [row_start, row_stop) to keys [0, row_stop) (later keys are all masked)
    allowed: npt.NDArray[np.bool_]  # (R, C) True where the causal (and window) mask lets the query see the key
    row_start: int
    row_stop: int
    row_step: int  # > 1 when rows were max-pooled to fit max_rows
    col_step: int
    n_tokens: int
    window: int | None  # sliding window of the layer (None = full attention)
    kv_head: int | None  # the KV head a single query head reads
    group_heads: tuple[int, ...]  # query heads sharing that KV head
    token_texts: tuple[str, ...]  # all N token texts (labels are picked by the view)
    elapsed_s: float
    sink_share: float | None = None  # gpt-oss: the mean share of these rows' attention that went to the learned sink

    @property
    def n_rows(self) -> int:
        return self.row_stop - self.row_start


def make_head_record(
    model: Model,
    recorder: Recorder,
    cache: KVCache,
    layer: int | Aggregate,
    head: int | Aggregate,
    rows: slice | None,
    token_texts: list[str],
    *,
    max_rows: int = 1024,
    max_cols: int = 4096,
) -> HeadRecord:
    """Attention of one head or an aggregate ('mean'/'max') across heads and/or layers for query rows `rows`.

    Keys stop at the last query row (causal); sides longer than max_rows / max_cols are max-pooled.
    """
    t0 = time.perf_counter()
    n = min(recorder.length, cache.length)
    start, stop, _ = (rows or slice(None)).indices(n)
    stop = max(stop, start)
    layers = sorted(recorder.specs) if isinstance(layer, str) else [int(layer)]
    how = layer if isinstance(layer, str) else "mean"
    w = amaps.aggregate_attention(recorder, cache, layers, head, np.arange(start, stop), layer_how=how)[:, :stop]
    windows = {recorder.specs[i].window for i in layers}
    window = windows.pop() if len(windows) == 1 else None
    allowed = amaps.allowed_mask(np.arange(start, stop), stop, window if len(layers) == 1 else None)
    share = None  # with learned sinks the rows sum to less than 1: the rest went to "nothing"
    if stop > start and any(recorder.specs[i].sinks is not None for i in layers):
        share = float(np.clip(1.0 - w.sum(axis=-1, dtype=np.float64).mean(), 0.0, 1.0))
    w, allowed, row_step, col_step = amaps.fit_side(w, allowed, max_rows, max_cols)
    group = recorder.specs[layers[0]].group if layers else 1
    kv = int(head) // group if not isinstance(head, str) else None
    return HeadRecord(
        layer=layer if isinstance(layer, str) else int(layer),
        head=head if isinstance(head, str) else int(head),
        weights=w,
        allowed=allowed,
        row_start=start,
        row_stop=stop,
        row_step=row_step,
        col_step=col_step,
        n_tokens=n,
        window=window if len(layers) == 1 else None,
        kv_head=kv,
        group_heads=tuple(range(kv * group, (kv + 1) * group)) if kv is not None else (),
        token_texts=tuple(token_texts[:n]),
        elapsed_s=time.perf_counter() - t0,
        sink_share=share,
    )


@dataclass(frozen=True)
class StepRecord:
    """softmax(q Kᵀ · scale) V for one (layer, head, query token), and the sqrt(d_k) argument for that head."""

    cell: AttentionCell
    stats: ScalingStats
    stats_tokens: int  # positions the statistics measured (all of them, or the first STATS_MAX_TOKENS)
    n_tokens: int  # positions recorded
    n_heads: int
    n_kv_heads: int
    token_texts: tuple[str, ...]
    cache_type: str  # the KV cache's type: keys and values were read back from it (F16 / Q8_0 / Q4_0 round)
    elapsed_s: float

    @property
    def group_heads(self) -> tuple[int, ...]:
        """The query heads that share this head's KV head."""
        c = self.cell
        return tuple(range(c.kv_head * c.group, (c.kv_head + 1) * c.group))

    def token(self, j: int) -> str:
        return self.token_texts[j] if 0 <= j < len(self.token_texts) else "?"

    def top_keys(self, k: int = 6) -> list[int]:
        """The visible keys with the largest softmax weights, largest first."""
        w = np.where(self.cell.visible, self.cell.weights, -1.0)
        order = np.argsort(-w, kind="stable")[: max(0, min(k, int(self.cell.visible.sum())))]
        return [int(j) for j in order]


class _Prefix:
    """The first n positions of a Recorder and KV cache, for statistics whose cost grows as N²."""

    def __init__(self, recorder: Recorder, cache: KVCache, n: int):
        self.length = n
        self.specs = recorder.specs
        self.q = recorder.q
        self._cache = cache

    def keys(self, layer: int, n: int | None = None) -> np.ndarray:
        return self._cache.keys(layer, min(self.length, n if n is not None else self.length))


def make_step_record(
    model: Any,
    recorder: Recorder,
    cache: KVCache,
    token_texts: list[str],
    layer: int,
    head: int,
    query: int | None,
    *,
    stats_max_tokens: int = STATS_MAX_TOKENS,
) -> StepRecord | None:
    """Step through (layer, head, query); query None or past the end means the last token. None if nothing ran."""
    t0 = time.perf_counter()
    n = min(recorder.length, cache.length)
    if n == 0 or layer not in recorder.specs or layer not in recorder.q:
        return None
    n_heads = int(recorder.q[layer].shape[0])
    layer, head = int(layer), int(np.clip(head, 0, n_heads - 1))
    q_index = n - 1 if query is None else int(np.clip(query, 0, n - 1))
    cell = attention_cell(recorder, cache, layer, head, q_index)
    m = min(n, stats_max_tokens)
    if m < n:
        prefix = _Prefix(recorder, cache, m)
        stats = scaling_stats(prefix, prefix, layer, head)  # type: ignore[arg-type] - duck-typed Recorder / KVCache
    else:
        stats = scaling_stats(recorder, cache, layer, head)
    return StepRecord(
        cell=cell, stats=stats, stats_tokens=m, n_tokens=n, n_heads=n_heads, n_kv_heads=int(cache.n_kv_heads),
        token_texts=tuple(token_texts[:n]), cache_type=str(getattr(cache, "cache_type", "F32")),
        elapsed_s=time.perf_counter() - t0,
    )


def describe_scale(cell: AttentionCell) -> str:
    """How the scores are scaled: the textbook 1/sqrt(d_k) and, when it differs, the model's own scale."""
    root = cell.d_k**0.5
    text = f"÷ √d_k = ÷ √{cell.d_k} = ÷ {root:.4g} (× {cell.textbook_scale:.6g})"
    if np.isclose(cell.scale, cell.textbook_scale, rtol=1e-5):
        return text + ", as the model does"
    return f"× {cell.scale:.6g} (= ÷ {1 / cell.scale:.4g}): the model's own, where the textbook has {text}"
