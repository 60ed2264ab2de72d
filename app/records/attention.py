"""Attention records: the layers x heads grid, one head (or an aggregate) up close, and one cell step by step.

Made on the worker from the Recorder and KV cache (engine.observe.attention_maps and attention_steps do the
math); what crosses to the GUI are frozen records of numpy arrays and plain values, the step records holding
the engine's frozen AttentionCell and ScalingStats, plus token labels.

A hybrid (Qwen3.5: gated DeltaNet layers between attention layers) puts its recurrent layers in the same grid:
their rows hold each value head's read map (engine.observe.recurrent_maps, the exact decomposition of what each
token's output takes from every earlier value), pooled the same way; `layers` names the model layer of every
row, `recurrent` marks the recurrent rows and `heads` says how many heads each row has (value heads and
attention heads may differ: the grid is as wide as the widest row). A head of a recurrent layer comes as a
HeadRecord of kind 'recurrent' (app.records.recurrent).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from engine.observe import attention_maps as amaps
from engine.observe.attention_steps import AttentionCell, ScalingStats, attention_cell, scaling_stats
from app.records.head import HeadRecord
from app.records.recurrent import make_reads_head_record
from engine.observe.recurrent_maps import ReadsMemo, reads_grid, recurrent_layers

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
    layers: tuple[int, ...] = ()  # the model layer of each row (empty: rows are layers 0..n_layers-1)
    recurrent: tuple[bool, ...] = ()  # per row: a recurrent (gated DeltaNet) layer's read maps, not attention
    heads: tuple[int, ...] = ()  # per row: its heads (value heads of a recurrent row); empty: n_heads each
    earlier: F32 | None = None  # (L, H) a recurrent head's mean share read from the earlier context; NaN elsewhere
    read_start: int = 0  # the first position the recurrent maps decompose (earlier ones: "earlier context")

    def layer_of(self, row: int) -> int:
        """The model layer drawn in grid row `row`."""
        return self.layers[row] if self.layers else int(row)

    def row_of(self, layer: int) -> int | None:
        """The grid row of model layer `layer` (None: not in the grid)."""
        if not self.layers:
            return int(layer) if 0 <= int(layer) < self.n_layers else None
        return self.layers.index(int(layer)) if int(layer) in self.layers else None

    def is_recurrent(self, row: int) -> bool:
        return bool(self.recurrent[row]) if self.recurrent else False

    def heads_in(self, row: int) -> int:
        return self.heads[row] if self.heads else self.n_heads

    @property
    def hybrid(self) -> bool:
        return any(self.recurrent)


def make_attention_record(
    model: Model,
    recorder: Recorder,
    cache: KVCache,
    token_texts: list[str],
    *,
    thumb: int = 32,
    max_rows: int | None = None,
    hidden_keys: tuple[int, ...] = (0,),
    reads_memo: ReadsMemo | None = None,
) -> AttentionRecord:
    """Pool every head's attention to thumb x thumb; max_rows caps the query rows computed (None = all). A hybrid's
    recurrent layers get rows of read maps (their reads decomposed once per recording with `reads_memo`)."""
    t0 = time.perf_counter()
    n = min(recorder.length, cache.length)
    attn = sorted(recorder.specs)
    rec_layers = recurrent_layers(recorder)
    g = amaps.attention_grid(recorder, cache, attn, thumb=thumb, max_rows=max_rows, hidden=hidden_keys)
    if not rec_layers:
        return AttentionRecord(
            n_tokens=n,
            n_layers=len(attn),
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
            layers=tuple(attn),
            recurrent=(False,) * len(attn),
            heads=(int(g.max_pooled.shape[1]),) * len(attn),
        )
    memo = reads_memo if reads_memo is not None else ReadsMemo()
    reads = [memo.get(recorder, i) for i in rec_layers]
    found = [(i, r) for i, r in zip(rec_layers, reads) if r is not None]
    r = reads_grid([x for _i, x in found], n, thumb=thumb, max_rows=max_rows, hidden=hidden_keys)
    return _merged(g, r, attn, [i for i, _x in found], n, token_texts, hidden_keys, t0)


def _merged(g: amaps.AttentionGrid, r: Any, attn: list[int], rec_layers: list[int], n: int, token_texts: list[str],
            hidden_keys: tuple[int, ...], t0: float) -> AttentionRecord:
    """One record of the attention grid `g` (layers `attn`) and the recurrent read grid `r` (layers `rec_layers`),
    rows in model-layer order, as wide as the widest (missing heads NaN)."""
    layers = sorted(attn + rec_layers)
    h_att = int(g.max_pooled.shape[1]) if attn else 0
    h_rec = int(r.max_pooled.shape[1])
    width = max(h_att, h_rec)
    t = int(r.max_pooled.shape[2]) if rec_layers else int(g.max_pooled.shape[2])
    maps = {k: np.full((len(layers), width, t, t), np.nan, np.float32) for k in ("mx", "mean", "ns", "nsm")}
    stats = {k: np.full((len(layers), width), np.nan, np.float32) for k in ("sink", "prev", "self", "earlier")}
    learned = None if g.learned_sink is None else np.full((len(layers), width), np.nan, np.float32)
    for src, names, h in ((g, attn, h_att), (r, rec_layers, h_rec)):
        for li, layer in enumerate(names):
            row = layers.index(layer)
            for key, arr in (("mx", src.max_pooled), ("mean", src.mean_pooled), ("ns", src.nosink_pooled),
                             ("nsm", src.nosink_mean)):
                maps[key][row, :h] = arr[li]
            for key, arr in (("sink", src.sink), ("prev", src.prev), ("self", src.self_)):
                stats[key][row, :h] = arr[li]
            if src is r:
                stats["earlier"][row, :h] = r.earlier[li]
            elif learned is not None and g.learned_sink is not None:
                learned[row, :h] = g.learned_sink[li]
    rows = r.rows
    return AttentionRecord(
        n_tokens=n, n_layers=len(layers), n_heads=width, thumbs=maps["mx"], thumbs_mean=maps["mean"],
        thumbs_nosink=maps["ns"], thumbs_nosink_mean=maps["nsm"], rows=rows, full=rows.size == n,
        sink=stats["sink"], prev=stats["prev"], self_=stats["self"], token_texts=tuple(token_texts[:n]),
        elapsed_s=time.perf_counter() - t0, hidden_keys=tuple(int(k) for k in hidden_keys), learned_sink=learned,
        layers=tuple(layers), recurrent=tuple(i in rec_layers for i in layers),
        heads=tuple(h_rec if i in rec_layers else h_att for i in layers), earlier=stats["earlier"],
        read_start=int(r.start),
    )


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
    reads_memo: ReadsMemo | None = None,
) -> HeadRecord | None:
    """Attention of one head or an aggregate ('mean'/'max') across heads and/or layers for query rows `rows`.

    Keys stop at the last query row (causal); sides longer than max_rows / max_cols are max-pooled. A recurrent
    layer of a hybrid gives its value head's reads (app.records.recurrent); 'mean'/'max' of layers go over the
    attention layers only. None: nothing recorded (or no attention layer to aggregate).
    """
    t0 = time.perf_counter()
    n = min(recorder.length, cache.length)
    start, stop, _ = (rows or slice(None)).indices(n)
    stop = max(stop, start)
    if not isinstance(layer, str) and int(layer) not in recorder.specs:
        if int(layer) in recorder.recurrent:
            return make_reads_head_record(recorder, cache, int(layer), head, rows, token_texts, memo=reads_memo,
                                          max_rows=max_rows, max_cols=max_cols)
        return None
    if isinstance(layer, str) and not recorder.specs:  # only recurrent layers: no attention to aggregate
        return None
    if not isinstance(head, str):
        head = int(np.clip(int(head), 0, recorder.q[sorted(recorder.specs)[0] if isinstance(layer, str)
                                                      else int(layer)].shape[0] - 1))
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
