"""MUL_MAT_ID's few rows per expert, for every expert of a batch in one parallel region.

A prompt through a Mixture-of-Experts layer routes a few rows to each of many experts (Qwen3.6-35B-A3B: 128
tokens x 8 of 256 experts, about four rows each). One compiled call per expert costs about 13 us of dispatch
and thread wake-up, beside some 45 us of work for four rows: a tenth of the products' time in a quiet run, and
far more whenever a thread wakes late (a 2-core VM, 128 experts of four rows: 11 against 12.5 ms at best, 16
against 41-78 ms in noisy runs). The kernels here take every such expert at once: the experts' weights as
addresses (each a C-contiguous array that the caller keeps alive), the rows grouped by expert (group e is rows
starts[e]:starts[e + 1] of xq and out), and split (expert, weight group) tasks over the threads. Each row's value
is computed by the same inlined code as the one-expert kernels, so the bits are theirs:

  gemv_groups_q4_k_8x8(addrs, ng, row_bytes, xq, starts, out)   repacked Q4_K experts (ng groups of eight rows,
                                                                 row_bytes each): kquant_repack.gemv_rows_q4_k_8x8
  gemv_groups_q6_k(addrs, n_rows, row_bytes, xq, starts, out)   plain Q6_K experts: kquant_dot.gemv_rows_q6_k

xq holds Q8_K rows (quantize_q8_k), out float32 rows of the experts' output width.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit, prange, types
from numba.extending import intrinsic

from engine.kernels.kquant.dot import _dot_q6_k
from engine.kernels.kquant.repack import GROUP_BYTES, Q4K_BYTES, TILE, _tile_gemv
from engine.kernels.q8k import Q8K_BLOCK_BYTES

_KERNEL = {"parallel": True, "error_model": "numpy", "cache": True}
u64 = np.uint64
Q6K_BYTES = 210


@intrinsic
def _bytes_at(typingctx, addr):
    """The uint8 pointer at an address (an array's data, kept alive by the caller)."""
    ptr = types.CPointer(types.uint8)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(ptr))

    return ptr(types.uint64), codegen


def addresses(weights: list[np.ndarray]) -> np.ndarray:
    """The data addresses of same-shaped, C-contiguous uint8 weights (the kernels' `addrs`)."""
    return np.array([w.ctypes.data for w in weights], np.uint64)


@njit(cache=True)
def _check(addrs, row_bytes, block_bytes, xq, starts, out, out_width):
    """Blocks per row, checked against the activations and the output."""
    if row_bytes <= 0 or row_bytes % block_bytes:
        raise ValueError("row_bytes must be a whole number of blocks")
    nb = row_bytes // block_bytes
    if xq.ndim != 2 or (xq.size and xq.strides[1] != 1) or xq.shape[1] != nb * Q8K_BLOCK_BYTES:
        raise ValueError("xq must be (m, bytes) Q8_K rows as long as the weight rows")
    if out.ndim != 2 or out.shape[0] != xq.shape[0] or out.shape[1] != out_width or (out.size and out.strides[1] != 4):
        raise ValueError("out must be (m, experts' rows) float32 with contiguous rows")
    if starts.shape[0] != addrs.shape[0] + 1 or starts[0] != 0 or starts[-1] != xq.shape[0]:
        raise ValueError("starts must split xq's rows into one group per address")
    for e in range(addrs.shape[0]):
        if starts[e + 1] < starts[e]:
            raise ValueError("starts must not decrease")
    return nb


@njit(**_KERNEL)
def gemv_groups_q4_k_8x8(addrs, ng, row_bytes, xq, starts, out):
    """out[starts[e]:starts[e + 1]] = gemv_rows_q4_k_8x8 of the repacked expert at addrs[e] ((ng, row_bytes)
    uint8) with those rows of xq, for every e."""
    nb = _check(addrs, row_bytes, GROUP_BYTES, xq, starts, out, ng * 8)
    xs, os = u64(xq.strides[0]), u64(out.strides[0])
    for task in prange(addrs.shape[0] * ng):
        e = task // ng
        g = task % ng
        a, z = starts[e], starts[e + 1]
        w = carray(_bytes_at(addrs[e]), (ng, row_bytes))
        for a0 in range(a, z, TILE):
            _tile_gemv(w, u64(g) * u64(row_bytes), Q4K_BYTES, GROUP_BYTES, nb, xq, u64(a0) * xs, xs, min(TILE, z - a0),
                       out, u64(a0) * os + u64(32 * g), os)
    return out


@njit(**_KERNEL)
def gemv_groups_q6_k(addrs, n_rows, row_bytes, xq, starts, out):
    """out[starts[e]:starts[e + 1]] = gemv_rows_q6_k of the Q6_K expert at addrs[e] ((n_rows, row_bytes) uint8)
    with those rows of xq, for every e."""
    nb = _check(addrs, row_bytes, Q6K_BYTES, xq, starts, out, n_rows)
    xs = u64(xq.strides[0])
    for task in prange(addrs.shape[0] * n_rows):
        e = task // n_rows
        r = task % n_rows
        w = carray(_bytes_at(addrs[e]), (n_rows, row_bytes))
        for a in range(starts[e], starts[e + 1]):
            out[a, r] = _dot_q6_k(w, u64(r) * u64(row_bytes), nb, xq, u64(a) * xs)
    return out

