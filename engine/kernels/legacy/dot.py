"""Compiled products of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights with Q8 activations, as ggml-cpu computes them.

ggml's AVX2 dot products (ggml_vec_dot_q4_0_q8_0 and siblings in ggml-cpu/arch/x86/quants.c, which
the AVX-512 builds also run) multiply a block's 32 weight integers by the 32 activation quants and
sum the products into eight int32 lanes, lane k holding weights 4k..4k+3 (maddubs + madd, or one
dpbusd with VNNI). Each lane is converted to float and accumulated over the blocks of the row with
one fused multiply-add, `acc[k] = fma(d_w * d_x, float(lane[k]), acc[k])`; Q4_1 and Q5_1 also add
`m_w * s_x` per block into a scalar `summs` (an fp16 x fp16 product, exact in float32). The row's
value is hsum_float_8(acc) (+ summs): ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).

Here the lane sums are formed in float32 from integer-valued floats: every product and partial
sum is an integer below 2^24, so they are exact in any order, and the float steps above are then
done in ggml's order, so the result is ggml's bit for bit. `_dot_group` vectorises across rows
(ROW_GROUP rows per group, one SIMD lane per row) on one group's byte planes (legacy_repack.py);
legacy_products.py runs it over all groups in parallel.

Weight integers per type (ggml-common.h block layouts, also drawn in engine/quant/legacy.py):
  Q4_0 nibble - 8    Q4_1 nibble    Q5_0 (nibble | bit << 4) - 16    Q5_1 nibble | bit << 4    Q8_0 int8
The constant offsets of Q4_0 / Q5_0 start each lane's sum at -8 (or -16) times the sum of its four
activation quants. Not reproduced: x86's `_mm256_sign_epi8` turns a product with an activation of
-128 against a negative weight into its negative; ggml's quantizers give -128 only for non-finite rows.
"""
from __future__ import annotations

import numpy as np

from engine.quant.types import GGMLType

from engine.kernels.activations import (
    f16_to_f32,
    fma32,
    i8_to_f32,
    njit,
    prefer_512,
    u8_and,
    u8_shr,
    u8_to_f32,
)
from engine.kernels.legacy.repack import ROW_GROUP

G = ROW_GROUP
ACC = 9  # per row: the eight ggml lanes and the m * s sum
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = (int(t) for t in (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                                                  GGMLType.Q5_1, GGMLType.Q8_0))
Q4_0_X8 = 100  # Q4_0 weights llama.cpp repacks (rows in eights): the q4_0_8x8 numbers, see _dot_group
BLOCK_BYTES = {Q4_0: 18, Q4_1: 20, Q5_0: 22, Q5_1: 24, Q8_0: 34}
ACT_BYTES = {Q4_0: 34, Q4_1: 36, Q5_0: 34, Q5_1: 36, Q8_0: 34}  # block_q8_0 / block_q8_1
BLOCK_BYTES_ARR = np.array([BLOCK_BYTES.get(k, 0) for k in range(16)], dtype=np.int64)  # by type id, for numba
_M15 = np.uint8(15)
_U = np.uint64  # unsigned indices: numba adds no negative-index check to them
_S4 = np.uint8(4)
_B0, _B4 = np.int64(0), np.int64(4)
_I = np.int64  # plane offsets passed as _I(j), not literals: a literal compiles one more specialisation per value


@njit(cache=True, forceinline=True)
def _y32(yf, i, b):
    """The 32 activation quants of block b of activation i as a tuple (values held in registers)."""
    y = yf[i, b]
    return (y[0], y[1], y[2], y[3], y[4], y[5], y[6], y[7], y[8], y[9], y[10], y[11], y[12], y[13], y[14], y[15],
            y[16], y[17], y[18], y[19], y[20], y[21], y[22], y[23], y[24], y[25], y[26], y[27], y[28], y[29],
            y[30], y[31])


