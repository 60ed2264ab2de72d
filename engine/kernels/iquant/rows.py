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
The eight lanes and accumulators are scalars (tuples), never arrays, so that they stay in registers.
"""
from __future__ import annotations

import numpy as np

from engine.quant.iquant_grids import grid_bytes, ksigns, kvalues_iq4nl

from engine.kernels.activations import bits_f32, f16_to_f32, fma32, njit

Q8K = 292  # bytes of block_q8_K
Q80 = 34  # bytes of block_q8_0
_Z = np.float32(0.0)
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
_ROW = {"cache": True, "error_model": "numpy"}


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
def _hsum8(a0, a1, a2, a3, a4, a5, a6, a7):
    """hsum_float_8 in ggml-cpu/arch/x86/quants.c."""
    return ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))


@njit(**_H)
def _s4(table, gi, k0, signs, x, xe):
    """One lane: weights k0 .. k0 + 3 of grid point gi, negated where `signs` has bit k set, times x[xe:xe+4]."""
    t = 0
    for k in range(4):
        t += table[gi, k0 + k] * _i8(x, xe + k) * (1 - 2 * ((signs >> (k0 + k)) & 1))
    return t


@njit(**_H)
def _p4(table, gi, k0, x, xe):
    """One lane without signs: weights k0 .. k0 + 3 of grid point gi times x[xe:xe+4]."""
    t = 0
    for k in range(4):
        t += table[gi, k0 + k] * _i8(x, xe + k)
    return t


@njit(**_H)
def _x4(x, xe):
    """The sum of x[xe:xe+4] (the IQ1_M delta lanes)."""
    return _i8(x, xe) + _i8(x, xe + 1) + _i8(x, xe + 2) + _i8(x, xe + 3)


@njit(**_H)
def _nl4(w, wb, shift, x, xe):
    """One IQ4 lane: kvalues_iq4nl[(w[wb + k] >> shift) & 15] * x[xe + k] for k < 4."""
    t = 0
    for k in range(4):
        t += _KVALUES[(np.int32(w[wb + k]) >> shift) & 15] * _i8(x, xe + k)
    return t


# ---- one super-block's eight int32 lanes, per type


@njit(**_H)
def _lanes_iq2(table, g, s, lo, hi, x, xe):
    """Four grid points g with sign bytes s (8 weights, two lanes each) of one sub-block; lo / hi scale the halves."""
    return (lo * _s4(table, g[0], 0, s[0], x, xe), lo * _s4(table, g[0], 4, s[0], x, xe + 4),
            lo * _s4(table, g[1], 0, s[1], x, xe + 8), lo * _s4(table, g[1], 4, s[1], x, xe + 12),
            hi * _s4(table, g[2], 0, s[2], x, xe + 16), hi * _s4(table, g[2], 4, s[2], x, xe + 20),
            hi * _s4(table, g[3], 0, s[3], x, xe + 24), hi * _s4(table, g[3], 4, s[3], x, xe + 28))


@njit(**_H)
def _lanes_iq2_xxs(w, b, x, y):
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0
    for ib in range(8):
        o, xe = b + 2 + 8 * ib, y + 4 + 32 * ib
        a1 = _u32(w, o + 4)
        ls = np.int32(2 * (a1 >> 28) + 1)
        s0, s1 = _KSIGNS[a1 & 127], _KSIGNS[(a1 >> 7) & 127]
        s2, s3 = _KSIGNS[(a1 >> 14) & 127], _KSIGNS[(a1 >> 21) & 127]
        g0, g1, g2, g3 = np.int32(w[o]), np.int32(w[o + 1]), np.int32(w[o + 2]), np.int32(w[o + 3])
        p = _lanes_iq2(_IQ2XXS, (g0, g1, g2, g3), (s0, s1, s2, s3), ls, ls, x, xe)
        l0, l1, l2, l3 = l0 + p[0], l1 + p[1], l2 + p[2], l3 + p[3]
        l4, l5, l6, l7 = l4 + p[4], l5 + p[5], l6 + p[6], l7 + p[7]
    return l0, l1, l2, l3, l4, l5, l6, l7


@njit(**_H)
def _lanes_iq2_xs(w, b, x, y):
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0
    for ib in range(8):
        o, xe = b + 2 + 8 * ib, y + 4 + 32 * ib
        sc = np.int32(w[b + 66 + ib])
        lo, hi = 2 * (sc & 15) + 1, 2 * (sc >> 4) + 1  # a scale per 16 weights
        q0, q1, q2, q3 = _u16(w, o), _u16(w, o + 2), _u16(w, o + 4), _u16(w, o + 6)
        s0, s1, s2, s3 = _KSIGNS[q0 >> 9], _KSIGNS[q1 >> 9], _KSIGNS[q2 >> 9], _KSIGNS[q3 >> 9]
        p = _lanes_iq2(_IQ2XS, (q0 & 511, q1 & 511, q2 & 511, q3 & 511), (s0, s1, s2, s3), lo, hi, x, xe)
        l0, l1, l2, l3 = l0 + p[0], l1 + p[1], l2 + p[2], l3 + p[3]
        l4, l5, l6, l7 = l4 + p[4], l5 + p[5], l6 + p[6], l7 + p[7]
    return l0, l1, l2, l3, l4, l5, l6, l7


@njit(**_H)
def _lanes_iq2_s(w, b, x, y):
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0
    for ib in range(8):
        o, so, xe = b + 2 + 4 * ib, b + 34 + 4 * ib, y + 4 + 32 * ib
        sc, qh = np.int32(w[b + 74 + ib]), np.int32(w[b + 66 + ib])
        lo, hi = 2 * (sc & 15) + 1, 2 * (sc >> 4) + 1
        g0 = np.int32(w[o]) | ((qh & 3) << 8)
        g1 = np.int32(w[o + 1]) | (((qh >> 2) & 3) << 8)
        g2 = np.int32(w[o + 2]) | (((qh >> 4) & 3) << 8)
        g3 = np.int32(w[o + 3]) | (((qh >> 6) & 3) << 8)
        s0, s1, s2, s3 = np.int32(w[so]), np.int32(w[so + 1]), np.int32(w[so + 2]), np.int32(w[so + 3])
        p = _lanes_iq2(_IQ2S, (g0, g1, g2, g3), (s0, s1, s2, s3), lo, hi, x, xe)
        l0, l1, l2, l3 = l0 + p[0], l1 + p[1], l2 + p[2], l3 + p[3]
        l4, l5, l6, l7 = l4 + p[4], l5 + p[5], l6 + p[6], l7 + p[7]
    return l0, l1, l2, l3, l4, l5, l6, l7


@njit(**_H)
def _lanes_iq3(table, gi, signs, ls, x, xe):
    """Eight IQ3 grid points (4 weights each, one lane each) of one sub-block; signs: 4 bytes, 8 bits each."""
    return (ls * _s4(table, gi[0], 0, signs[0], x, xe), ls * _s4(table, gi[1], 0, signs[0] >> 4, x, xe + 4),
            ls * _s4(table, gi[2], 0, signs[1], x, xe + 8), ls * _s4(table, gi[3], 0, signs[1] >> 4, x, xe + 12),
            ls * _s4(table, gi[4], 0, signs[2], x, xe + 16), ls * _s4(table, gi[5], 0, signs[2] >> 4, x, xe + 20),
            ls * _s4(table, gi[6], 0, signs[3], x, xe + 24), ls * _s4(table, gi[7], 0, signs[3] >> 4, x, xe + 28))


@njit(**_H)
def _lanes_iq3_xxs(w, b, x, y):
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0
    for ib in range(8):
        o = b + 2 + 8 * ib
        aux = _u32(w, b + 66 + 4 * ib)
        ls = np.int32(2 * (aux >> 28) + 1)
        signs = (_KSIGNS[aux & 127], _KSIGNS[(aux >> 7) & 127], _KSIGNS[(aux >> 14) & 127], _KSIGNS[(aux >> 21) & 127])
        gi = (np.int32(w[o]), np.int32(w[o + 1]), np.int32(w[o + 2]), np.int32(w[o + 3]),
              np.int32(w[o + 4]), np.int32(w[o + 5]), np.int32(w[o + 6]), np.int32(w[o + 7]))
        p = _lanes_iq3(_IQ3XXS, gi, signs, ls, x, y + 4 + 32 * ib)
        l0, l1, l2, l3 = l0 + p[0], l1 + p[1], l2 + p[2], l3 + p[3]
        l4, l5, l6, l7 = l4 + p[4], l5 + p[5], l6 + p[6], l7 + p[7]
    return l0, l1, l2, l3, l4, l5, l6, l7


@njit(**_H)
def _lanes_iq3_s(w, b, x, y):
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0
    for ib in range(8):
        o, so = b + 2 + 8 * ib, b + 74 + 4 * ib
        qh = np.int32(w[b + 66 + ib])
        ls = 2 * ((np.int32(w[b + 106 + ib // 2]) >> (4 * (ib % 2))) & 15) + 1
        signs = (np.int32(w[so]), np.int32(w[so + 1]), np.int32(w[so + 2]), np.int32(w[so + 3]))
        gi = (np.int32(w[o]) | ((qh & 1) << 8), np.int32(w[o + 1]) | (((qh >> 1) & 1) << 8),
              np.int32(w[o + 2]) | (((qh >> 2) & 1) << 8), np.int32(w[o + 3]) | (((qh >> 3) & 1) << 8),
              np.int32(w[o + 4]) | (((qh >> 4) & 1) << 8), np.int32(w[o + 5]) | (((qh >> 5) & 1) << 8),
              np.int32(w[o + 6]) | (((qh >> 6) & 1) << 8), np.int32(w[o + 7]) | (((qh >> 7) & 1) << 8))
        p = _lanes_iq3(_IQ3S, gi, signs, ls, x, y + 4 + 32 * ib)
        l0, l1, l2, l3 = l0 + p[0], l1 + p[1], l2 + p[2], l3 + p[3]
        l4, l5, l6, l7 = l4 + p[4], l5 + p[5], l6 + p[6], l7 + p[7]
    return l0, l1, l2, l3, l4, l5, l6, l7


@njit(**_H)
def _lanes_iq4_xs(w, b, x, y):
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0
    sh = _u16(w, b + 2)
    for ib in range(8):
        o, xe = b + 8 + 16 * ib, y + 4 + 32 * ib
        ls = (((np.int32(w[b + 4 + ib // 2]) >> (4 * (ib % 2))) & 15) | (((sh >> (2 * ib)) & 3) << 4)) - 32
        l0 += ls * _nl4(w, o, 0, x, xe)
        l1 += ls * _nl4(w, o + 4, 0, x, xe + 4)
        l2 += ls * _nl4(w, o + 8, 0, x, xe + 8)
        l3 += ls * _nl4(w, o + 12, 0, x, xe + 12)
        l4 += ls * _nl4(w, o, 4, x, xe + 16)
        l5 += ls * _nl4(w, o + 4, 4, x, xe + 20)
        l6 += ls * _nl4(w, o + 8, 4, x, xe + 24)
        l7 += ls * _nl4(w, o + 12, 4, x, xe + 28)
    return l0, l1, l2, l3, l4, l5, l6, l7


@njit(**_H)
def _lanes_iq4_nl(w, b, x, y):
    """One IQ4_NL block against one Q8_0 block (no sub-block scale)."""
    o, xe = b + 2, y + 2
    return (_nl4(w, o, 0, x, xe), _nl4(w, o + 4, 0, x, xe + 4), _nl4(w, o + 8, 0, x, xe + 8),
            _nl4(w, o + 12, 0, x, xe + 12), _nl4(w, o, 4, x, xe + 16), _nl4(w, o + 4, 4, x, xe + 20),
            _nl4(w, o + 8, 4, x, xe + 24), _nl4(w, o + 12, 4, x, xe + 28))


@njit(**_H)
def _lanes_iq1(grid_idx, ls, x, xe):
    """Four iq1s_grid points (8 weights each, two lanes each) of one sub-block, scaled."""
    g0, g1, g2, g3 = grid_idx
    return (ls * _p4(_IQ1S, g0, 0, x, xe), ls * _p4(_IQ1S, g0, 4, x, xe + 4),
            ls * _p4(_IQ1S, g1, 0, x, xe + 8), ls * _p4(_IQ1S, g1, 4, x, xe + 12),
            ls * _p4(_IQ1S, g2, 0, x, xe + 16), ls * _p4(_IQ1S, g2, 4, x, xe + 20),
            ls * _p4(_IQ1S, g3, 0, x, xe + 24), ls * _p4(_IQ1S, g3, 4, x, xe + 28))


# ---- rows: nb blocks of w from byte wo against the activation blocks of x from byte xo


@njit(**_H)
def _fma8(d, lanes, acc):
    """acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc)."""
    return (fma32(d, np.float32(lanes[0]), acc[0]), fma32(d, np.float32(lanes[1]), acc[1]),
            fma32(d, np.float32(lanes[2]), acc[2]), fma32(d, np.float32(lanes[3]), acc[3]),
            fma32(d, np.float32(lanes[4]), acc[4]), fma32(d, np.float32(lanes[5]), acc[5]),
            fma32(d, np.float32(lanes[6]), acc[6]), fma32(d, np.float32(lanes[7]), acc[7]))



@njit(**_ROW)
def row_iq2_xxs(w, wo, nb, x, xo):
    """ggml_vec_dot_iq2_xxs_q8_K: 0.125 * hsum(acc)."""
    acc = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    for i in range(nb):
        b, y = wo + 66 * i, xo + Q8K * i
        acc = _fma8(_f16(w, b) * bits_f32(_u32(x, y)), _lanes_iq2_xxs(w, b, x, y), acc)
    return np.float32(0.125) * _hsum8(*acc)


@njit(**_ROW)
def row_iq2_xs(w, wo, nb, x, xo):
    """ggml_vec_dot_iq2_xs_q8_K: a scale per 16 weights, 0.125 * hsum(acc)."""
    acc = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    for i in range(nb):
        b, y = wo + 74 * i, xo + Q8K * i
        acc = _fma8(_f16(w, b) * bits_f32(_u32(x, y)), _lanes_iq2_xs(w, b, x, y), acc)
    return np.float32(0.125) * _hsum8(*acc)


@njit(**_ROW)
def row_iq2_s(w, wo, nb, x, xo):
    """ggml_vec_dot_iq2_s_q8_K: 10-bit grid indices, explicit sign bytes, a scale per 16; 0.125 * hsum(acc)."""
    acc = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    for i in range(nb):
        b, y = wo + 82 * i, xo + Q8K * i
        acc = _fma8(_f16(w, b) * bits_f32(_u32(x, y)), _lanes_iq2_s(w, b, x, y), acc)
    return np.float32(0.125) * _hsum8(*acc)


@njit(**_ROW)
def row_iq3_xxs(w, wo, nb, x, xo):
    """ggml_vec_dot_iq3_xxs_q8_K: 0.25 * hsum(acc)."""
    acc = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    for i in range(nb):
        b, y = wo + 98 * i, xo + Q8K * i
        acc = _fma8(_f16(w, b) * bits_f32(_u32(x, y)), _lanes_iq3_xxs(w, b, x, y), acc)
    return np.float32(0.25) * _hsum8(*acc)


@njit(**_ROW)
def row_iq3_s(w, wo, nb, x, xo):
    """ggml_vec_dot_iq3_s_q8_K: 9-bit grid indices, explicit sign bytes; hsum(acc)."""
    acc = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    for i in range(nb):
        b, y = wo + 110 * i, xo + Q8K * i
        acc = _fma8(_f16(w, b) * bits_f32(_u32(x, y)), _lanes_iq3_s(w, b, x, y), acc)
    return _hsum8(*acc)


@njit(**_ROW)
def row_iq4_xs(w, wo, nb, x, xo):
    """ggml_vec_dot_iq4_xs_q8_K: 6-bit signed scales per 32, the IQ4_NL levels; hsum(acc)."""
    acc = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    for i in range(nb):
        b, y = wo + 136 * i, xo + Q8K * i
        acc = _fma8(_f16(w, b) * bits_f32(_u32(x, y)), _lanes_iq4_xs(w, b, x, y), acc)
    return _hsum8(*acc)


@njit(**_ROW)
def row_iq1_s(w, wo, nb, x, xo):
    """ggml_vec_dot_iq1_s_q8_K: hsum(acc) + IQ1S_DELTA * accum1, accum1 from the bsums."""
    acc = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    accum1 = _Z
    for i in range(nb):
        b, y = wo + 50 * i, xo + Q8K * i
        l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0
        sumi1 = 0
        for ib in range(8):
            qh, o = _u16(w, b + 34 + 2 * ib), b + 2 + 4 * ib
            ls = 2 * ((qh >> 12) & 7) + 1
            gi = (np.int32(w[o]) | ((qh & 7) << 8), np.int32(w[o + 1]) | (((qh >> 3) & 7) << 8),
                  np.int32(w[o + 2]) | (((qh >> 6) & 7) << 8), np.int32(w[o + 3]) | (((qh >> 9) & 7) << 8))
            p = _lanes_iq1(gi, ls, x, y + 4 + 32 * ib)
            l0, l1, l2, l3 = l0 + p[0], l1 + p[1], l2 + p[2], l3 + p[3]
            l4, l5, l6, l7 = l4 + p[4], l5 + p[5], l6 + p[6], l7 + p[7]
            bs = _i16(x, y + 260 + 4 * ib) + _i16(x, y + 262 + 4 * ib)
            sumi1 += bs * (1 - 2 * ((qh >> 15) & 1)) * ls
        d = bits_f32(_u32(x, y)) * _f16(w, b)
        acc = _fma8(d, (l0, l1, l2, l3, l4, l5, l6, l7), acc)
        accum1 = fma32(d, np.float32(sumi1), accum1)  # `accum1 += d * sumi1`, contracted
    return _hsum8(*acc) + np.float32(0.125) * accum1


@njit(**_ROW)
def row_iq1_m(w, wo, nb, x, xo):
    """ggml_vec_dot_iq1_m_q8_K: hsum(accum1) + IQ1M_DELTA * hsum(accum2), a 3-bit scale per 16 weights."""
    acc1 = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    acc2 = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    for i in range(nb):
        b, y = wo + 56 * i, xo + Q8K * i
        l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = 0
        m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = 0
        for ib in range(8):
            o, xe = b + 4 * ib, y + 4 + 32 * ib
            word = _u16(w, b + 48 + 2 * (ib >> 1)) >> (6 * (ib & 1))  # scales 2 ib, 2 ib + 1 at bits 0, 3
            lo, hi = 2 * (word & 7) + 1, 2 * ((word >> 3) & 7) + 1
            h0, h1 = np.int32(w[b + 32 + 2 * ib]), np.int32(w[b + 33 + 2 * ib])
            gi = (np.int32(w[o]) | ((h0 & 7) << 8), np.int32(w[o + 1]) | (((h0 >> 4) & 7) << 8),
                  np.int32(w[o + 2]) | ((h1 & 7) << 8), np.int32(w[o + 3]) | (((h1 >> 4) & 7) << 8))
            p = _lanes_iq1(gi, 1, x, xe)
            l0, l1, l2, l3 = l0 + lo * p[0], l1 + lo * p[1], l2 + lo * p[2], l3 + lo * p[3]
            l4, l5, l6, l7 = l4 + hi * p[4], l5 + hi * p[5], l6 + hi * p[6], l7 + hi * p[7]
            # the delta lanes: +-1 per group of 8 (bit 3 of its qh nibble), times the scale
            d0, d1 = lo * (1 - 2 * ((h0 >> 3) & 1)), lo * (1 - 2 * ((h0 >> 7) & 1))
            d2, d3 = hi * (1 - 2 * ((h1 >> 3) & 1)), hi * (1 - 2 * ((h1 >> 7) & 1))
            m0, m1 = m0 + d0 * _x4(x, xe), m1 + d0 * _x4(x, xe + 4)
            m2, m3 = m2 + d1 * _x4(x, xe + 8), m3 + d1 * _x4(x, xe + 12)
            m4, m5 = m4 + d2 * _x4(x, xe + 16), m5 + d2 * _x4(x, xe + 20)
            m6, m7 = m6 + d3 * _x4(x, xe + 24), m7 + d3 * _x4(x, xe + 28)
        sc = (_u16(w, b + 48) >> 12) | ((_u16(w, b + 50) >> 8) & 0xF0) | ((_u16(w, b + 52) >> 4) & 0xF00)
        sc |= _u16(w, b + 54) & 0xF000
        d = bits_f32(_u32(x, y)) * f16_to_f32(np.uint16(sc))
        acc1 = _fma8(d, (l0, l1, l2, l3, l4, l5, l6, l7), acc1)
        acc2 = _fma8(d, (m0, m1, m2, m3, m4, m5, m6, m7), acc2)
    return _hsum8(*acc1) + np.float32(0.125) * _hsum8(*acc2)


@njit(**_ROW)
def row_iq4_nl(w, wo, nb, x, xo):
    """ggml_vec_dot_iq4_nl_q8_0: blocks in pairs into accum1 / accum2, hsum(accum1 + accum2), then the odd one."""
    acc1 = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    acc2 = (_Z, _Z, _Z, _Z, _Z, _Z, _Z, _Z)
    ib = 0
    while ib + 1 < nb:
        b, y = wo + 18 * ib, xo + Q80 * ib
        acc1 = _fma8(_f16(x, y) * _f16(w, b), _lanes_iq4_nl(w, b, x, y), acc1)
        acc2 = _fma8(_f16(x, y + Q80) * _f16(w, b + 18), _lanes_iq4_nl(w, b + 18, x, y + Q80), acc2)
        ib += 2
    sumf = _hsum8(acc1[0] + acc2[0], acc1[1] + acc2[1], acc1[2] + acc2[2], acc1[3] + acc2[3],
                  acc1[4] + acc2[4], acc1[5] + acc2[5], acc1[6] + acc2[6], acc1[7] + acc2[7])
    if ib < nb:  # the scalar tail: sumf += d * (sumi1 + sumi2), contracted to an fma
        b, y = wo + 18 * ib, xo + Q80 * ib
        p = _lanes_iq4_nl(w, b, x, y)
        sumi = p[0] + p[1] + p[2] + p[3] + p[4] + p[5] + p[6] + p[7]
        sumf = fma32(_f16(x, y) * _f16(w, b), np.float32(sumi), sumf)
    return sumf
