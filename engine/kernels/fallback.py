"""The NumPy fallback's products (tiles of dequantized rows times BLAS) and their helpers: scratch, threads, Q8_1
sums, the block mins of Q4_1 / Q5_1."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.quant.types import TYPES, GGMLType

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


def block_mins(product: Any, r0: int, r1: int) -> F32:
    """The fp16 min m of every Q4_1/Q5_1 block of rows [r0, r1) of a BlockProduct (bytes 2..3 of a block),
    (rows, nb) float32, from its GGUF blocks or its byte planes."""
    raw = product.blocks if product.blocks is not None else None if product.planar else product.weight
    if raw is not None and not product.planar:  # the GGUF blocks (or their copy: a fused legacy product's)
        b = raw[r0:r1].reshape(r1 - r0, -1, TYPES[product.qtype].type_size)
        m = np.ascontiguousarray(b[..., 2:4])
    else:  # byte planes (ng, nb, type_size, group): the m bytes of every row, in row order
        planes = product.weight.planes
        ng, nb, _, group = planes.shape
        m = np.ascontiguousarray(planes[:, :, 2:4, :].transpose(0, 3, 1, 2)).reshape(ng * group, nb, 2)[r0:r1]
    return m.view(np.float16)[..., 0].astype(np.float32)


def tiled_product(product: Any, act: Any, out: F32) -> None:
    """out = the activation's quantized values times tiles of the BlockProduct's rows, dequantized (BLAS); Q4_1 /
    Q5_1 add the rounding of their Q8_1 sums times the block mins."""
    xv = act.values_for(product.qtype)
    rows, n_in = product.tile_rows, product.n_in
    tile_buf = scratch(rows * n_in).reshape(rows, n_in)
    mins = product.qtype in (GGMLType.Q4_1, GGMLType.Q5_1)
    delta = q8_1_sum_rounding(act.bytes_for(product.qtype)) if mins else None
    for r0 in range(0, product.n_out, rows):
        r1 = min(product.n_out, r0 + rows)
        tile = product.dequantize_tile(r0, r1, tile_buf)
        np.matmul(xv, tile.T, out=out[:, r0:r1])
        if delta is not None:
            out[:, r0:r1] += delta @ block_mins(product, r0, r1).T
