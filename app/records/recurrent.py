"""Records of a hybrid's recurrent (gated DeltaNet) layers: one value head's reads up close, and the State view.

A recurrent layer has no softmax: each token's output is o_t = sum_s W[t, s] v_s + (the earlier context's part,
carried by the state), W exact and signed (engine.observe.recurrent). The lenses draw |W| as shares of the row
(engine.observe.recurrent_maps.LayerReads), in the same HeadRecord an attention head fills, with the signed W and
the earlier context's share beside them. The State view draws what each token wrote (beta) and kept (exp(g)) per
value head, and what the state costs: a constant number of bytes per layer, next to the attention layers' KV rows
that grow with every token. Made on the worker; what crosses to the GUI is numpy arrays and plain values.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from app.records.head import HeadRecord
from engine.observe import attention_maps as amaps
from engine.observe.recurrent_maps import LayerReads, ReadsMemo, layer_reads, recurrent_layers, write_keep

if TYPE_CHECKING:
    from engine.cache import KVCache
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
RECURRENT_KIND = "recurrent"


def reads_of(recorder: Recorder, layer: int, memo: ReadsMemo | None = None) -> LayerReads | None:
    """A recurrent layer's reads of the recording as it is now (from the memo when it has them)."""
    return memo.get(recorder, layer) if memo is not None else layer_reads(recorder, layer)


def make_reads_head_record(
    recorder: Recorder,
    cache: KVCache,
    layer: int,
    head: int | str,
    rows: slice | None,
    token_texts: list[str],
    *,
    memo: ReadsMemo | None = None,
    max_rows: int = 1024,
    max_cols: int = 4096,
) -> HeadRecord | None:
    """One value head's reads (or 'mean'/'max' over the layer's value heads) for query rows `rows`, as a HeadRecord
    (kind 'recurrent'): weights are the heatmap shares, `signed` the exact W, `earlier` the earlier context's share."""
    t0 = time.perf_counter()
    reads = reads_of(recorder, layer, memo)
    if reads is None:
        return None
    n = min(recorder.length, cache.length)
    start, stop, _ = (rows or slice(None)).indices(n)
    stop = max(stop, start)
    pos = np.arange(start, stop)
    one = not isinstance(head, str)
    h = int(np.clip(int(head), 0, reads.n_heads - 1)) if one else None
    inside = (pos >= reads.start) & (pos < reads.stop)  # at most the window's rows: the others stay masked
    got = pos[inside]
    w = np.zeros((len(pos), stop), np.float32)
    e = np.full(len(pos), np.nan, np.float32)
    s: np.ndarray | None = None
    if one:
        shares, signed, early = reads.full_rows(got, stop, [h])  # (1, R', stop)
        w[inside], e[inside] = shares[0], early[0]
        s = np.zeros((len(pos), stop), np.float32)
        s[inside] = signed[0]  # type: ignore[index]
    elif got.size:  # 'mean' / 'max' of the value heads, one head at a time (never H x R x N at once)
        acc = np.zeros((len(got), stop), np.float64 if head == "mean" else np.float32)
        early_sum = np.zeros(len(got), np.float64)
        for hh in range(reads.n_heads):
            shares, _signed, early = reads.full_rows(got, stop, [hh], with_signed=False)
            if head == "mean":
                acc += shares[0]
            else:
                np.maximum(acc, shares[0], out=acc)
            early_sum += early[0]
        w[inside] = acc / reads.n_heads if head == "mean" else acc
        e[inside] = early_sum / reads.n_heads
    cols = np.arange(stop)
    allowed = inside[:, None] & (cols[None, :] >= reads.start) & (cols[None, :] <= pos[:, None])
    w = np.where(allowed, np.nan_to_num(w), 0.0).astype(np.float32)
    w, allowed_fit, row_step, col_step = amaps.fit_side(w, allowed, max_rows, max_cols)
    if row_step > 1 or col_step > 1:  # pooled: the signed weights of one cell are no longer one number
        s = None
        e = np.fmax.reduceat(e, np.arange(0, len(e), row_step)) if len(e) else e
    kh = reads.key_head(h) if h is not None else None
    group = tuple(x for x in range(reads.n_heads) if kh is not None and reads.key_head(x) == kh)
    return HeadRecord(
        layer=int(layer), head=h if h is not None else str(head), weights=w, allowed=allowed_fit,
        row_start=start, row_stop=stop, row_step=row_step, col_step=col_step, n_tokens=n, window=None,
        kv_head=kh, group_heads=group, token_texts=tuple(token_texts[:n]), elapsed_s=time.perf_counter() - t0,
        kind=RECURRENT_KIND, signed=None if s is None else np.asarray(s, np.float32),
        earlier=np.asarray(e, np.float32), read_start=reads.start, n_key_heads=reads.n_key_heads,
    )


