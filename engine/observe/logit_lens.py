"""The logit lens (nostalgebraist 2020): the output head applied to every layer's residual stream.

A decoder writes into one residual stream; its last layer's stream goes through the final norm and the output
matrix (and Gemma 2's final logit soft-cap) to become the logits. Sending each earlier layer's stream through
that same head (the model's own `head`, so the norm, the quantized output product and the cap are exactly the
model's) shows at which layer the token the model finally produces rises to the top.

The residual streams come from a Recorder run with capture_hidden=True (`hidden[i]` is the stream after layer
i); the last layer's lens is, by construction, the model's own logits. Probabilities are the plain softmax of
the logits (temperature 1, no sampling filters).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
Head = Callable[[F32], F32]  # (T, dim) residual stream -> (T, n_vocab) logits, as the model's final head
TOP_K = 5
ROW_CHUNK = 64  # rows per head product: bounds the (chunk, n_vocab) logits to ~134 MB of float64 at a 262k vocabulary


@dataclass(frozen=True)
class LogitLens:
    """Each layer's stream decoded at some positions: the rank and probability of the produced token, and the top k."""

    layers: tuple[int, ...]  # L rows: the stream after layer i
    positions: I64  # (P,) positions decoded
    targets: I64  # (P,) the token produced after each position (the next token; at the last, the model's top 1)
    target_known: npt.NDArray[np.bool_]  # (P,) False where the target is the model's own prediction
    rank: I64  # (L, P) 0 = the target is the layer's top token
    prob: F32  # (L, P) softmax probability of the target
    top_ids: I64  # (L, P, k) the layer's most probable tokens, best first
    top_probs: F32  # (L, P, k)

    def decided_at(self) -> I64:
        """(P,) the first layer from which the target stays the top token through the last layer (-1: never)."""
        top = self.rank == 0  # (L, P)
        stays = np.flip(np.logical_and.accumulate(np.flip(top, 0), axis=0), 0)
        first = np.argmax(stays, axis=0)
        return np.where(stays.any(axis=0), np.asarray(self.layers)[first], -1).astype(np.int64)


def decode_layer(head: Head, x: F32, targets: I64, k: int = TOP_K, chunk: int = ROW_CHUNK) -> tuple[I64, F32, I64, F32]:
    """Streams x (P, dim) through the head: (rank, prob of targets, top k ids, top k probs)."""
    p = x.shape[0]
    rank = np.zeros(p, np.int64)
    prob = np.zeros(p, np.float32)
    top_ids = np.zeros((p, k), np.int64)
    top_probs = np.zeros((p, k), np.float32)
    for s in range(0, p, chunk):
        sl = slice(s, s + chunk)
        logits = np.asarray(head(np.ascontiguousarray(x[sl], dtype=np.float32)), dtype=np.float64)  # (c, V)
        logits -= logits.max(axis=1, keepdims=True)
        e = np.exp(logits)
        e /= e.sum(axis=1, keepdims=True)
        t = targets[sl]
        pt = e[np.arange(len(t)), t]
        prob[sl] = pt
        rank[sl] = (e > pt[:, None]).sum(axis=1)  # ties rank the target first, as argmax's first index would
        kk = min(k, e.shape[1])
        part = np.argpartition(-e, kk - 1, axis=1)[:, :kk]
        order = np.argsort(-np.take_along_axis(e, part, 1), axis=1, kind="stable")
        ids = np.take_along_axis(part, order, 1)
        top_ids[sl, :kk] = ids
        top_probs[sl, :kk] = np.take_along_axis(e, ids, 1)
    return rank, prob, top_ids, top_probs


def logit_lens(
    head: Head,
    hidden: Mapping[int, F32],
    tokens: Sequence[int],
    positions: Sequence[int],
    final_logits: F32 | None = None,
    k: int = TOP_K,
) -> LogitLens:
    """Decode the streams `hidden[layer]` (N, dim) at `positions` through `head`.

    The target of position i is tokens[i + 1]; past the end, the top token of `final_logits` (the model's
    logits at the last position), else of the last layer's own decoding.
    """
    layers = tuple(sorted(hidden))
    pos = np.asarray(list(positions), dtype=np.int64)
    n = len(tokens)
    known = pos + 1 < n
    targets = np.where(known, np.asarray(list(tokens) + [0], np.int64)[np.minimum(pos + 1, n)], 0)
    if (~known).any():
        if final_logits is None:
            last = np.asarray(head(np.ascontiguousarray(hidden[layers[-1]][pos[~known]], dtype=np.float32)))
        else:
            last = np.asarray(final_logits, np.float32).reshape(-1, np.asarray(final_logits).shape[-1])[-1:]
            last = np.repeat(last, int((~known).sum()), axis=0)
        targets[~known] = last.argmax(axis=1)
    shape = (len(layers), len(pos))
    x = np.concatenate([hidden[layer][pos] for layer in layers])  # (L*P, dim): one pass through the head
    rank, prob, top_ids, top_probs = decode_layer(head, x, np.tile(targets, len(layers)), k)
    rank, prob = rank.reshape(shape), prob.reshape(shape)
    top_ids, top_probs = top_ids.reshape(shape + (k,)), top_probs.reshape(shape + (k,))
    return LogitLens(layers, pos, targets, known, rank, prob, top_ids, top_probs)


def window_positions(n: int, selected: int, width: int) -> I64:
    """At most `width` positions ending at the selected one (and starting at 0 when that fits)."""
    selected = int(np.clip(selected, 0, max(0, n - 1)))
    lo = max(0, selected - width + 1)
    return np.arange(lo, min(n, max(selected + 1, lo + width)), dtype=np.int64)
