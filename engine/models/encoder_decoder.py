"""What an encoder-decoder model (T5) adds to the decoder-only engine: relative position buckets and their learned
bias, the encoder's output kept beside the decoder's KV cache, and the block parts T5 is made of.

T5 has no RoPE: each attention adds a learned bias per head to its scores, looked up by the *bucket* of the
distance between key and query (llama_relative_position_bucket in llama-graph.cpp, HF's
_relative_position_bucket): distances under max_exact get a bucket each, longer ones share log-spaced buckets up
to MAX_DISTANCE. The encoder's buckets are bidirectional (half of them for keys after the query), the decoder's
causal. The encoder runs once per input (llama_encode); its output rows and every decoder layer's cross-attention
keys and values are kept on the cache (`EncoderDecoderCache.encoding`), as llama_context keeps `cross.v_embd`.
The graph that runs these parts is engine.models.seq2seq's; engine.models.t5 loads them from a file.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.tensor import Linear

F32 = npt.NDArray[np.float32]
MAX_DISTANCE = 128  # llama_relative_position_bucket's max_distance (T5's relative_attention_max_distance)
MIN_BUCKETS, MAX_BUCKETS = 4, 4096  # fewer than 4 leaves max_exact 0 (a division by zero in llama.cpp)
Probe = Callable[[str, int, F32], None]  # (kind: 'encoder' | 'decoder' | 'cross', layer, weights (H, Tq, Tk))


def relative_bucket(rel: npt.ArrayLike, n_buckets: int, bidirectional: bool) -> npt.NDArray[np.int32]:
    """The bucket of each relative position rel = key position - query position, as llama.cpp computes it.

    Bidirectional (the encoder): half the buckets for keys before or at the query, half (offset by n/2) for keys
    after it. Causal (the decoder): all buckets for keys at or before the query (later keys are masked anyway).
    Small distances (< max_exact = n/2 of the buckets in use) are their own bucket; larger ones take
    floorf(max_exact + logf(d / max_exact) * (n - max_exact) / log(MAX_DISTANCE / max_exact)), capped at n - 1,
    with C's float and double roundings kept (the quotient is rounded to float before logf, the sum before floorf).
    """
    r = np.asarray(rel, np.int64)
    n = n_buckets >> 1 if bidirectional else n_buckets
    max_exact = n >> 1
    if bidirectional:
        bucket = (r > 0).astype(np.int64) * n
        d = np.abs(r)
    else:
        bucket = np.zeros(r.shape, np.int64)
        d = -np.minimum(r, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (d.astype(np.float64) / max_exact).astype(np.float32)
        logf = np.log(ratio.astype(np.float64)).astype(np.float32)  # logf: correctly rounded at these arguments
        scaled = (logf * np.float32(n - max_exact)).astype(np.float64) / math.log(MAX_DISTANCE / max_exact)
        large = np.floor((max_exact + scaled).astype(np.float32))
        large = np.where(np.isfinite(large), large, 0).astype(np.int64)
    large = np.minimum(large, n - 1)
    return (bucket + np.where(d < max_exact, d, large)).astype(np.int32)


def position_bias(table: F32, q_pos: npt.ArrayLike, k_pos: npt.ArrayLike, bidirectional: bool) -> F32:
    """The learned bias (H, Tq, Tk) added to the scores: table (n_buckets, H) is attn_rel_b's rows (ggml shape
    n_head x n_buckets), looked up by the bucket of k_pos - q_pos (build_pos_bias: ggml_get_rows, then permute)."""
    q = np.asarray(q_pos, np.int64)[:, None]
    k = np.asarray(k_pos, np.int64)[None, :]
    buckets = relative_bucket(k - q, table.shape[0], bidirectional)  # (Tq, Tk)
    return np.ascontiguousarray(table[buckets].transpose(2, 0, 1))  # (H, Tq, Tk)


class InputRecorder(Protocol):
    """What the blocks ask of an engine.observe Recorder: the input rows of the matrices about to multiply them."""

    def record_input(self, names: tuple[str, ...], x: F32) -> None: ...


class Activations(Protocol):
    """What a T5 FFN asks of the numerics object."""

    def glu(self, kind: str, gate: F32, up: F32) -> F32: ...


@dataclass
class AttentionWeights:
    """One attention's matrices (no biases in T5): q, k, v and the output."""

    wq: Linear
    wk: Linear
    wv: Linear
    wo: Linear

    def linears(self) -> list[Linear]:
        return [self.wq, self.wk, self.wv, self.wo]

    def names(self, *parts: str) -> tuple[str, ...]:
        """The tensor names of the matrices `parts` ('wq', 'wk', ...): what a recorded input feeds."""
        return tuple(getattr(self, part).weight.name for part in parts)


