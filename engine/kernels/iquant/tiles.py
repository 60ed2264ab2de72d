"""I-quant batches: each weight row decoded once to signed int8 values and integer scales, then every activation.

vec_dot's numbers (iquant_rows.py) need, per super-block, the eight int32 lanes of sum(scale * w * q8) and one
fused multiply-add per lane. A batch of m activations repeats that for every activation, so here a row is first
decoded (grid lookups, signs, nibble levels, sub-block scales) into
  wq  (n,) int8     the signed integer weight (grid value * sign, or kvalues_iq4nl[nibble])
  s16 (n / 16,)     the integer scale of each 16 weights (2 ls + 1, ls - 32, or 1 for IQ4_NL)
  d   (nb,) f32     the block's fp16 scale
and the lanes come from plain int8 dot products. Integer sums are exact in any order, and the float steps are
those of ggml_vec_dot_*, so every value is the one gemv gives (the tests hold both to llama.cpp's vec_dot).
IQ1_S / IQ1_M keep iquant_dot's gemm (their delta terms need more than wq).
"""
from __future__ import annotations

import numpy as np

from engine.kernels.activations import bits_f32, fma32, njit, prange
from engine.kernels.iquant.rows import (
    _IQ2S,
    _IQ2XS,
    _IQ2XXS,
    _IQ3S,
    _IQ3XXS,
    _KSIGNS,
    _KVALUES,
    Q8K,
    Q80,
    _f16,
    _hsum8,
    _i8,
    _u16,
    _u32,
)

_H = {"cache": True, "forceinline": True, "error_model": "numpy"}
_KERNEL = {"parallel": True, "cache": True, "error_model": "numpy"}
_ROWS = 4  # weight rows per parallel task


@njit(**_H)
def _put8(wq, e, table, gi, signs):
    """Weights e .. e + 7: grid point gi with the sign bits `signs` (bit k set: weight k negative)."""
    for k in range(8):
        v = table[gi, k]
        wq[e + k] = -v if (signs >> k) & 1 else v


@njit(**_H)
def _put4(wq, e, table, gi, signs):
    for k in range(4):
        v = table[gi, k]
        wq[e + k] = -v if (signs >> k) & 1 else v


