"""One i-quant weight row against one activation row, as ggml_vec_dot_iq*_q8_K (x86 AVX2 path) computes it.

ggml-cpu/arch/x86/quants.c (what AVX2 and AVX-512 builds run) works per 256-weight super-block:

1. integer products: grid magnitudes (or IQ4 levels) times the sign-adjusted int8 activation, `maddubs`
   (byte pairs -> int16) then `madd` with the sub-block scale (int16 pairs -> int32), leave eight int32
   lanes; lane L collects the weights e with (e % 32) // 4 == L over the whole super-block. Integer sums are
   exact in any order, so each `_row_*` here adds every product straight into its lane;
2. acc[L] = fma(d, float(lane[L]), acc[L]) per super-block, d = fp16(d_x) * d_y rounded first;
3. the end: hsum_float_8(acc) = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), times the type's
   constant (IQ2_*: 0.125, IQ3_XXS: 0.25), plus the IQ1 delta terms: IQ1_S a scalar accumulator from the
   activation's bsums (`accum1 += d * sumi1`, which GCC contracts to an fma), IQ1_M a second lane vector.
IQ4_NL (32-weight blocks, Q8_0 activations) keeps two lane vectors for even and odd blocks, adds them before
the hsum, and a last odd block is added as a scalar fma.

Weights `w` and activations `x` are flat uint8 arrays read at byte offsets; Q8_K is | d:f32 | qs:256 | bsums:16
x i16 |, Q8_0 | d:f16 | qs:32 |. The drivers are in iquant_dot.py; the block layouts in engine/quant/iquants.py.
"""
from __future__ import annotations

import numpy as np

from engine.quant.iquant_grids import grid_bytes, ksigns, kvalues_iq4nl

from .activations import bits_f32, f16_to_f32, fma32, njit

Q8K = 292  # bytes of block_q8_K
Q80 = 34  # bytes of block_q8_0
# the tables as compile-time constants (int32 so the products need no casts)
_IQ2XXS = grid_bytes("iq2xxs_grid").astype(np.int32)
_IQ2XS = grid_bytes("iq2xs_grid").astype(np.int32)
_IQ2S = grid_bytes("iq2s_grid").astype(np.int32)
_IQ3XXS = grid_bytes("iq3xxs_grid").astype(np.int32)
_IQ3S = grid_bytes("iq3s_grid").astype(np.int32)
_IQ1S = grid_bytes("iq1s_grid").view(np.int8).astype(np.int32)
_KSIGNS = ksigns().astype(np.int32)
_KVALUES = kvalues_iq4nl().astype(np.int32)

_H = {"cache": True, "forceinline": True, "error_model": "numpy"}


@njit(**_H)
def _u16(a, o):
    return np.int32(np.int32(a[o]) | (np.int32(a[o + 1]) << 8))


@njit(**_H)
def _u32(a, o):
    return np.uint32(np.uint32(a[o]) | (np.uint32(a[o + 1]) << 8) | (np.uint32(a[o + 2]) << 16)
                     | (np.uint32(a[o + 3]) << 24))


@njit(**_H)
def _f16(a, o):
    return f16_to_f32(np.uint16(_u16(a, o)))


@njit(**_H)
def _i8(a, o):
    return (np.int32(a[o]) ^ 128) - 128


@njit(**_H)
def _i16(a, o):
    return (_u16(a, o) ^ 32768) - 32768


@njit(**_H)
def _hsum8(acc):
    """hsum_float_8 in ggml-cpu/arch/x86/quants.c."""
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))


@njit(**_H)
def _fma_lanes(d, lanes, acc):
    """acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc); lanes back to zero."""
    for L in range(8):
        acc[L] = fma32(d, np.float32(lanes[L]), acc[L])
        lanes[L] = 0


@njit(**_H)
def _signed_group(lanes, table, gi, signs, scale, x, xe, e0):
    """Weights e0 .. e0 + 7 of a sub-block: grid point `gi` with sign bits `signs` against x[xe:xe+8], scaled."""
    for k in range(8):
        p = table[gi, k] * _i8(x, xe + k)
        if (signs >> k) & 1:
            p = -p
        lanes[(e0 + k) >> 2] += scale * p


