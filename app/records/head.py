"""HeadRecord: what the large heatmap of one head draws (attention rows, or a recurrent head's read shares), on its
own so that both kinds of record (app.records.attention, app.records.recurrent) build it without importing each other.
No Qt."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]


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
    kind: str = "attention"  # 'recurrent': a gated DeltaNet head's reads (weights: shares of |W|; app.records.recurrent)
    signed: F32 | None = None  # recurrent, one head, not pooled: (R, C) W[t, s] itself, signed
    earlier: F32 | None = None  # recurrent: (R,) each row's share read from the earlier context (through the state)
    read_start: int = 0  # recurrent: the first key decomposed (earlier keys are the earlier context)
    n_key_heads: int = 0  # recurrent: the layer's key heads (kv_head is the key head this value head reads)

    @property
    def n_rows(self) -> int:
        return self.row_stop - self.row_start

    @property
    def recurrent(self) -> bool:
        return self.kind == "recurrent"
