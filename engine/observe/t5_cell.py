"""One cross-attention cell of an encoder-decoder model (T5), step by step: the query from the decoder, the keys and
values from the encoder output, the scores, the softmax and the output, as the numerics computed them.

For output position p, decoder layer l and head h: q (d,) is row p of layer l's cross-attention query product (its
input is the decoder's residual stream at p, normed), K and V (Te, d) are that layer's keys and values of the encoder
output (computed once per encoding), the scores are q·Kᵀ (T5 scales nothing and adds no position bias across), the
weights their softmax, and the output Σ w·V, the head's part of what the cross-attention adds back.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.models.seq2seq import EncoderDecoderModel

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class CrossCell:
    """softmax(q Kᵀ) V for one (decoder layer, head, output position) over the encoder's tokens."""

    layer: int
    head: int
    query: int  # the decoder position
    kv_head: int
    q: F32  # (d,)
    keys: F32  # (Te, d)
    values: F32  # (Te, d)
    scores: F32  # (Te,) q·k, float32
    weights: F32  # (Te,) the softmax the model used
    out: F32  # (d,) the weighted sum of the values

    @property
    def d(self) -> int:
        return int(self.q.shape[0])


class _Capture:
    """A product that keeps what it returns (the cross-attention's query rows), then gives it back unchanged."""

    def __init__(self, inner: Any):
        self.inner, self.rows = inner, None

    def __call__(self, x: Any) -> Any:
        self.rows = self.inner(x)
        return self.rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def cross_cell(net: EncoderDecoderModel, enc_ids: Sequence[int], dec_ids: Sequence[int], layer: int, head: int,
               query: int) -> CrossCell:
    """Run the encoding and the decoder tokens on a cache of their own and take cell (layer, head, query) apart."""
    a = net.args
    if not 0 <= layer < len(net.dec_layers):
        raise ValueError(f"decoder layer {layer} out of range (the decoder has {len(net.dec_layers)})")
    if not 0 <= head < a.n_heads:
        raise ValueError(f"head {head} out of range (the model has {a.n_heads})")
    if not 0 <= query < len(dec_ids):
        raise ValueError(f"output position {query} out of range ({len(dec_ids)} decoder tokens)")
    parts = net.dec_layers[layer].cross
    capture = _Capture(parts.wq)
    seen: dict[str, F32] = {}

    def probe(kind: str, i: int, weights: F32) -> None:
        if kind == "cross" and i == layer:
            seen["w"] = np.array(weights[head, query], np.float32)

    cache = net.new_cache(max(len(dec_ids), 1))
    enc = net.encode(np.asarray(enc_ids, np.int64), cache)
    parts.wq = capture
    try:
        net.forward(np.asarray(dec_ids, np.int64), cache, all_logits=False, probe=probe)
    finally:
        parts.wq = capture.inner
    q = net.heads(np.asarray(capture.rows, np.float32), a.n_heads)[head, query]
    kv = head // max(1, a.n_heads // max(1, a.n_kv_heads))
    keys = np.asarray(enc.cross_k[layer][kv], np.float32)
    values = np.asarray(enc.cross_v[layer][kv], np.float32)
    w = seen["w"]
    return CrossCell(layer, head, query, kv, q, keys, values, (keys @ q).astype(np.float32), w,
                     (w.astype(np.float64) @ values.astype(np.float64)).astype(np.float32))