@njit(**_H)
def _decode(kind, w, b, wq, s16, e0, j16):
    """One block of row w at byte b into wq[e0:], s16[j16:]; returns the block's fp16 scale as float32."""
    if kind == 0:  # IQ2_XXS
        for ib in range(8):
            o = b + 2 + 8 * ib
            a1 = _u32(w, o + 4)
            s16[j16 + 2 * ib] = s16[j16 + 2 * ib + 1] = np.int32(2 * (a1 >> 28) + 1)
            for g in range(4):
                _put8(wq, e0 + 32 * ib + 8 * g, _IQ2XXS, np.int32(w[o + g]), _KSIGNS[(a1 >> np.uint32(7 * g)) & 127])
    elif kind == 1:  # IQ2_XS
        for ib in range(8):
            sc = np.int32(w[b + 66 + ib])
            s16[j16 + 2 * ib], s16[j16 + 2 * ib + 1] = 2 * (sc & 15) + 1, 2 * (sc >> 4) + 1
            for g in range(4):
                q = _u16(w, b + 2 + 2 * (4 * ib + g))
                _put8(wq, e0 + 32 * ib + 8 * g, _IQ2XS, q & 511, _KSIGNS[q >> 9])
    elif kind == 2:  # IQ2_S
        for ib in range(8):
            sc, qh = np.int32(w[b + 74 + ib]), np.int32(w[b + 66 + ib])
            s16[j16 + 2 * ib], s16[j16 + 2 * ib + 1] = 2 * (sc & 15) + 1, 2 * (sc >> 4) + 1
            for g in range(4):
                gi = np.int32(w[b + 2 + 4 * ib + g]) | (((qh >> (2 * g)) & 3) << 8)
                _put8(wq, e0 + 32 * ib + 8 * g, _IQ2S, gi, np.int32(w[b + 34 + 4 * ib + g]))
    elif kind == 3:  # IQ3_XXS
        for ib in range(8):
            aux = _u32(w, b + 66 + 4 * ib)
            s16[j16 + 2 * ib] = s16[j16 + 2 * ib + 1] = np.int32(2 * (aux >> 28) + 1)
            for j in range(8):
                s = _KSIGNS[(aux >> np.uint32(7 * (j >> 1))) & 127] >> (4 * (j & 1))
                _put4(wq, e0 + 32 * ib + 4 * j, _IQ3XXS, np.int32(w[b + 2 + 8 * ib + j]), s)
    elif kind == 4:  # IQ3_S
        for ib in range(8):
            qh = np.int32(w[b + 66 + ib])
            ls = 2 * ((np.int32(w[b + 106 + ib // 2]) >> (4 * (ib % 2))) & 15) + 1
            s16[j16 + 2 * ib] = s16[j16 + 2 * ib + 1] = ls
            for j in range(8):
                gi = np.int32(w[b + 2 + 8 * ib + j]) | (((qh >> j) & 1) << 8)
                _put4(wq, e0 + 32 * ib + 4 * j, _IQ3S, gi, np.int32(w[b + 74 + 4 * ib + (j >> 1)]) >> (4 * (j & 1)))
    elif kind == 5:  # IQ4_XS
        sh = _u16(w, b + 2)
        for ib in range(8):
            ls = (((np.int32(w[b + 4 + ib // 2]) >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)) - 32
            s16[j16 + 2 * ib] = s16[j16 + 2 * ib + 1] = ls
            for j in range(16):
                q = np.int32(w[b + 8 + 16 * ib + j])
                wq[e0 + 32 * ib + j], wq[e0 + 32 * ib + 16 + j] = _KVALUES[q & 15], _KVALUES[q >> 4]
    else:  # IQ4_NL, one block of 32
        s16[j16] = s16[j16 + 1] = 1
        for j in range(16):
            q = np.int32(w[b + 2 + j])
            wq[e0 + j], wq[e0 + 16 + j] = _KVALUES[q & 15], _KVALUES[q >> 4]
    return _f16(w, b)


@njit(**_H)
def _lane(wq, e, x, xe):
    t = 0
    for k in range(4):
        t += np.int32(wq[e + k]) * _i8(x, xe + k)
    return t


@njit(**_H)
def _lanes32(wq, e, s_lo, s_hi, x, xe):
    """The eight lanes of 32 decoded weights: the first four scaled by s_lo, the last four by s_hi."""
    return (s_lo * _lane(wq, e, x, xe), s_lo * _lane(wq, e + 4, x, xe + 4), s_lo * _lane(wq, e + 8, x, xe + 8),
            s_lo * _lane(wq, e + 12, x, xe + 12), s_hi * _lane(wq, e + 16, x, xe + 16),
            s_hi * _lane(wq, e + 20, x, xe + 20), s_hi * _lane(wq, e + 24, x, xe + 24),
            s_hi * _lane(wq, e + 28, x, xe + 28))


@njit(**_H)
def _fma8(d, p, a):
    return (fma32(d, np.float32(p[0]), a[0]), fma32(d, np.float32(p[1]), a[1]), fma32(d, np.float32(p[2]), a[2]),
            fma32(d, np.float32(p[3]), a[3]), fma32(d, np.float32(p[4]), a[4]), fma32(d, np.float32(p[5]), a[5]),
            fma32(d, np.float32(p[6]), a[6]), fma32(d, np.float32(p[7]), a[7]))


@njit(**_H)
def _dot_q8k(wq, s16, dw, nb, x, scale):
    """One decoded row against one Q8_K row: ggml_vec_dot_iq*_q8_K's float steps, times the type's constant."""
    z = np.float32(0.0)
    acc = (z, z, z, z, z, z, z, z)
    for i in range(nb):
        y = Q8K * i
        l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0
        for ib in range(8):
            e = 256 * i + 32 * ib
            p = _lanes32(wq, e, s16[e >> 4], s16[(e >> 4) + 1], x, y + 4 + 32 * ib)
            l0, l1, l2, l3 = l0 + p[0], l1 + p[1], l2 + p[2], l3 + p[3]
            l4, l5, l6, l7 = l4 + p[4], l5 + p[5], l6 + p[6], l7 + p[7]
        acc = _fma8(dw[i] * bits_f32(_u32(x, y)), (l0, l1, l2, l3, l4, l5, l6, l7), acc)
    return scale * _hsum8(acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7])


@njit(**_H)
def _dot_q80(wq, dw, nb, x):
    """One decoded IQ4_NL row against one Q8_0 row, as ggml_vec_dot_iq4_nl_q8_0 (pairs, then the odd block)."""
    z = np.float32(0.0)
    a1 = (z, z, z, z, z, z, z, z)
    a2 = (z, z, z, z, z, z, z, z)
    ib = 0
    while ib + 1 < nb:
        y = Q80 * ib
        a1 = _fma8(_f16(x, y) * dw[ib], _lanes32(wq, 32 * ib, 1, 1, x, y + 2), a1)
        a2 = _fma8(_f16(x, y + Q80) * dw[ib + 1], _lanes32(wq, 32 * ib + 32, 1, 1, x, y + Q80 + 2), a2)
        ib += 2
    sumf = _hsum8(a1[0] + a2[0], a1[1] + a2[1], a1[2] + a2[2], a1[3] + a2[3],
                  a1[4] + a2[4], a1[5] + a2[5], a1[6] + a2[6], a1[7] + a2[7])
    if ib < nb:
        y = Q80 * ib
        p = _lanes32(wq, 32 * ib, 1, 1, x, y + 2)
        sumi = p[0] + p[1] + p[2] + p[3] + p[4] + p[5] + p[6] + p[7]
        sumf = fma32(_f16(x, y) * dw[ib], np.float32(sumi), sumf)
    return sumf


@njit(**_H)
def _dot_q80_x8(wq, dw, nb, x):
    """One decoded IQ4_NL row against one Q8_0 row as llama.cpp's repacked iq4_nl_8x8 kernels: one fma per block."""
    acc = np.float32(0.0)
    for ib in range(nb):
        p = _lanes32(wq, 32 * ib, 1, 1, x, Q80 * ib + 2)
        sumi = p[0] + p[1] + p[2] + p[3] + p[4] + p[5] + p[6] + p[7]
        acc = fma32(np.float32(sumi), dw[ib] * _f16(x, Q80 * ib), acc)
    return acc


# kind -> (block bytes, weights per block, the constant of the final sum); 7 is IQ4_NL with the iq4_nl_8x8 order
_SIZES = ((66, 256, 0.125), (74, 256, 0.125), (82, 256, 0.125), (98, 256, 0.25), (110, 256, 1.0), (136, 256, 1.0),
          (18, 32, 1.0), (18, 32, 1.0))


@njit(**_KERNEL)
def gemm_decoded(kind, blocks, xq, out):
    """out[a, r] = vec_dot(row r, xq[a]) for i-quant `kind` (0 IQ2_XXS .. 6 IQ4_NL, 7 IQ4_NL as iq4_nl_8x8), each
    row decoded once."""
    type_size, block, scale = _SIZES[kind]
    nb = blocks.shape[1] // type_size
    n = nb * block
    n_rows, m = blocks.shape[0], xq.shape[0]
    for task in prange((n_rows + _ROWS - 1) // _ROWS):
        wq = np.empty(n, np.int8)
        s16 = np.empty(n // 16, np.int32)
        dw = np.empty(nb, np.float32)
        for r in range(task * _ROWS, min(n_rows, (task + 1) * _ROWS)):
            w = blocks[r]
            for i in range(nb):
                dw[i] = _decode(kind, w, type_size * i, wq, s16, block * i, (block // 16) * i)
            for a in range(m):
                if kind == 7:
                    out[a, r] = _dot_q80_x8(wq, dw, nb, xq[a])
                elif kind == 6:
                    out[a, r] = _dot_q80(wq, dw, nb, xq[a])
                else:
                    out[a, r] = _dot_q8k(wq, s16, dw, nb, xq[a], np.float32(scale))
    return out