@njit(cache=True, forceinline=True)
def _yb32(y):
    """y[p] * 16 / 2^(p % 8): the weight of bit (p % 8) of a qh byte, which is 16 when set (exact)."""
    s0, s1, s2, s3 = np.float32(16.0), np.float32(8.0), np.float32(4.0), np.float32(2.0)
    s4, s5, s6, s7 = np.float32(1.0), np.float32(0.5), np.float32(0.25), np.float32(0.125)
    return (y[0] * s0, y[1] * s1, y[2] * s2, y[3] * s3, y[4] * s4, y[5] * s5, y[6] * s6, y[7] * s7,
            y[8] * s0, y[9] * s1, y[10] * s2, y[11] * s3, y[12] * s4, y[13] * s5, y[14] * s6, y[15] * s7,
            y[16] * s0, y[17] * s1, y[18] * s2, y[19] * s3, y[20] * s4, y[21] * s5, y[22] * s6, y[23] * s7,
            y[24] * s0, y[25] * s1, y[26] * s2, y[27] * s3, y[28] * s4, y[29] * s5, y[30] * s6, y[31] * s7)


@njit(cache=True, forceinline=True)
def _offsets(y, scale):
    """scale * (sum of lane k's four quants), k = 0..7: where a lane of `nibble - 8` weights starts."""
    return (scale * (y[0] + y[1] + y[2] + y[3]), scale * (y[4] + y[5] + y[6] + y[7]),
            scale * (y[8] + y[9] + y[10] + y[11]), scale * (y[12] + y[13] + y[14] + y[15]),
            scale * (y[16] + y[17] + y[18] + y[19]), scale * (y[20] + y[21] + y[22] + y[23]),
            scale * (y[24] + y[25] + y[26] + y[27]), scale * (y[28] + y[29] + y[30] + y[31]))


@njit(cache=True, forceinline=True)
def _nibble_lanes(pl, o, j, y0, y1, y2, y3, z0, z1, z2, z3, lo, hi):
    """Add the products of qs planes j..j+3 to a low-nibble lane (quants y) and a high-nibble lane (quants z)."""
    q0, q1, q2, q3 = pl[o + _U(j * G)], pl[o + _U((j + 1) * G)], pl[o + _U((j + 2) * G)], pl[o + _U((j + 3) * G)]
    lo = fma32(u8_to_f32(u8_and(q0, _M15)), y0, lo)
    lo = fma32(u8_to_f32(u8_and(q1, _M15)), y1, lo)
    lo = fma32(u8_to_f32(u8_and(q2, _M15)), y2, lo)
    lo = fma32(u8_to_f32(u8_and(q3, _M15)), y3, lo)
    hi = fma32(u8_to_f32(u8_shr(q0, _S4)), z0, hi)
    hi = fma32(u8_to_f32(u8_shr(q1, _S4)), z1, hi)
    hi = fma32(u8_to_f32(u8_shr(q2, _S4)), z2, hi)
    hi = fma32(u8_to_f32(u8_shr(q3, _S4)), z3, hi)
    return lo, hi


@njit(cache=True, forceinline=True)
def _bit_lane(q, m0, y0, y1, y2, y3, acc):
    """Add four fifth bits of the qh byte q, at bit m0..m0+3 (masks), times their scaled quants to acc."""
    acc = fma32(u8_to_f32(u8_and(q, np.uint8(1 << m0))), y0, acc)
    acc = fma32(u8_to_f32(u8_and(q, np.uint8(2 << m0))), y1, acc)
    acc = fma32(u8_to_f32(u8_and(q, np.uint8(4 << m0))), y2, acc)
    return fma32(u8_to_f32(u8_and(q, np.uint8(8 << m0))), y3, acc)


@njit(cache=True, forceinline=True)
def _bit_lanes(pl, o, jh, yb, l0, l1, l2, l3, l4, l5, l6, l7):
    """Add the fifth bits of the eight lanes: lane k has bits 4k..4k+3 of qh, in byte jh + k // 2."""
    h0, h1 = pl[o + _U(jh * G)], pl[o + _U((jh + 1) * G)]
    h2, h3 = pl[o + _U((jh + 2) * G)], pl[o + _U((jh + 3) * G)]
    return (_bit_lane(h0, _B0, yb[0], yb[1], yb[2], yb[3], l0),
            _bit_lane(h0, _B4, yb[4], yb[5], yb[6], yb[7], l1),
            _bit_lane(h1, _B0, yb[8], yb[9], yb[10], yb[11], l2),
            _bit_lane(h1, _B4, yb[12], yb[13], yb[14], yb[15], l3),
            _bit_lane(h2, _B0, yb[16], yb[17], yb[18], yb[19], l4),
            _bit_lane(h2, _B4, yb[20], yb[21], yb[22], yb[23], l5),
            _bit_lane(h3, _B0, yb[24], yb[25], yb[26], yb[27], l6),
            _bit_lane(h3, _B4, yb[28], yb[29], yb[30], yb[31], l7))


