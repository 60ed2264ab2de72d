"""NumPy reference of ggml's k-quant dot products (ggml_vec_dot_q*_K_q8_K, x86 AVX2 path).

These define what the compiled kernels in kquant_dot.py must return, bit for bit, and are the
fallback where numba is unavailable. ggml's AVX2 code (ggml-cpu/arch/x86/quants.c, also what
AVX-512 builds run) works on one 256-weight super-block at a time:

1. integer products: `maddubs` (pairs of bytes -> int16) then `madd` with the sub-block scale
   (pairs of int16 -> int32) leave eight int32 lanes; lane L collects the weights e with
   (e % 32) // 4 == L, summed over the whole super-block;
2. the lanes are converted to float (round to nearest) and accumulated over super-blocks with
   one fused multiply-add per lane: acc[L] = fma(d_x * d_y, float(lane[L]), acc[L]);
3. the minimum terms (Q2_K, Q4_K, Q5_K) come from the activation's bsums and have their own
   lanes: Q2_K folds them into `acc` first (lane L: mins 2L and 2L + 1), Q4_K keeps four
   lanes `acc_m`, Q5_K one scalar fma per super-block;
4. hsum_float_8 adds the lanes as ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).

Integer sums are exact in any order, so only the lane of each product and the float steps
matter. The lane sums are computed here as float64 matrix products (exact below 2^53) and the
fused multiply-add is emulated exactly in float64 with round-to-odd.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from engine.quant.kquants import k4_scales_mins, q3_k_scales
from engine.quant.types import TYPES, GGMLType

from engine.kernels.legacy.ref import (
    fma32_ref as fma_f32,  # one float32-fma emulation for every reference
)
from engine.kernels.q8k import q8k_fields

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]
QK_K = 256


def hsum8(acc: F32) -> F32:
    """Sum of the last axis (8 lanes) in the order of hsum_float_8 in ggml-cpu/arch/x86/quants.c."""
    a = acc.astype(np.float32)
    r = a[..., 4:8] + a[..., 0:4]
    return ((r[..., 0] + r[..., 2]) + (r[..., 1] + r[..., 3])).astype(np.float32)


def _f16(blocks: U8, at: int) -> F32:
    return np.ascontiguousarray(blocks[..., at : at + 2]).view("<f2")[..., 0].astype(np.float32)


def _lanes(wq: I64, qs: npt.NDArray[np.int8]) -> npt.NDArray[np.float64]:
    """Lane sums (m, r, nb, 8) of w * q8 for weights (r, nb, 256) and activations (m, nb, 256)."""
    r, nb = wq.shape[:2]
    m = qs.shape[0]
    # element 32c + 4L + t goes to lane L: gather each lane's 32 elements, then one product per block
    w = wq.reshape(r, nb, 8, 8, 4).transpose(1, 3, 0, 2, 4).reshape(nb, 8, r, 32).astype(np.float64)
    x = qs.reshape(m, nb, 8, 8, 4).transpose(1, 3, 2, 4, 0).reshape(nb, 8, 32, m).astype(np.float64)
    return np.matmul(w, x).transpose(3, 2, 0, 1)  # (m, r, nb, 8)


def _planes2(qs: U8) -> I64:
    """(r, nb, 64) -> (r, nb, 256) 2-bit quants, element 128h + 32j + l = (qs[32h + l] >> 2j) & 3."""
    q = (qs.reshape(*qs.shape[:-1], 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3
    return q.reshape(*qs.shape[:-1], QK_K).astype(np.int64)


def _nibbles(qs: U8) -> I64:
    """(r, nb, 128) -> (r, nb, 256): sub-block 2p is the low nibbles of qs[32p:32p+32], 2p + 1 the high."""
    q = (qs.reshape(*qs.shape[:-1], 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15
    return q.reshape(*qs.shape[:-1], QK_K).astype(np.int64)


def _bits(mask: U8) -> I64:
    """(r, nb, 32) -> (r, nb, 256): element 32b + l is bit b of mask[l]."""
    q = (mask.reshape(*mask.shape[:-1], 1, 32) >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1
    return q.reshape(*mask.shape[:-1], QK_K).astype(np.int64)


def _per_element(scales: I64, size: int) -> I64:
    return np.repeat(scales.astype(np.int64), size, axis=-1)


# ---- one function per type: (blocks (r, nb, type_size), d_y, qs, bsums) -> (m, r) float32


def _dot_q2_k(b: U8, yd: F32, qs, bsums) -> F32:
    # as ggml_vec_dot_q2_K_q8_K: mins folded into the lanes first, then the scaled quants
    sc = b[..., 0:16].astype(np.int64)
    lanes = _lanes(_per_element(sc & 15, 16) * _planes2(b[..., 16:80]), qs)
    mins = (sc >> 4)[None] * bsums.astype(np.int64)[:, None]  # (m, r, nb, 16)
    mlanes = mins[..., 0::2] + mins[..., 1::2]
    d = yd[:, None] * _f16(b, 80)[None]
    dmin = -yd[:, None] * _f16(b, 82)[None]
    acc = np.zeros(lanes.shape[:2] + (8,), np.float32)
    for i in range(lanes.shape[2]):
        acc = fma_f32(dmin[..., i, None], mlanes[..., i, :].astype(np.float32), acc)
        acc = fma_f32(d[..., i, None], lanes[..., i, :].astype(np.float32), acc)
    return hsum8(acc)


def _dot_q3_k(b: U8, yd: F32, qs, bsums) -> F32:
    # as ggml_vec_dot_q3_K_q8_K: q = low 2 bits - (4 where the hmask bit is clear), scale - 32
    r, nb = b.shape[:2]
    sc = q3_k_scales(b[..., 96:108].reshape(-1, 12)).reshape(r, nb, 16)
    q = _planes2(b[..., 32:96]) - 4 * (1 - _bits(b[..., 0:32]))
    lanes = _lanes(_per_element(sc, 16) * q, qs)
    d = yd[:, None] * _f16(b, 108)[None]
    acc = np.zeros(lanes.shape[:2] + (8,), np.float32)
    for i in range(nb):
        acc = fma_f32(d[..., i, None], lanes[..., i, :].astype(np.float32), acc)
    return hsum8(acc)


def _k4(b: U8) -> tuple[I64, I64]:
    r, nb = b.shape[:2]
    sc, mn = k4_scales_mins(b[..., 4:16].reshape(-1, 12))
    return sc.reshape(r, nb, 8).astype(np.int64), mn.reshape(r, nb, 8).astype(np.int64)


def _k4_min_lanes(mn: I64, bsums) -> I64:
    """The four int32 lanes of _mm_madd_epi16(mins, hadd(bsums)): lane k = mins 2k, 2k + 1."""
    pairs = bsums.astype(np.int64).reshape(*bsums.shape[:-1], 8, 2).sum(axis=-1)  # (m, nb, 8)
    prod = mn[None] * pairs[:, None]  # (m, r, nb, 8)
    return prod[..., 0::2] + prod[..., 1::2]  # (m, r, nb, 4)


def _dot_q4_k(b: U8, yd: F32, qs, bsums) -> F32:
    # as ggml_vec_dot_q4_K_q8_K: eight lanes for the quants, four (acc_m) for the mins
    sc, mn = _k4(b)
    lanes = _lanes(_per_element(sc, 32) * _nibbles(b[..., 16:144]), qs)
    mlanes = _k4_min_lanes(mn, bsums)
    d = yd[:, None] * _f16(b, 0)[None]
    dmin = -yd[:, None] * _f16(b, 2)[None]
    acc = np.zeros(lanes.shape[:2] + (8,), np.float32)
    acc_m = np.zeros(lanes.shape[:2] + (4,), np.float32)
    for i in range(lanes.shape[2]):
        acc_m = fma_f32(dmin[..., i, None], mlanes[..., i, :].astype(np.float32), acc_m)
        acc = fma_f32(d[..., i, None], lanes[..., i, :].astype(np.float32), acc)
    tail = (acc_m[..., 0] + acc_m[..., 2]) + (acc_m[..., 1] + acc_m[..., 3])
    return (hsum8(acc) + tail).astype(np.float32)


def _dot_q5_k(b: U8, yd: F32, qs, bsums) -> F32:
    # as ggml_vec_dot_q5_K_q8_K: the mins are one integer per super-block, summs += dmin * it (fused)
    sc, mn = _k4(b)
    q = _nibbles(b[..., 48:176]) + 16 * _bits(b[..., 16:48])
    lanes = _lanes(_per_element(sc, 32) * q, qs)
    msum = _k4_min_lanes(mn, bsums).sum(axis=-1)  # (m, r, nb)
    d = yd[:, None] * _f16(b, 0)[None]
    dmin = -yd[:, None] * _f16(b, 2)[None]
    acc = np.zeros(lanes.shape[:2] + (8,), np.float32)
    summs = np.zeros(lanes.shape[:2], np.float32)
    for i in range(lanes.shape[2]):
        summs = fma_f32(dmin[..., i], msum[..., i].astype(np.float32), summs)
        acc = fma_f32(d[..., i, None], lanes[..., i, :].astype(np.float32), acc)
    return (hsum8(acc) + summs).astype(np.float32)


def _dot_q6_k(b: U8, yd: F32, qs, bsums) -> F32:
    # as ggml_vec_dot_q6_K_q8_K: unsigned 6-bit quants, the -32 offset taken off through bsums
    low = (b[..., 0:128].reshape(*b.shape[:2], 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(2, 1)) & 15
    high = _planes2(b[..., 128:192])
    q = low.reshape(*b.shape[:2], QK_K).astype(np.int64) | (high << 4)
    sc = b[..., 192:208].view(np.int8).astype(np.int64)
    lanes = _lanes(_per_element(sc, 16) * q, qs)
    sub = sc[None] * bsums.astype(np.int64)[:, None]
    lanes = lanes - 32 * (sub[..., 0::2] + sub[..., 1::2])
    d = yd[:, None] * _f16(b, 208)[None]
    acc = np.zeros(lanes.shape[:2] + (8,), np.float32)
    for i in range(lanes.shape[2]):
        acc = fma_f32(d[..., i, None], lanes[..., i, :].astype(np.float32), acc)
    return hsum8(acc)


_DOTS: dict[GGMLType, Callable[..., F32]] = {
    GGMLType.Q2_K: _dot_q2_k,
    GGMLType.Q3_K: _dot_q3_k,
    GGMLType.Q4_K: _dot_q4_k,
    GGMLType.Q5_K: _dot_q5_k,
    GGMLType.Q6_K: _dot_q6_k,
}
KQUANT_TYPES = tuple(_DOTS)

# rows per chunk: bounds the (m, rows, nb, 256) temporaries
_CHUNK_ROWS = 256


def matmul_ref(qtype: GGMLType, blocks: U8, xq: U8) -> F32:
    """ggml's products of weight rows (n_rows, row_bytes) with Q8_K activations (m, bytes) -> (m, n_rows)."""
    info = TYPES[qtype]
    blocks = np.asarray(blocks, dtype=np.uint8)
    xq = np.atleast_2d(np.asarray(xq, dtype=np.uint8))
    n_rows, row_bytes = blocks.shape
    nb = row_bytes // info.type_size
    yd, qs, bsums = q8k_fields(xq)
    if yd.shape[1] != nb:
        raise ValueError(f"activation has {yd.shape[1]} Q8_K blocks, the {info.name} rows have {nb}")
    out = np.empty((xq.shape[0], n_rows), dtype=np.float32)
    dot = _DOTS[qtype]
    with np.errstate(all="ignore"):
        for r0 in range(0, n_rows, _CHUNK_ROWS):
            b = np.asarray(blocks[r0 : r0 + _CHUNK_ROWS]).reshape(-1, nb, info.type_size)
            out[:, r0 : r0 + len(b)] = dot(b, yd, qs, bsums)
    return out
