"""KVCache: per-layer keys and values of the tokens run so far, grown on demand up to the context length.

The cache can hold its rows as F32, F16, Q8_0 or Q4_0, as llama.cpp's --cache-type-k/v do: F16 rows are
stored as float16; Q8_0 / Q4_0 rows are stored as ggml blocks (quantized when written, dequantized when
attention reads them), so the bytes reported are the bytes held.

Layers may differ in shape (Gemma 4: sliding layers with more, narrower KV heads than the global ones), and a layer
may hold no rows of its own but read another's (Gemma 4's KV sharing, llama_kv_cache's layer_reuse_cb): `shared`
maps such a layer to the layer whose rows it reads, and every read of it returns that layer's rows.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from engine.errors import ContextFullError, SettingError
from engine.kernels.activations import quantize_q8_0
from engine.quant import dequantize_rows, hadamard, quantize
from engine.quant.types import TYPES, GGMLType

_MIN_CAPACITY = 256
CACHE_TYPES = {"F32": GGMLType.F32, "F16": GGMLType.F16, "Q8_0": GGMLType.Q8_0, "Q4_0": GGMLType.Q4_0}


class KVCache:
    """Post-RoPE keys and values per layer, (n_kv_heads, capacity, head_dim) as float rows or ggml blocks.

    A forward pass writes positions [length, length + T) but only `commit` makes them part of the
    cache, so a step whose logits turn out NaN (or that was cancelled) leaves the cache as it was.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, n_ctx: int, cache_type: str | npt.DTypeLike = "F32",
                 kv_layers: frozenset[int] | None = None, layer_shapes: Sequence[tuple[int, int]] | None = None,
                 shared: Mapping[int, int] | None = None):
        self.n_layers = n_layers
        self.shared = dict(shared or {})  # layer -> the layer whose rows it reads (it holds none of its own)
        kv = frozenset(range(n_layers)) if kv_layers is None else kv_layers
        self.kv_layers = kv - frozenset(self.shared)  # the others hold no rows
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        # (n_kv_heads, head_dim) of each layer; the defaults above where the layers do not differ
        self.shapes = [(n_kv_heads, head_dim)] * n_layers if layer_shapes is None else [tuple(s) for s in layer_shapes]
        for layer, src in self.shared.items():
            if src not in self.kv_layers or self.shapes[src] != self.shapes[layer]:
                raise ValueError(f"layer {layer} cannot read layer {src}'s rows")
        self.n_ctx = n_ctx
        name = _type_name(cache_type)
        if name not in CACHE_TYPES:
            raise SettingError(f"cache type {cache_type!r} is not one of {', '.join(CACHE_TYPES)}")
        self.cache_type = name
        self.qtype = CACHE_TYPES[name]
        info = TYPES[self.qtype]
        for d in sorted({d for _, d in self.shapes} | {head_dim}):
            if d % info.block_size:
                raise SettingError(f"cache type {name} needs head_dim to be a multiple of {info.block_size}, got {d}")
        self._row_bytes = info.row_bytes(head_dim)
        self._layer_row_bytes = [info.row_bytes(d) for _, d in self.shapes]
        self._quantized = info.block_size > 1
        self.tokens: list[int] = []
        self.rotated = False  # quantized rows stored Hadamard-rotated (llama.cpp's attn_rot_k / attn_rot_v, with
        # flash attention): set by the numerics before the first write; keys() / values() rotate them back
        self.capacity = 0
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []

    @property
    def length(self) -> int:
        return len(self.tokens)

    def _alloc(self, cap: int, layer: int | None = None) -> np.ndarray:
        heads, d = (self.n_kv_heads, self.head_dim) if layer is None else self.shapes[layer]
        if self._quantized:
            return np.zeros((heads, cap, TYPES[self.qtype].row_bytes(d)), np.uint8)
        dtype = np.float16 if self.qtype == GGMLType.F16 else np.float32
        return np.zeros((heads, cap, d), dtype)

    def reserve(self, n_total: int) -> None:
        """Make room for n_total positions; ContextFullError past the context length."""
        if n_total > self.n_ctx:
            raise ContextFullError(n_total, self.n_ctx)
        if n_total <= self.capacity:
            return
        cap = min(self.n_ctx, max(_MIN_CAPACITY, self.capacity * 2, n_total))
        new_k = [self._alloc(cap if i in self.kv_layers else 0, i) for i in range(self.n_layers)]
        new_v = [self._alloc(cap if i in self.kv_layers else 0, i) for i in range(self.n_layers)]
        n = self.length
        for old, new in ((self.k, new_k), (self.v, new_v)):
            for layer, a in enumerate(old):
                if layer not in self.shared:
                    new[layer][:, :n] = a[:, :n]
            for layer, src in self.shared.items():  # the same arrays: a read of the layer is a read of its source
                new[layer] = new[src]
        self.k, self.v, self.capacity = new_k, new_v, cap

    def _encode(self, x: np.ndarray) -> np.ndarray:
        if not self._quantized:
            return x
        h, t, d = x.shape
        row = TYPES[self.qtype].row_bytes(d)
        if self.qtype == GGMLType.Q8_0:  # ggml_set_rows' from_float: the CPU's quantize_row_q8_0 (x86: 127/max)
            return quantize_q8_0(x.reshape(h * t, d)).reshape(h, t, row)
        return quantize(x.reshape(h * t, d), self.qtype).reshape(h, t, row)

    def _decode(self, rows: np.ndarray, layer: int | None = None) -> np.ndarray:
        if not self._quantized:
            return rows.astype(np.float32, copy=False)
        h, t, row = rows.shape
        d = self.head_dim if layer is None else self.shapes[layer][1]
        return dequantize_rows(rows.reshape(h * t, row), self.qtype).reshape(h, t, d)

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store k, v (n_kv_heads, T, head_dim) at [start, start+T); return all keys/values up to start+T as float32."""
        end = self.put(layer, start, k, v)
        return self.keys(layer, end), self.values(layer, end)

    def put(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> int:
        """Store k, v (n_kv_heads, T, head_dim) at [start, start+T) in the cache's type; returns start + T."""
        assert layer not in self.shared, "a layer that reads another's rows writes none"
        end = start + k.shape[1]
        if self.rotated and self._quantized:  # llama_mul_mat_hadamard of k_cur and v_cur before cpy_k / cpy_v
            k, v = _rotate(k, hadamard.k_size(k.shape[-1])), _rotate(v, hadamard.v_size(v.shape[-1]))
        self.k[layer][:, start:end] = self._encode(k)
        self.v[layer][:, start:end] = self._encode(v)
        return end

    def rows(self, layer: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The layer's K and V storage (n_kv_heads, capacity, head_dim) as float32 or fp16 bits (uint16), for the
        compiled decode step to write and read in place; None for quantized rows."""
        if self._quantized:
            return None
        k, v = self.k[layer], self.v[layer]
        return (k.view(np.uint16), v.view(np.uint16)) if k.dtype == np.float16 else (k, v)

    def blocks(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """The layer's quantized K and V storage (n_kv_heads, capacity, row bytes) as ggml blocks (a Q8_0 / Q4_0
        cache), for flash attention to read in place."""
        if not self._quantized:
            raise ValueError(f"a {self.cache_type} cache holds no blocks")
        return self.k[layer], self.v[layer]

    def stored(self, layer: int, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Keys and values of positions [0, n) in their stored dtype (float16 or float32), None for quantized rows."""
        if self._quantized:
            return None
        return self.k[layer][:, :n], self.v[layer][:, :n]

    def keys(self, layer: int, n: int | None = None) -> np.ndarray:
        """Keys of positions [0, n) as float32 (n_kv_heads, n, head_dim); default: the committed ones (rotated rows
        rotated back, to float32 rounding)."""
        got = self._decode(self.k[layer][:, : self.length if n is None else n], layer)
        return _rotate(got, hadamard.k_size(got.shape[-1])) if self.rotated and self._quantized else got

    def values(self, layer: int, n: int | None = None) -> np.ndarray:
        """Values of positions [0, n) as float32 (n_kv_heads, n, head_dim)."""
        got = self._decode(self.v[layer][:, : self.length if n is None else n], layer)
        return _rotate(got, hadamard.v_size(got.shape[-1])) if self.rotated and self._quantized else got

    def commit(self, tokens: list[int]) -> None:
        """Accept the positions the last forward wrote for these tokens."""
        self.tokens.extend(int(t) for t in tokens)

    def truncate(self, n: int) -> None:
        """Keep only the first n positions (regenerate, edit, or drop a failed step)."""
        del self.tokens[max(0, n) :]

    def resumable(self, n: int) -> int:
        """The longest prefix of length <= n a pass can continue from (any, for K/V rows; see engine.hybrid_cache)."""
        return max(0, min(n, self.length))

    def common_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of `tokens` the cache already holds."""
        n = 0
        for a, b in zip(self.tokens, tokens):
            if a != b:
                break
            n += 1
        return n

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds for the committed tokens."""
        return self.bytes_for(self.length)

    def bytes_for(self, n_tokens: int) -> int:
        """2 x tokens x, over the layers with rows of their own, kv_heads x (bytes of one head_dim row in the cache type)."""
        return 2 * n_tokens * sum(self.shapes[i][0] * self._layer_row_bytes[i] for i in self.kv_layers)


def _type_name(cache_type: str | npt.DTypeLike) -> str:
    if isinstance(cache_type, str):
        return cache_type.strip().upper()
    dt = np.dtype(cache_type)
    return {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}.get(dt, str(dt))


def _rotate(x: np.ndarray, n: int) -> np.ndarray:
    """x with every n values of a head rotated (engine.quant.hadamard), as it is where n is 0 (no rotation)."""
    return hadamard.fwht(x, n) if n else x
