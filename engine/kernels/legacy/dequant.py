"""Compiled dequantization of row ranges of legacy-quant and float weights into a float32 scratch tile.

For the prefill path, which multiplies a dequantized tile by BLAS and drops it. The values are
engine.quant.dequantize_rows's to the bit (dequantize_row_* in ggml-quants.c), including the two
roundings of Q4_1 / Q5_1 (`x * d`, then `+ m`; never fused). Raw blocks and byte planes
(legacy_repack.Repacked) both work; rows are split across threads.
"""
from __future__ import annotations

import numpy as np

from engine.kernels.activations import (
    bits_f32,
    f16_to_f32,
    i8_to_f32,
    njit,
    prange,
    prefer_512,
    u8_and,
    u8_shr,
    u8_to_f32,
)
from engine.kernels.legacy.dot import BLOCK_BYTES_ARR, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from engine.kernels.legacy.repack import QK, ROW_GROUP

_ROWS = 8  # rows per parallel task
_M15 = np.uint8(15)
_S4 = np.uint8(4)


@njit(cache=True, forceinline=True)
def _f16_at(row, o):
    return f16_to_f32(np.uint16(row[o]) | (np.uint16(row[o + 1]) << np.uint16(8)))


@njit(cache=True, forceinline=True)
def _qh_at(row, o):
    return (np.uint32(row[o]) | (np.uint32(row[o + 1]) << np.uint32(8)) | (np.uint32(row[o + 2]) << np.uint32(16))
            | (np.uint32(row[o + 3]) << np.uint32(24)))


@njit(cache=True)
def _dequant_row(kind, row, size, dst):
    """One row's blocks (bytes) into dst (n_cols,), as dequantize_row_<kind>.

    Two passes: the weight integers as floats (exact), then the scale, `d * q` or `q * d + m`
    in ggml's two roundings. The second pass is a plain loop LLVM vectorises; done in one pass,
    interleaving byte loads with float stores, it stays scalar.
    """
    prefer_512()
    nb = row.shape[0] // size
    head = 4 if kind == Q4_1 else (6 if kind == Q5_0 else (8 if kind == Q5_1 else 2))
    offset = np.float32(8.0) if kind == Q4_0 else (np.float32(16.0) if kind == Q5_0 else np.float32(0.0))
    nq = size - head  # 16 (32 for Q8_0); a runtime bound keeps LLVM from unrolling the j loops, so it vectorises them
    for b in range(nb):
        o = b * size + head
        c = b * QK
        if kind == Q8_0:
            for j in range(nq):
                dst[c + j] = i8_to_f32(row[o + j])
        elif kind == Q4_0 or kind == Q4_1:
            for j in range(nq):
                q = row[o + j]
                dst[c + j] = u8_to_f32(u8_and(q, _M15)) - offset
                dst[c + 16 + j] = u8_to_f32(u8_shr(q, _S4)) - offset
        else:  # Q5_0, Q5_1: bit j of the little-endian qh is the fifth bit of weight j
            qh = _qh_at(row, o - 4)
            for j in range(nq):
                q = row[o + j]
                lo = np.float32(((qh >> np.uint32(j)) & np.uint32(1)) << np.uint32(4))
                hi = np.float32(((qh >> np.uint32(j + 16)) & np.uint32(1)) << np.uint32(4))
                dst[c + j] = (u8_to_f32(u8_and(q, _M15)) + lo) - offset
                dst[c + 16 + j] = (u8_to_f32(u8_shr(q, _S4)) + hi) - offset
    for b in range(nb):
        o = b * size
        c = b * QK
        d = _f16_at(row, o)
        if kind == Q4_1 or kind == Q5_1:
            m = _f16_at(row, o + 2)
            for j in range(QK):
                dst[c + j] = dst[c + j] * d + m
        else:
            for j in range(QK):
                dst[c + j] = d * dst[c + j]


@njit(cache=True, parallel=True)
def dequant(kind, raw, planes, planar, r0, r1, out):
    """Rows [r0, r1) of a legacy weight into out (r1 - r0, n_cols) float32.

    raw (n_rows, row_bytes) read-only GGUF blocks, or when `planar` byte planes (ng, nb * size * ROW_GROUP);
    the other is a dummy, so there is one specialisation for every call.
    """
    size = BLOCK_BYTES_ARR[kind]
    nb = out.shape[1] // QK
    n = r1 - r0
    if planar:  # a whole group at a time: each 64-byte plane line is read once for its 64 rows
        g0 = r0 // ROW_GROUP
        g1 = (r1 + ROW_GROUP - 1) // ROW_GROUP
        rb = nb * size
        for gi in prange(g1 - g0):
            g = g0 + gi
            rows = np.empty((ROW_GROUP, rb), np.uint8)
            for k in range(rb):
                line = k * ROW_GROUP
                for lane in range(ROW_GROUP):
                    rows[lane, k] = planes[g, line + lane]
            for lane in range(ROW_GROUP):
                r = g * ROW_GROUP + lane
                if r0 <= r < r1:
                    _dequant_row(kind, rows[lane], size, out[r - r0])
        return
    for t in prange((n + _ROWS - 1) // _ROWS):
        row = np.empty(nb * size, np.uint8)
        for r in range(t * _ROWS, min(n, (t + 1) * _ROWS)):
            if planar:
                g, lane = divmod(r0 + r, ROW_GROUP)
                for k in range(nb * size):
                    row[k] = planes[g, k * ROW_GROUP + lane]
            else:
                row[:] = raw[r0 + r]
            _dequant_row(kind, row, size, out[r])


@njit(cache=True, parallel=True)
def dequant_f16(w, r0, r1, out):
    """Rows [r0, r1) of fp16 bits (n_rows, n) into out float32 (exact)."""
    prefer_512()
    n = r1 - r0
    for t in prange((n + _ROWS - 1) // _ROWS):
        for r in range(t * _ROWS, min(n, (t + 1) * _ROWS)):
            for e in range(w.shape[1]):
                out[r, e] = f16_to_f32(w[r0 + r, e])


@njit(cache=True, parallel=True)
def dequant_bf16(w, r0, r1, out):
    """Rows [r0, r1) of bf16 bits (n_rows, n) into out float32 (the bits become the top half)."""
    prefer_512()
    n = r1 - r0
    for t in prange((n + _ROWS - 1) // _ROWS):
        for r in range(t * _ROWS, min(n, (t + 1) * _ROWS)):
            for e in range(w.shape[1]):
                out[r, e] = bits_f32(np.uint32(w[r0 + r, e]) << np.uint32(16))
