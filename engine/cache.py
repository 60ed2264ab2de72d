"""KVCache: per-layer keys and values of the tokens run so far, grown on demand up to the context length."""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.errors import ContextFullError

_MIN_CAPACITY = 256


class KVCache:
    """Post-RoPE keys and values, (n_kv_heads, capacity, head_dim) per layer.

    A forward pass writes positions [length, length + T) but only `commit` makes them part of the
    cache, so a step whose logits turn out NaN (or that was cancelled) leaves the cache as it was.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, n_ctx: int, dtype: npt.DTypeLike = np.float32):
        self.n_layers = n_layers
        self.n_kv_heads = n_kv_heads
        self.head_dim = head_dim
        self.n_ctx = n_ctx
        self.dtype = np.dtype(dtype)
        self.tokens: list[int] = []
        self.capacity = 0
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []

    @property
    def length(self) -> int:
        return len(self.tokens)

    def reserve(self, n_total: int) -> None:
        """Make room for n_total positions; ContextFullError past the context length."""
        if n_total > self.n_ctx:
            raise ContextFullError(n_total, self.n_ctx)
        if n_total <= self.capacity:
            return
        cap = min(self.n_ctx, max(_MIN_CAPACITY, self.capacity * 2, n_total))
        shape = (self.n_kv_heads, cap, self.head_dim)
        new_k = [np.zeros(shape, self.dtype) for _ in range(self.n_layers)]
        new_v = [np.zeros(shape, self.dtype) for _ in range(self.n_layers)]
        n = self.length
        for old, new in ((self.k, new_k), (self.v, new_v)):
            for layer, a in enumerate(old):
                new[layer][:, :n] = a[:, :n]
        self.k, self.v, self.capacity = new_k, new_v, cap

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store k, v (n_kv_heads, T, head_dim) at [start, start+T); return all keys/values up to start+T."""
        end = start + k.shape[1]
        self.k[layer][:, start:end] = k
        self.v[layer][:, start:end] = v
        return self.k[layer][:, :end], self.v[layer][:, :end]

    def commit(self, tokens: list[int]) -> None:
        """Accept the positions the last forward wrote for these tokens."""
        self.tokens.extend(int(t) for t in tokens)

    def truncate(self, n: int) -> None:
        """Keep only the first n positions (regenerate, edit, or drop a failed step)."""
        del self.tokens[max(0, n) :]

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
        """2 x layers x tokens x kv_heads x head_dim x bytes."""
        return 2 * self.n_layers * n_tokens * self.n_kv_heads * self.head_dim * self.dtype.itemsize