@dataclass(frozen=True)
class StateRecord:
    """What a hybrid's recurrent layers keep: per token and value head, how much it wrote and kept, and the bytes."""

    layers: tuple[int, ...]  # the recurrent layers, in order
    wrote: F32  # (layers, N, value heads) beta: how strongly each token wrote into the state
    kept: F32  # (layers, N, value heads) exp(g): the share of the state each token kept (1 - forgot)
    token_texts: tuple[str, ...]
    n_tokens: int
    n_layers: int  # the model's layers, all kinds
    n_key_heads: int
    state_size: int  # S: each value head keeps an S x S matrix
    matrix_bytes: int  # one layer's delta-rule matrices (value heads x S x S float32)
    conv_bytes: int  # one layer's convolution inputs ((kernel - 1) x channels float32)
    attention_layers: tuple[int, ...]
    kv_bytes: int  # the attention layers' KV rows for the N tokens now
    kv_per_token: int  # what one more token adds to them
    n_ctx: int
    cache_type: str
    elapsed_s: float

    @property
    def state_bytes(self) -> int:
        """One recurrent layer's state."""
        return self.matrix_bytes + self.conv_bytes

    @property
    def state_total(self) -> int:
        return self.state_bytes * len(self.layers)

    @property
    def n_heads(self) -> int:
        return int(self.wrote.shape[2]) if self.wrote.ndim == 3 else 0

    def kv_at(self, n_tokens: int) -> int:
        """The attention layers' KV rows at n_tokens (linear in it)."""
        return self.kv_per_token * int(n_tokens)

    def half_life(self, layer_index: int) -> F32:
        """(value heads,) tokens after which half of what a head's state holds is left, from its mean log decay over
        the conversation (inf: it forgets nothing)."""
        kept = np.clip(self.kept[layer_index].astype(np.float64), 1e-30, 1.0)
        g = np.log(kept).mean(axis=0) if kept.shape[0] else np.zeros(kept.shape[1])
        with np.errstate(divide="ignore"):
            return np.where(g < 0, np.log(0.5) / np.where(g < 0, g, -1.0), np.inf).astype(np.float32)

    def token(self, i: int) -> str:
        return self.token_texts[i] if 0 <= i < len(self.token_texts) else "?"


def make_state_record(model: Any, recorder: Recorder, cache: KVCache, token_texts: list[str]) -> StateRecord | None:
    """The State view's record of the recording as it is now (None: no recurrent layer recorded)."""
    t0 = time.perf_counter()
    layers = recurrent_layers(recorder)
    if not layers:
        return None
    n = min(recorder.length, cache.length)
    got = [write_keep(recorder, i) for i in layers]
    wrote = np.stack([b[:n] for b, _k in got]).astype(np.float32)  # type: ignore[index]
    kept = np.stack([k[:n] for _b, k in got]).astype(np.float32)  # type: ignore[index]
    states = getattr(cache, "states", {}) or {}
    first = states.get(layers[0])
    shape = getattr(cache, "shape", None)
    if first is not None:
        matrix, conv = int(first.ssm.nbytes), int(first.conv.nbytes)
    elif shape is not None:
        matrix, conv = 4 * shape.heads * shape.size * shape.size, 4 * shape.conv_rows * shape.channels
    else:
        matrix = conv = 0
    kv_layers = tuple(sorted(getattr(cache, "kv_layers", ()) or ()))
    size = int(shape.size) if shape is not None else int(recorder.recurrent[layers[0]]["v"].shape[-1])
    n_key = int(recorder.recurrent[layers[0]]["k"].shape[1])
    return StateRecord(
        layers=tuple(layers), wrote=wrote, kept=kept, token_texts=tuple(token_texts[:n]), n_tokens=n,
        n_layers=int(getattr(cache, "n_layers", len(layers))), n_key_heads=n_key, state_size=size, matrix_bytes=matrix,
        conv_bytes=conv, attention_layers=kv_layers, kv_bytes=int(cache.bytes_for(n)),
        kv_per_token=int(cache.bytes_for(1)), n_ctx=int(cache.n_ctx), cache_type=str(getattr(cache, "cache_type", "F32")),
        elapsed_s=time.perf_counter() - t0,
    )
