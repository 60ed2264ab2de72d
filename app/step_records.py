"""StepRecord: one attention cell taken apart step by step, with the sqrt(d_k) statistics of its head.

Made on the worker from the Recorder and KV cache (engine.observe.attention_steps does the math); what crosses to
the GUI is the engine's frozen AttentionCell and ScalingStats (numpy arrays and plain values) plus labels.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.observe.attention_steps import AttentionCell, ScalingStats, attention_cell, scaling_stats

if TYPE_CHECKING:
    from engine.cache import KVCache
    from engine.observe.recorder import Recorder

STATS_MAX_TOKENS = 1024  # the sqrt(d_k) statistics build an N x N score matrix: past this, the first N positions


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