@dataclass
class T5FFN:
    """T5's FFN as build_ffn runs it: with ffn_gate, GELU-gated (LLM_FFN_GELU, PAR: ggml_geglu_split, flan-T5);
    without, up, ReLU, down (LLM_FFN_RELU, SEQ: the original T5)."""

    up: Linear
    down: Linear
    gate: Linear | None = None

    def __call__(self, h: F32, ops: Activations, recorder: InputRecorder | None = None) -> F32:
        """The FFN's output rows (T, dim) for its normed input h (T, dim); `recorder` sees each product's input."""
        if recorder is not None:  # the inputs of the products, for an importance matrix
            recorder.record_input(tuple(m.weight.name for m in (self.up, self.gate) if m is not None), h)
        u = self.up(h)
        if self.gate is not None:
            g = ops.glu("geglu", self.gate(h), u)
        else:
            g = np.where(u > 0, u, np.float32(0.0)).astype(np.float32)  # ggml_relu: x > 0 ? x : 0
        if recorder is not None:
            recorder.record_input((self.down.weight.name,), g)
        return self.down(g)

    def linears(self) -> list[Linear]:
        """The matrices in the order the graph multiplies them."""
        return [m for m in (self.up, self.gate, self.down) if m is not None]


@dataclass
class EncoderLayer:
    """One encoder block: norm, bidirectional self-attention with the position bias, norm, FFN."""

    attn_norm: F32
    attn: AttentionWeights
    ffn_norm: F32
    ffn: T5FFN
    rel_bias: F32  # (n_buckets, H): this layer's attn_rel_b, or layer 0's (llama.cpp shares it when absent)

    def linears(self) -> list[Linear]:
        return [*self.attn.linears(), *self.ffn.linears()]


@dataclass
class DecoderLayer:
    """One decoder block: causal self-attention with the position bias, cross-attention on the encoder output, FFN."""

    attn_norm: F32
    attn: AttentionWeights
    cross_norm: F32
    cross: AttentionWeights
    ffn_norm: F32
    ffn: T5FFN
    rel_bias: F32

    def linears(self) -> list[Linear]:
        return [*self.attn.linears(), *self.cross.linears(), *self.ffn.linears()]


@dataclass
class EncoderOutput:
    """One encoding: the encoder input, its output rows (after enc.output_norm) and each decoder layer's
    cross-attention keys and values computed from them (computed once, read by every decoder step)."""

    ids: tuple[int, ...]
    rows: F32  # (Te, dim)
    cross_k: list[F32] = field(default_factory=list)  # per decoder layer: (Hkv, Te, d)
    cross_v: list[F32] = field(default_factory=list)

    @property
    def n_tokens(self) -> int:
        return len(self.ids)


class EncoderDecoderCache(KVCache):
    """The decoder's self-attention KV cache plus the encoding it decodes against.

    Setting a new encoding empties the decoder positions: cached decoder keys were computed against the old one.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, n_ctx: int, cache_type: str = "F32"):
        super().__init__(n_layers, n_kv_heads, head_dim, n_ctx, cache_type)
        self.encoding: EncoderOutput | None = None

    def set_encoding(self, encoding: EncoderOutput) -> None:
        """Decode against `encoding` from now on (the decoder positions start again at 0)."""
        if self.encoding is None or self.encoding.ids != encoding.ids:
            self.truncate(0)
        self.encoding = encoding

    @property
    def encoder_ids(self) -> tuple[int, ...] | None:
        """The encoder input the cache decodes against, or None before an encoding."""
        return None if self.encoding is None else self.encoding.ids
