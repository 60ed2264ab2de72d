"""DeviceKVCache: a KVCache whose first n_cpu layers live on the host and the rest on the device."""
from __future__ import annotations

from typing import Any

import numpy as np

from engine.cache import _MIN_CAPACITY, KVCache
from engine.errors import ContextFullError, SettingError
from engine.gpu.device import Device

DEVICE_CACHE_TYPES = {"F32": np.float32, "F16": np.float16}


class DeviceKVCache(KVCache):
    """Keys and values per layer: host rows (as KVCache) for layers < n_cpu, device rows (n_kv_heads, capacity,
    head_dim) of float32 or float16 for the others.

    Growing the device rows moves them; `generation` counts the moves, so the runner knows when to write the
    new row pointers into the table its kernels (and captured decode graphs) read.
    """

    def __init__(self, device: Device, n_layers: int, n_cpu: int, n_kv_heads: int, head_dim: int, n_ctx: int,
                 cache_type: str = "F32"):
        super().__init__(n_layers, n_kv_heads, head_dim, n_ctx, cache_type)
        if n_cpu < n_layers and self.cache_type not in DEVICE_CACHE_TYPES:
            raise SettingError(f"cache type {self.cache_type} is not supported on the GPU; use F32 or F16")
        self.device = device
        self.n_cpu = n_cpu
        self.generation = 0
        self.dk: list[Any] = []
        self.dv: list[Any] = []

    @property
    def on_host(self) -> bool:
        return self.n_cpu >= self.n_layers

    @property
    def cache_f16(self) -> bool:
        return self.cache_type == "F16"

    def reserve(self, n_total: int) -> None:
        """Make room for n_total positions on both sides; ContextFullError past the context length."""
        if n_total > self.n_ctx:
            raise ContextFullError(n_total, self.n_ctx)
        if n_total <= self.capacity:
            return
        cap = min(self.n_ctx, max(_MIN_CAPACITY, self.capacity * 2, n_total))
        n = self.length
        new_k = [self._alloc(cap) for _ in range(self.n_cpu)]
        new_v = [self._alloc(cap) for _ in range(self.n_cpu)]
        for old, new in ((self.k, new_k), (self.v, new_v)):
            for layer, a in enumerate(old):
                new[layer][:, :n] = a[:, :n]
        n_gpu = self.n_layers - self.n_cpu
        if n_gpu:
            dtype = DEVICE_CACHE_TYPES[self.cache_type]
            xp = self.device.xp
            with self.device.stream:
                dk = [xp.zeros((self.n_kv_heads, cap, self.head_dim), dtype) for _ in range(n_gpu)]
                dv = [xp.zeros((self.n_kv_heads, cap, self.head_dim), dtype) for _ in range(n_gpu)]
                for old, new in ((self.dk, dk), (self.dv, dv)):
                    for layer, a in enumerate(old):
                        new[layer][:, :n] = a[:, :n]
            self.dk, self.dv = dk, dv
            self.generation += 1
        self.k, self.v, self.capacity = new_k, new_v, cap

    def device_rows(self, layer: int) -> tuple[Any, Any]:
        """The device key and value arrays of a device layer."""
        return self.dk[layer - self.n_cpu], self.dv[layer - self.n_cpu]

    def write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if layer >= self.n_cpu:
            raise ValueError(f"layer {layer} keeps its keys on the device; the CUDA kernels write them")
        return super().write(layer, start, k, v)

    def keys(self, layer: int, n: int | None = None) -> np.ndarray:
        if layer < self.n_cpu:
            return super().keys(layer, n)
        rows = self.dk[layer - self.n_cpu][:, : self.length if n is None else n]
        return self.device.backend.to_numpy(rows).astype(np.float32, copy=False)

    def values(self, layer: int, n: int | None = None) -> np.ndarray:
        if layer < self.n_cpu:
            return super().values(layer, n)
        rows = self.dv[layer - self.n_cpu][:, : self.length if n is None else n]
        return self.device.backend.to_numpy(rows).astype(np.float32, copy=False)

    def bytes_for(self, n_tokens: int) -> int:
        """Host rows of the CPU layers plus device rows of the others."""
        item = np.dtype(DEVICE_CACHE_TYPES.get(self.cache_type, np.float32)).itemsize
        n_gpu = self.n_layers - self.n_cpu
        return 2 * n_tokens * self.n_kv_heads * (self.n_cpu * self._row_bytes + n_gpu * self.head_dim * item)

    def move_to_host(self, copy_rows: bool) -> None:
        """Hold every layer on the host from now on (the GPU failed); with copy_rows the device rows come along,
        otherwise the cache is emptied and the caller runs its tokens again."""
        n = self.length
        old_dk, old_dv = self.dk, self.dv
        first_gpu = self.n_cpu
        self.dk, self.dv = [], []
        host_k, host_v = self.k, self.v
        self.n_cpu = self.n_layers
        self.capacity = 0
        self.k, self.v = [], []
        if not copy_rows:
            self.truncate(0)
            return
        self.reserve(max(n, 1))
        for layer in range(self.n_layers):
            if layer < first_gpu:
                self.k[layer][:, :n] = host_k[layer][:, :n]
                self.v[layer][:, :n] = host_v[layer][:, :n]
            else:
                to_np = self.device.backend.to_numpy
                self.k[layer][:, :n] = self._encode(to_np(old_dk[layer - first_gpu][:, :n]).astype(np.float32))
                self.v[layer][:, :n] = self._encode(to_np(old_dv[layer - first_gpu][:, :n]).astype(np.float32))