# ---- the Q8_K types: each returns the float32 dot of nb super-blocks at w[wo:], x[xo:]


@njit(cache=True, error_model="numpy")
def row_iq2_xxs(w, wo, nb, x, xo):
    """ggml_vec_dot_iq2_xxs_q8_K: 0.125 * hsum(acc)."""
    acc, lanes = np.zeros(8, np.float32), np.zeros(8, np.int32)
    for i in range(nb):
        b, y = wo + 66 * i, xo + Q8K * i
        for ib in range(8):
            a1 = _u32(w, b + 2 + 8 * ib + 4)
            ls = np.int32(2 * (a1 >> 28) + 1)
            for g in range(4):
                s = _KSIGNS[(a1 >> np.uint32(7 * g)) & 127]
                _signed_group(lanes, _IQ2XXS, w[b + 2 + 8 * ib + g], s, ls, x, y + 4 + 32 * ib + 8 * g, 8 * g)
        _fma_lanes(_f16(w, b) * bits_f32(_u32(x, y)), lanes, acc)
    return np.float32(0.125) * _hsum8(acc)


@njit(cache=True, error_model="numpy")
def row_iq2_xs(w, wo, nb, x, xo):
    """ggml_vec_dot_iq2_xs_q8_K: a scale per 16 weights, 0.125 * hsum(acc)."""
    acc, lanes = np.zeros(8, np.float32), np.zeros(8, np.int32)
    for i in range(nb):
        b, y = wo + 74 * i, xo + Q8K * i
        for ib in range(8):
            sc = np.int32(w[b + 66 + ib])
            for g in range(4):
                q = _u16(w, b + 2 + 2 * (4 * ib + g))
                ls = 2 * ((sc >> (4 * (g >> 1))) & 15) + 1
                _signed_group(lanes, _IQ2XS, q & 511, _KSIGNS[q >> 9], ls, x, y + 4 + 32 * ib + 8 * g, 8 * g)
        _fma_lanes(_f16(w, b) * bits_f32(_u32(x, y)), lanes, acc)
    return np.float32(0.125) * _hsum8(acc)


@njit(cache=True, error_model="numpy")
def row_iq2_s(w, wo, nb, x, xo):
    """ggml_vec_dot_iq2_s_q8_K: 10-bit grid indices, explicit sign bytes, a scale per 16; 0.125 * hsum(acc)."""
    acc, lanes = np.zeros(8, np.float32), np.zeros(8, np.int32)
    for i in range(nb):
        b, y = wo + 82 * i, xo + Q8K * i
        for ib in range(8):
            sc = np.int32(w[b + 74 + ib])
            qh = np.int32(w[b + 66 + ib])
            for g in range(4):
                gi = np.int32(w[b + 2 + 4 * ib + g]) | (((qh >> (2 * g)) & 3) << 8)
                ls = 2 * ((sc >> (4 * (g >> 1))) & 15) + 1
                _signed_group(lanes, _IQ2S, gi, np.int32(w[b + 34 + 4 * ib + g]), ls, x, y + 4 + 32 * ib + 8 * g, 8 * g)
        _fma_lanes(_f16(w, b) * bits_f32(_u32(x, y)), lanes, acc)
    return np.float32(0.125) * _hsum8(acc)


@njit(**_H)
def _iq3_point(lanes, table, gi, signs, shift, scale, x, xe, lane):
    """Four weights of an IQ3 grid point with sign bits `signs >> shift` against x[xe:xe+4]: one lane."""
    total = 0
    for k in range(4):
        p = table[gi, k] * _i8(x, xe + k)
        if (signs >> (shift + k)) & 1:
            p = -p
        total += p
    lanes[lane] += scale * total