@njit(cache=True, forceinline=True)
def _int8_lane(pl, o, j, y0, y1, y2, y3):
    """One lane of a Q8_0 block: the int8 quants at planes j..j+3 times y0..y3."""
    acc = i8_to_f32(pl[o + _U(j * G)]) * y0
    acc = fma32(i8_to_f32(pl[o + _U((j + 1) * G)]), y1, acc)
    acc = fma32(i8_to_f32(pl[o + _U((j + 2) * G)]), y2, acc)
    return fma32(i8_to_f32(pl[o + _U((j + 3) * G)]), y3, acc)


@njit(cache=True, forceinline=True)
def _nibble_block(pl, o, j, y, c):
    """The eight lanes of a 4-bit block whose qs start at plane j, each started at c[k]."""
    l0, l4 = _nibble_lanes(pl, o, j, y[0], y[1], y[2], y[3], y[16], y[17], y[18], y[19], c[0], c[4])
    l1, l5 = _nibble_lanes(pl, o, j + 4, y[4], y[5], y[6], y[7], y[20], y[21], y[22], y[23], c[1], c[5])
    l2, l6 = _nibble_lanes(pl, o, j + 8, y[8], y[9], y[10], y[11], y[24], y[25], y[26], y[27], c[2], c[6])
    l3, l7 = _nibble_lanes(pl, o, j + 12, y[12], y[13], y[14], y[15], y[28], y[29], y[30], y[31], c[3], c[7])
    return l0, l1, l2, l3, l4, l5, l6, l7


@njit(cache=True, forceinline=True)
def _add_lanes(acc, r, d, l0, l1, l2, l3, l4, l5, l6, l7):
    """acc[k] = fma(d, lane k, acc[k]) for the eight lanes of row r (_mm256_fmadd_ps)."""
    acc[r] = fma32(d, l0, acc[r])
    acc[_U(G) + r] = fma32(d, l1, acc[_U(G) + r])
    acc[_U(2 * G) + r] = fma32(d, l2, acc[_U(2 * G) + r])
    acc[_U(3 * G) + r] = fma32(d, l3, acc[_U(3 * G) + r])
    acc[_U(4 * G) + r] = fma32(d, l4, acc[_U(4 * G) + r])
    acc[_U(5 * G) + r] = fma32(d, l5, acc[_U(5 * G) + r])
    acc[_U(6 * G) + r] = fma32(d, l6, acc[_U(6 * G) + r])
    acc[_U(7 * G) + r] = fma32(d, l7, acc[_U(7 * G) + r])


@njit(cache=True, forceinline=True)
def _add_summs(acc, r, m, s):
    """summs += m * s for row r (ggml_vec_dot_q4_1_q8_1 / q5_1)."""
    acc[_U(8 * G) + r] = fma32(m, s, acc[_U(8 * G) + r])


@njit(cache=True, forceinline=True)
def _f16(pl, o, j):
    """The fp16 field at planes j, j+1 of one row of a block, as float32."""
    return f16_to_f32(np.uint16(pl[o + _U(j * G)]) | (np.uint16(pl[o + _U((j + 1) * G)]) << np.uint16(8)))


KIND = Q4_0  # the weight type: a constant in each compiled copy of _dot_group (engine.kernels.variants)


