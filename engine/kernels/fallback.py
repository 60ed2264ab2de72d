"""Helpers of the NumPy fallback's products (tiles of dequantized rows times BLAS): scratch, threads, Q8_1 sums."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]

_SCRATCH = threading.local()


@contextmanager
def one_numba_thread() -> Iterator[None]:
    """Dequantize prefill tiles on one numba thread: BLAS, which multiplies them next, keeps its threads spinning
    between calls, and a parallel kernel interleaved with it waits for cores (measured: 3x slower prefill)."""
    import numba  # noqa: PLC0415 - only reached when the compiled kernels are in use

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def scratch(n: int) -> F32:
    """A float32 buffer of at least n values, one per thread, reused by every tile (fresh pages cost page faults)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < n:
        buf = _SCRATCH.buf = np.empty(n, np.float32)
    return buf[:n]


def q8_1_sum_rounding(xq: U8) -> F32:
    """Per Q8_1 block, s - d * sum(qs): ggml's Q4_1/Q5_1 products add min * s with s rounded to fp16 (T, nb)."""
    b = xq.reshape(xq.shape[0], -1, 36)
    d = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
    s = np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0].astype(np.float32)
    sums = b[..., 4:].view(np.int8).sum(axis=-1, dtype=np.int32).astype(np.float32)
    return s - d * sums