@njit(cache=True, error_model="numpy")
def row_iq3_xxs(w, wo, nb, x, xo):
    """ggml_vec_dot_iq3_xxs_q8_K: 0.25 * hsum(acc)."""
    acc, lanes = np.zeros(8, np.float32), np.zeros(8, np.int32)
    for i in range(nb):
        b, y = wo + 98 * i, xo + Q8K * i
        for ib in range(8):
            aux = _u32(w, b + 66 + 4 * ib)
            ls = np.int32(2 * (aux >> 28) + 1)
            for j in range(8):
                s = _KSIGNS[(aux >> np.uint32(7 * (j >> 1))) & 127]
                _iq3_point(lanes, _IQ3XXS, w[b + 2 + 8 * ib + j], s, 4 * (j & 1), ls, x, y + 4 + 32 * ib + 4 * j, j)
        _fma_lanes(_f16(w, b) * bits_f32(_u32(x, y)), lanes, acc)
    return np.float32(0.25) * _hsum8(acc)


@njit(cache=True, error_model="numpy")
def row_iq3_s(w, wo, nb, x, xo):
    """ggml_vec_dot_iq3_s_q8_K: 9-bit grid indices, explicit sign bytes; hsum(acc)."""
    acc, lanes = np.zeros(8, np.float32), np.zeros(8, np.int32)
    for i in range(nb):
        b, y = wo + 110 * i, xo + Q8K * i
        for ib in range(8):
            qh = np.int32(w[b + 66 + ib])
            ls = 2 * ((np.int32(w[b + 106 + ib // 2]) >> (4 * (ib % 2))) & 15) + 1
            for j in range(8):
                gi = np.int32(w[b + 2 + 8 * ib + j]) | (((qh >> j) & 1) << 8)
                s = np.int32(w[b + 74 + 4 * ib + (j >> 1)])
                _iq3_point(lanes, _IQ3S, gi, s, 4 * (j & 1), ls, x, y + 4 + 32 * ib + 4 * j, j)
        _fma_lanes(_f16(w, b) * bits_f32(_u32(x, y)), lanes, acc)
    return _hsum8(acc)


@njit(**_H)
def _iq1_group(lanes, gi, scale, x, xe, e0):
    """Weights e0 .. e0 + 7 of a sub-block: iq1s_grid point gi (-1, 0, 1) against x[xe:xe+8], scaled."""
    for k in range(8):
        lanes[(e0 + k) >> 2] += scale * (_IQ1S[gi, k] * _i8(x, xe + k))


@njit(cache=True, error_model="numpy")
def row_iq1_s(w, wo, nb, x, xo):
    """ggml_vec_dot_iq1_s_q8_K: hsum(acc) + IQ1S_DELTA * accum1, accum1 from the bsums."""
    acc, lanes = np.zeros(8, np.float32), np.zeros(8, np.int32)
    accum1 = np.float32(0.0)
    for i in range(nb):
        b, y = wo + 50 * i, xo + Q8K * i
        sumi1 = 0
        for ib in range(8):
            qh = _u16(w, b + 34 + 2 * ib)
            ls = 2 * ((qh >> 12) & 7) + 1
            for g in range(4):
                gi = np.int32(w[b + 2 + 4 * ib + g]) | (((qh >> (3 * g)) & 7) << 8)
                _iq1_group(lanes, gi, ls, x, y + 4 + 32 * ib + 8 * g, 8 * g)
            bs = _i16(x, y + 260 + 4 * ib) + _i16(x, y + 262 + 4 * ib)
            sumi1 += bs * (-1 if qh & 0x8000 else 1) * ls
        d = bits_f32(_u32(x, y)) * _f16(w, b)
        _fma_lanes(d, lanes, acc)
        accum1 = fma32(d, np.float32(sumi1), accum1)
    return _hsum8(acc) + np.float32(0.125) * accum1


@njit(cache=True, error_model="numpy")
def row_iq1_m(w, wo, nb, x, xo):
    """ggml_vec_dot_iq1_m_q8_K: hsum(accum1) + IQ1M_DELTA * hsum(accum2), a 3-bit scale per 16 weights."""
    acc1, acc2 = np.zeros(8, np.float32), np.zeros(8, np.float32)
    lanes1, lanes2 = np.zeros(8, np.int32), np.zeros(8, np.int32)
    for i in range(nb):
        b, y = wo + 56 * i, xo + Q8K * i
        for ib in range(8):
            for g in range(4):
                h = 2 * ib + (g >> 1)  # the 16-weight half, and the qh byte
                ls = 2 * ((_u16(w, b + 48 + 2 * (h >> 2)) >> (3 * (h & 3))) & 7) + 1
                nib = (np.int32(w[b + 32 + h]) >> (4 * (g & 1))) & 15
                gi = np.int32(w[b + 4 * ib + g]) | ((nib & 7) << 8)
                _iq1_group(lanes1, gi, ls, x, y + 4 + 32 * ib + 8 * g, 8 * g)
                sign = -ls if nib & 8 else ls
                for k in range(8):
                    lanes2[(8 * g + k) >> 2] += sign * _i8(x, y + 4 + 32 * ib + 8 * g + k)
        sc = (_u16(w, b + 48) >> 12) | ((_u16(w, b + 50) >> 8) & 0xF0) | ((_u16(w, b + 52) >> 4) & 0xF00)
        sc |= _u16(w, b + 54) & 0xF000
        d = bits_f32(_u32(x, y)) * f16_to_f32(np.uint16(sc))
        _fma_lanes(d, lanes1, acc1)
        _fma_lanes(d, lanes2, acc2)
    return _hsum8(acc1) + np.float32(0.125) * _hsum8(acc2)


@njit(cache=True, error_model="numpy")
def row_iq4_xs(w, wo, nb, x, xo):
    """ggml_vec_dot_iq4_xs_q8_K: 6-bit signed scales per 32, the IQ4_NL levels; hsum(acc)."""
    acc, lanes = np.zeros(8, np.float32), np.zeros(8, np.int32)
    for i in range(nb):
        b, y = wo + 136 * i, xo + Q8K * i
        sh = _u16(w, b + 2)
        for ib in range(8):
            low = (np.int32(w[b + 4 + ib // 2]) >> (4 * (ib % 2))) & 15
            ls = (low | (((sh >> (2 * ib)) & 3) << 4)) - 32
            for j in range(16):
                q = np.int32(w[b + 8 + 16 * ib + j])
                xe = y + 4 + 32 * ib + j
                lanes[j >> 2] += ls * (_KVALUES[q & 15] * _i8(x, xe))
                lanes[(j + 16) >> 2] += ls * (_KVALUES[q >> 4] * _i8(x, xe + 16))
        _fma_lanes(_f16(w, b) * bits_f32(_u32(x, y)), lanes, acc)
    return _hsum8(acc)


@njit(**_H)
def _iq4_nl_block(w, b, x, y, lanes):
    """One IQ4_NL block against one Q8_0 block into the lanes; returns d_y * d_x."""
    for j in range(16):
        q = np.int32(w[b + 2 + j])
        lanes[j >> 2] += _KVALUES[q & 15] * _i8(x, y + 2 + j)
        lanes[(j + 16) >> 2] += _KVALUES[q >> 4] * _i8(x, y + 18 + j)
    return _f16(x, y) * _f16(w, b)


@njit(cache=True, error_model="numpy")
def row_iq4_nl(w, wo, nb, x, xo):
    """ggml_vec_dot_iq4_nl_q8_0: blocks in pairs into accum1 / accum2, hsum(accum1 + accum2), then the odd one."""
    acc1, acc2 = np.zeros(8, np.float32), np.zeros(8, np.float32)
    lanes = np.zeros(8, np.int32)
    ib = 0
    while ib + 1 < nb:
        _fma_lanes(_iq4_nl_block(w, wo + 18 * ib, x, xo + Q80 * ib, lanes), lanes, acc1)
        _fma_lanes(_iq4_nl_block(w, wo + 18 * (ib + 1), x, xo + Q80 * (ib + 1), lanes), lanes, acc2)
        ib += 2
    for L in range(8):
        acc1[L] = acc1[L] + acc2[L]
    sumf = _hsum8(acc1)
    if ib < nb:  # the scalar tail: sumf += d * (sumi1 + sumi2), contracted to an fma
        d = _iq4_nl_block(w, wo + 18 * ib, x, xo + Q80 * ib, lanes)
        sumf = fma32(d, np.float32(lanes.sum()), sumf)
    return sumf
