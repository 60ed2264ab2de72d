"""KVCache: per-layer keys and values of the tokens run so far, grown on demand up to the context length.

The cache can hold its rows as F32, F16, Q8_0 or Q4_0, as llama.cpp's --cache-type-k/v do: F16 rows are
stored as float16; Q8_0 / Q4_0 rows are stored as ggml blocks (quantized when written, dequantized when
attention reads them), so the bytes reported are the bytes held.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.errors import ContextFullError, SettingError
from engine.quant import dequantize_rows, quantize
from engine.quant.types import TYPES, GGMLType

_MIN_CAPACITY = 256
CACHE_TYPES = {"F32": GGMLType.F32, "F16": GGMLType.F16, "Q8_0": GGMLType.Q8_0, "Q4_0": GGMLType.Q4_0}


class KVCache:
    """Post-RoPE keys and values per layer, (n_kv_heads, capacity, head_dim) as float rows or ggml blocks.

    A forward pass writes positions [length, length + T) but only `commit` makes them part of the
    cache, so a step whose logits turn out NaN (or that was cancelled) leaves the cache as it was.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, n_ctx: int, cache_type: str | npt.DTypeLike = "F32",
                 kv_layers: frozenset[int] | None = None):
        self.n_layers = n_layers
        self.kv_layers = frozenset(range(n_layers)) if kv_layers is None else kv_layers  # the others hold no rows
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.n_ctx = n_ctx
        name = _type_name(cache_type)
        if name not in CACHE_TYPES:
            raise SettingError(f"cache type {cache_type!r} is not one of {', '.join(CACHE_TYPES)}")
        self.cache_type = name
        self.qtype = CACHE_TYPES[name]
        info = TYPES[self.qtype]
        if head_dim % info.block_size:
            raise SettingError(f"cache type {name} needs head_dim to be a multiple of {info.block_size}, got {head_dim}")
        self._row_bytes = info.row_bytes(head_dim)
        self._quantized = info.block_size > 1
        self.tokens: list[int] = []
        self.capacity = 0
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []

    @property
    def length(self) -> int:
        return len(self.tokens)

    def _alloc(self, cap: int) -> np.ndarray:
        if self._quantized:
            return np.zeros((self.n_kv_heads, cap, self._row_bytes), np.uint8)
        dtype = np.float16 if self.qtype == GGMLType.F16 else np.float32
        return np.zeros((self.n_kv_heads, cap, self.head_dim), dtype)

    def reserve(self, n_total: int) -> None:
        """Make room for n_total positions; ContextFullError past the context length."""
        if n_total > self.n_ctx:
            raise ContextFullError(n_total, self.n_ctx)
        if n_total <= self.capacity:
            return
        cap = min(self.n_ctx, max(_MIN_CAPACITY, self.capacity * 2, n_total))
        new_k = [self._alloc(cap if i in self.kv_layers else 0) for i in range(self.n_layers)]
        new_v = [self._alloc(cap if i in self.kv_layers else 0) for i in range(self.n_layers)]
        n = self.length
        for old, new in ((self.k, new_k), (self.v, new_v)):
            for layer, a in enumerate(old):
                new[layer][:, :n] = a[:, :n]
        self.k, self.v, self.capacity = new_k, new_v, cap

    def _encode(self, x: np.ndarray) -> np.ndarray:
        if not self._quantized:
            return x
        h, t, d = x.shape
        return quantize(x.reshape(h * t, d), self.qtype).reshape(h, t, self._row_bytes)

    def _decode(self, rows: np.ndarray) -> np.ndarray:
        if not self._quantized:
            return rows.astype(np.float32, copy=False)
        h, t, _ = rows.shape
        return dequantize_rows(rows.reshape(h * t, self._row_bytes), self.qtype).reshape(h, t, self.head_dim)

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store k, v (n_kv_heads, T, head_dim) at [start, start+T); return all keys/values up to start+T as float32."""
        end = self.put(layer, start, k, v)
        return self.keys(layer, end), self.values(layer, end)

    def put(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> int:
        """Store k, v (n_kv_heads, T, head_dim) at [start, start+T) in the cache's type; returns start + T."""
        end = start + k.shape[1]
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

    def stored(self, layer: int, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Keys and values of positions [0, n) in their stored dtype (float16 or float32), None for quantized rows."""
        if self._quantized:
            return None
        return self.k[layer][:, :n], self.v[layer][:, :n]

    def keys(self, layer: int, n: int | None = None) -> np.ndarray:
        """Keys of positions [0, n) as float32 (n_kv_heads, n, head_dim); default: the committed ones."""
        return self._decode(self.k[layer][:, : self.length if n is None else n])

    def values(self, layer: int, n: int | None = None) -> np.ndarray:
        """Values of positions [0, n) as float32 (n_kv_heads, n, head_dim)."""
        return self._decode(self.v[layer][:, : self.length if n is None else n])

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
        """2 x layers with rows x tokens x kv_heads x (bytes of one head_dim row in the cache type)."""
        return 2 * len(self.kv_layers) * n_tokens * self.n_kv_heads * self._row_bytes


def _type_name(cache_type: str | npt.DTypeLike) -> str:
    if isinstance(cache_type, str):
        return cache_type.strip().upper()
    dt = np.dtype(cache_type)
    return {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}.get(dt, str(dt))