def _dot_group(pl, size, yd, ys, yf, i, acc):
    """Accumulate activation i against every block of one group's planes into acc (ACC*G,), for weights of type
    KIND (a plain function: engine.kernels.legacy.products compiles a copy per type, KIND a constant in each).

    pl is the group's planes flattened: byte j of block b of row r at (b * size + j) * G + r. All
    indices are unsigned constants plus r, so numba emits no negative-index fix-up and LLVM sees
    plain affine accesses: it vectorises each r loop (one SIMD lane per row) without runtime
    alias checks against every plane. The types' loops stay in this one function (helpers compiled
    apart and inlined afterwards came out 30% slower: LLVM vectorises them before it inlines them).
    """
    prefer_512()
    z = np.float32(0.0)
    zeros = (z, z, z, z, z, z, z, z)
    for b in range(pl.shape[0] // (size * G)):
        y = _y32(yf, i, b)
        dy = yd[i, b]
        sy = ys[i, b]
        base = _U(b) * _U(size * G)
        if KIND == Q4_0 or KIND == Q4_0_X8:
            c = _offsets(y, np.float32(-8.0))
            for r in range(_U(G)):
                o = base + r
                l0, l1, l2, l3, l4, l5, l6, l7 = _nibble_block(pl, o, _I(2), y, c)
                if KIND == Q4_0:
                    _add_lanes(acc, r, _f16(pl, o, _I(0)) * dy, l0, l1, l2, l3, l4, l5, l6, l7)
                else:  # llama.cpp's repacked q4_0_8x8: the lanes' exact sum, one fma into lane 0 (the rest stay +0)
                    isum = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
                    acc[r] = fma32(isum, _f16(pl, o, _I(0)) * dy, acc[r])
        elif KIND == Q4_1:
            for r in range(_U(G)):
                o = base + r
                l0, l1, l2, l3, l4, l5, l6, l7 = _nibble_block(pl, o, _I(4), y, zeros)
                _add_lanes(acc, r, _f16(pl, o, _I(0)) * dy, l0, l1, l2, l3, l4, l5, l6, l7)
                _add_summs(acc, r, _f16(pl, o, _I(2)), sy)
        elif KIND == Q5_0:
            c = _offsets(y, np.float32(-16.0))
            yb = _yb32(y)
            for r in range(_U(G)):
                o = base + r
                l0, l1, l2, l3, l4, l5, l6, l7 = _nibble_block(pl, o, _I(6), y, c)
                l0, l1, l2, l3, l4, l5, l6, l7 = _bit_lanes(pl, o, _I(2), yb, l0, l1, l2, l3, l4, l5, l6, l7)
                _add_lanes(acc, r, _f16(pl, o, _I(0)) * dy, l0, l1, l2, l3, l4, l5, l6, l7)
        elif KIND == Q5_1:
            yb = _yb32(y)
            for r in range(_U(G)):
                o = base + r
                l0, l1, l2, l3, l4, l5, l6, l7 = _nibble_block(pl, o, _I(8), y, zeros)
                l0, l1, l2, l3, l4, l5, l6, l7 = _bit_lanes(pl, o, _I(4), yb, l0, l1, l2, l3, l4, l5, l6, l7)
                # ggml_vec_dot_q5_1_q8_1: fma(q, dx * dy, acc), the same value as fma(dx * dy, q, acc)
                _add_lanes(acc, r, _f16(pl, o, _I(0)) * dy, l0, l1, l2, l3, l4, l5, l6, l7)
                _add_summs(acc, r, _f16(pl, o, _I(2)), sy)
        else:  # Q8_0
            for r in range(_U(G)):
                o = base + r
                _add_lanes(acc, r, _f16(pl, o, _I(0)) * dy,
                           _int8_lane(pl, o, _I(2), y[0], y[1], y[2], y[3]),
                           _int8_lane(pl, o, _I(6), y[4], y[5], y[6], y[7]),
                           _int8_lane(pl, o, _I(10), y[8], y[9], y[10], y[11]),
                           _int8_lane(pl, o, _I(14), y[12], y[13], y[14], y[15]),
                           _int8_lane(pl, o, _I(18), y[16], y[17], y[18], y[19]),
                           _int8_lane(pl, o, _I(22), y[20], y[21], y[22], y[23]),
                           _int8_lane(pl, o, _I(26), y[24], y[25], y[26], y[27]),
                           _int8_lane(pl, o, _I(30), y[28], y[29], y[30], y[31]))


@njit(cache=True, forceinline=True)
def _finish(acc, out, i, row0, n, has_m):
    """out[i, row0 + r] = hsum_float_8(lanes) (+ summs for Q4_1 / Q5_1) for the first n rows of a group."""
    for r in range(n):
        a0, a1, a2, a3 = acc[r], acc[G + r], acc[2 * G + r], acc[3 * G + r]
        a4, a5, a6, a7 = acc[4 * G + r], acc[5 * G + r], acc[6 * G + r], acc[7 * G + r]
        total = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))
        out[i, row0 + r] = total + acc[8 * G + r] if has_m else total
