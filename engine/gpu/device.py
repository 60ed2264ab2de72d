"""Device: one CUDA device seen through a CuPy backend: its kernels, its stream, and typed kernel launches."""
from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from engine.backend import Backend
from engine.gpu.kernels import Kernels

log = logging.getLogger(__name__)

NULL = np.uint64(0)  # a null pointer argument (8 bytes of zero)
SHARED_DEFAULT = 48 << 10  # dynamic shared memory a kernel gets without opting in
GRID_CAP = 1 << 14  # grid-stride kernels launch at most this many blocks


def arg(a: Any) -> Any:
    """A kernel argument: an array as its pointer, None as a null pointer."""
    return NULL if a is None else a


class Device:
    """The kernels and the stream all device work of one model runs on (so a decode step can be captured)."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.xp = backend.xp
        self.kernels = Kernels(backend)
        self.stream = self.xp.cuda.Stream(non_blocking=True)
        self.name = backend.device_name()
        self._shared_set: dict[str, int] = {}

    def launch(self, fn: str, grid: int | tuple[int, ...], block: int, args: tuple, shared_mem: int = 0) -> None:
        """Launch kernel `fn` on the device's stream (the caller is inside `with device.stream`)."""
        k = self.kernels[fn]
        if shared_mem > SHARED_DEFAULT and self._shared_set.get(fn, 0) < shared_mem:
            k.max_dynamic_shared_size_bytes = shared_mem
            self._shared_set[fn] = shared_mem
        g = grid if isinstance(grid, tuple) else (grid,)
        k(g, (block,), args, shared_mem=shared_mem)

    def empty(self, shape: tuple[int, ...] | int, dtype: Any = np.float32) -> Any:
        return self.xp.empty(shape, dtype=dtype)

    def upload(self, a: np.ndarray, dtype: Any = None) -> Any:
        """A device copy of a host array (C-contiguous), copied on this device's stream so kernels see it."""
        with self.stream:
            return self.xp.asarray(np.ascontiguousarray(a, dtype=dtype))

    # ---- the row-wise kernels of ops.cu and dequant.cu, with their launch shapes

    def rms_norm(self, x: Any, w: Any, eps: float, out: Any = None, resid: Any = None) -> Any:
        """out = (resid +) rms_norm(x) * w over rows of x (n_rows, n)."""
        n_rows, n = x.shape
        out = self.empty((n_rows, n)) if out is None else out
        self.launch("rms_norm_rows", n_rows, 256, (x, w, out, arg(resid), np.int32(n), np.float32(eps)))
        return out

    def gated_act(self, gu: Any, hidden: int, act: int) -> Any:
        """act(gate) * up from the stacked (T, 2 * hidden) product."""
        t = gu.shape[0]
        out = self.empty((t, hidden))
        grid = min(GRID_CAP, max(1, math.ceil(t * hidden / 256)))
        self.launch("gated_act", grid, 256, (gu, out, np.int32(hidden), np.int32(t), np.int32(act)))
        return out

    def embed(self, table: Any, qtype: int, n_cols: int, ids: Any, n_ids: int, n_vocab: int,
              scale: float | None, out: Any) -> Any:
        """Rows ids[:n_ids] of a quantized table (ids may be the state buffer: its first int is the token)."""
        self.launch("embed_rows", n_ids, 128, (table, np.int32(qtype), np.int32(table.shape[1]), np.int32(n_cols),
                                               ids, np.int32(n_vocab), np.float32(scale or 1.0),
                                               np.int32(scale is not None), out))
        return out

    def argmax(self, x: Any, n: int, out: Any) -> None:
        """out[0] = argmax(x[:n]) (first on ties, NaN wins), on the device."""
        self.launch("argmax", 1, 1024, (x, np.int32(n), out))

    def synchronize(self) -> None:
        self.stream.synchronize()
