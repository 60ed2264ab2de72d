"""Sliding and global layers that differ in shape, and layers that share another's K/V (Gemma 4).

llama.cpp's hparams for such a model (llama-hparams.cpp): a sliding flag per block (attention.sliding_window_pattern);
the sliding layers' head size and rotated dimensions of their own (attention.key_length_swa,
rope.dimension_count_swa, else rope.dimension_count); head counts given once or per block
(llama_model_loader::get_key_or_arr); and, with attention.shared_kv_layers, the last blocks computing no K/V but
attending to the cache of the last earlier block of their kind (llama-model.cpp's layer_reuse_cb: sliding
n_kv - 2, global n_kv - 1, n_kv = block_count - shared_kv_layers). `LayerKinds` reads and checks all of it;
engine.cache.KVCache holds each layer's rows in its shape and maps a sharing layer to its source.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.errors import ModelFormatError
from engine.models.args import MAX_HEADS, MAX_LAYERS, LayerAttentionSpec, MetadataView
from engine.models.rope import RopeScaling, rope_freqs
from engine.models.weights import Weights

F32 = npt.NDArray[np.float32]


def is_array(v: Any) -> bool:
    return isinstance(v, (list, tuple, np.ndarray))


def per_layer(m: MetadataView, key: str, n_layers: int) -> tuple[int, ...]:
    """A count given once or per block (get_key_or_arr): one value per block; the key must be in the file."""
    full = f"{m.arch}.{key}"
    v = m.md.get(full)
    if v is None:
        raise ModelFormatError(full, "required metadata key is missing")
    if not is_array(v):
        return (m.int(key),) * n_layers
    vals = np.asarray(v).reshape(-1)
    if vals.size != n_layers or vals.dtype.kind not in "iub":
        raise ModelFormatError(full, f"must be an integer or {n_layers} integers (one per block), got {vals.size} of "
                               f"{vals.dtype}", vals.tolist()[:8])
    return tuple(int(x) for x in vals)


@dataclass(frozen=True)
class LayerKinds:
    """Each block's attention shape and where its K/V come from (see the module docstring)."""

    swa: tuple[bool, ...]  # sliding blocks
    heads: tuple[int, ...]  # query heads per block
    kv_heads: tuple[int, ...]  # KV heads per block
    head_dim: int  # the global blocks' head size (attention.key_length)
    head_dim_swa: int  # the sliding blocks' (attention.key_length_swa)
    rope_dim: int  # rotated dimensions of the global blocks (rope.dimension_count)
    rope_dim_swa: int  # and of the sliding ones
    n_kv_layers: int  # the blocks that compute K/V (block_count - shared_kv_layers)

    def head_dim_of(self, layer: int) -> int:
        return self.head_dim_swa if self.swa[layer] else self.head_dim

    def kv_source(self, layer: int) -> int | None:
        """The block whose cached K/V a sharing block attends to; None for a block that computes its own."""
        if layer < self.n_kv_layers:
            return None
        return self.n_kv_layers - (2 if self.swa[layer] else 1)

    def specs(self, window: int, base: float, base_swa: float) -> list[LayerAttentionSpec]:
        """Each block's attention: kq scale 1 (Gemma 4's f_attention_scale), the window on the sliding blocks, its
        query heads per KV head, its RoPE base."""
        return [LayerAttentionSpec(1.0, window if swa else None, self.heads[i] // self.kv_heads[i],
                                   base_swa if swa else base) for i, swa in enumerate(self.swa)]

    def ropes(self, w: Weights, base: float, base_swa: float) -> dict[bool, LayerRope]:
        """The RoPE of each kind of block the model has, by is-sliding: the global blocks' takes rope_freqs.weight as
        frequency factors (Gemma 4's proportional RoPE), the sliding blocks' none."""
        out = {True: LayerRope.make(self.rope_dim_swa, base_swa, None)} if any(self.swa) else {}
        if not all(self.swa):
            factors = w.vector("rope_freqs.weight", self.head_dim // 2)
            if not np.all(factors > 0):  # theta / factor must be a frequency
                raise ModelFormatError("rope_freqs.weight", "holds a factor that is not positive")
            out[False] = LayerRope.make(self.rope_dim, base, factors)
        return out

    def new_cache(self, n_ctx: int, cache_type: str) -> KVCache:
        """Rows for the blocks that compute K/V, each in its shape; the sharing blocks read their source's."""
        n = len(self.swa)
        shapes = [(self.kv_heads[i], self.head_dim_of(i)) for i in range(n)]
        shared = {i: src for i in range(n) if (src := self.kv_source(i)) is not None}
        return KVCache(n, shapes[0][0], shapes[0][1], n_ctx, cache_type, layer_shapes=shapes, shared=shared)

    @classmethod
    def read(cls, m: MetadataView, n_layers: int, head_dim: int, rope_dim: int) -> LayerKinds:
        """The keys of the module docstring, checked against each other; head_dim and rope_dim are the global
        blocks' (read and checked with the shared fields)."""
        a = m.arch
        heads = per_layer(m, "attention.head_count", n_layers)
        kv_key = "attention.head_count_kv"
        kv = per_layer(m, kv_key, n_layers) if f"{a}.{kv_key}" in m.md else heads
        for i in range(n_layers):
            if not 1 <= heads[i] <= MAX_HEADS:
                raise ModelFormatError(f"{a}.attention.head_count", f"block {i}'s must be between 1 and {MAX_HEADS}",
                                       heads[i])
            if not 1 <= kv[i] <= heads[i] or heads[i] % kv[i]:
                raise ModelFormatError(f"{a}.{kv_key}", f"block {i}'s must divide its head count {heads[i]}", kv[i])
        key = f"{a}.attention.sliding_window_pattern"
        flags = np.asarray(m.md.get(key, [])).reshape(-1)
        if key not in m.md or not is_array(m.md[key]) or flags.size != n_layers or flags.dtype.kind not in "iub":
            raise ModelFormatError(key, f"must be {n_layers} flags (one per block)" if key in m.md else
                                   "required metadata key is missing", flags.tolist()[:8] if key in m.md else None)
        swa = tuple(bool(f) for f in flags)
        head_swa = m.int("attention.key_length_swa")
        if not (2 <= head_swa <= 1 << 12 and head_swa % 2 == 0):
            raise ModelFormatError(f"{a}.attention.key_length_swa", f"must be even and between 2 and {1 << 12}", head_swa)
        value_swa = m.int("attention.value_length_swa")
        if value_swa != head_swa:
            raise ModelFormatError(f"{a}.attention.value_length_swa", f"differs from key_length_swa {head_swa} (llama.cpp "
                                   "requires them equal)", value_swa)
        rope_swa = m.int("rope.dimension_count_swa", rope_dim)
        if not (2 <= rope_swa <= head_swa and rope_swa % 2 == 0):
            raise ModelFormatError(f"{a}.rope.dimension_count_swa", f"must be even and between 2 and key_length_swa "
                                   f"{head_swa}", rope_swa)
        shared = m.int("attention.shared_kv_layers", 0)
        if not 0 <= shared <= n_layers - 2:
            raise ModelFormatError(f"{a}.attention.shared_kv_layers", f"must be between 0 and block_count - 2 = "
                                   f"{n_layers - 2} (two blocks at least compute K/V)", shared)
        kinds = cls(swa, heads, kv, head_dim, head_swa, rope_dim, rope_swa, n_layers - shared)
        for i in range(kinds.n_kv_layers, n_layers):  # one KV cache per kind: the source must be of the same kind
            src = kinds.kv_source(i)
            assert src is not None
            if swa[src] != swa[i] or kv[src] != kv[i]:
                raise ModelFormatError(f"{a}.attention.shared_kv_layers", f"makes {'sliding' if swa[i] else 'global'} "
                                       f"block {i} read block {src}'s K/V, which is not a block of its kind", shared)
        return kinds


@dataclass(frozen=True)
class _RopeDims:
    rope_dim: int


@dataclass(frozen=True, eq=False)
class LayerRope:
    """One kind of block's RoPE as the numerics' rope_tables read it off a model (`args.rope_dim`, `rope_scaling`,
    an object of its own: the ggml numerics memoise tables by its identity), with its base and frequencies."""

    args: _RopeDims
    rope_scaling: RopeScaling
    base: float
    freqs: np.ndarray

    @classmethod
    def make(cls, dims: int, base: float, factors: F32 | None) -> LayerRope:
        scaling = RopeScaling(factors=factors)
        return cls(_RopeDims(dims), scaling, base, rope_freqs(dims, base, scaling))


def flat_counts(m: MetadataView) -> tuple[dict[str, Any], tuple[int, ...]]:
    """The metadata as the shared fields read it (block 0's head counts, as n_head(0); the widest FFN; an experts'
    width given per block: the first, as n_ff_exp(0)) and the FFN width of every block (feed_forward_length, once
    or per block), checked: as many as block_count (two at least), each in range."""
    md, arch, n_layers = m.md, m.arch, m.int("block_count")
    if not 2 <= n_layers <= MAX_LAYERS:
        raise ModelFormatError(f"{arch}.block_count", f"must be between 2 and {MAX_LAYERS}", n_layers)
    hidden = per_layer(m, "feed_forward_length", n_layers)
    if not all(1 <= h <= 1 << 18 for h in hidden):
        raise ModelFormatError(f"{arch}.feed_forward_length", f"must be between 1 and {1 << 18}", list(hidden)[:8])
    flat = dict(md)
    for key in ("attention.head_count", "attention.head_count_kv"):
        if is_array(md.get(f"{arch}.{key}")):
            flat[f"{arch}.{key}"] = per_layer(m, key, n_layers)[0]
    flat[f"{arch}.feed_forward_length"] = max(hidden)
    if is_array(md.get(f"{arch}.expert_feed_forward_length")):
        flat[f"{arch}.expert_feed_forward_length"] = int(np.asarray(md[f"{arch}.expert_feed_forward_length"]).reshape(-1)[0])
    return flat, hidden


def load_attention(w: Weights, i: int, kinds: LayerKinds, dim: int) -> dict[str, Any]:
    """Block i's attention tensors in its kind's shape, as engine.models.transformer.Layer's fields: attn_qkv, or
    attn_q with attn_k and attn_v (none: V is K's product; a KV-sharing block's are loaded where present, unused),
    attn_output, attn_q_norm, attn_k_norm, and the unweighted V norm."""
    b, d, src = f"blk.{i}.", kinds.head_dim_of(i), kinds.kv_source(i)
    q_dim, kv_dim = kinds.heads[i] * d, kinds.kv_heads[i] * d
    fused = w.has(b + "attn_qkv.weight")
    if fused:
        qkv = [w.linear(b + "attn_qkv.weight", dim, q_dim + 2 * kv_dim)]
    else:
        qkv = [w.linear(b + "attn_q.weight", dim, q_dim)]
        for x in ("attn_k", "attn_v"):
            if src is None and (x == "attn_k" or w.has(f"{b}{x}.weight")):
                qkv.append(w.linear(f"{b}{x}.weight", dim, kv_dim))
            elif w.has(f"{b}{x}.weight"):
                w.qtensor(f"{b}{x}.weight", (dim, kv_dim))
    wo = w.linear(b + "attn_output.weight", q_dim, dim)
    q_norm = w.vector(b + "attn_q_norm.weight", d)
    k_norm = w.vector(b + "attn_k_norm.weight", d) if src is None or w.has(b + "attn_k_norm.weight") else None
    return dict(qkv_parts=qkv, wo=wo, q_dim=q_dim, kv_dim=kv_dim, q_norm=q_norm, k_norm=k_norm if src is None else None,
                head_dim=d, n_heads=kinds.heads[i], n_kv_heads=kinds.kv_heads[i], kv_source=src,
                v_from_k=src is None and len(qkv) == 2, v_norm=np.ones(d, np.float32))
