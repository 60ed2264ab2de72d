"""The k-quant super-block types Q2_K .. Q6_K: bit layouts, dequantizers and packers.

A super-block holds QK_K = 256 weights in sub-blocks of 16 (Q2_K, Q3_K, Q6_K) or 32 (Q4_K,
Q5_K), each with its own quantized scale (and min), themselves scaled by the fp16 `d`
(and `dmin`). Dequantizers map (n_blocks, type_size) uint8 -> (n_blocks, 256) float32 with the
same float operations, in the same order, as dequantize_row_q*_K in ggml-quants.c. The `pack_*`
helpers are their inverses, used by the quantizers in kquantize.py.

Layouts (bytes; element e of the super-block; h = e // 128, j = (e % 128) // 32, l = e % 32):
  Q2_K  | scales:16 | qs:64 | d:2 | dmin:2 |                          84 bytes, 2.625 bpw
        scales[s] = scale_s | min_s << 4 (s = e // 16)
        q = (qs[32h + l] >> 2j) & 3;        w = d*scale_s * q - dmin*min_s
  Q3_K  | hmask:32 | qs:64 | scales:12 | d:2 |                       110 bytes, 3.4375 bpw
        6-bit scales: low nibbles in bytes 0..7 (s < 8 low, s >= 8 high nibble of byte s % 8),
        top 2 bits in byte 8 + s % 4 at bit 2 * (s // 4)
        q = ((qs[32h + l] >> 2j) & 3) - (hmask[l] bit (4h + j) ? 0 : 4); w = d*(scale_s - 32) * q
  Q4_K  | d:2 | dmin:2 | scales:12 | qs:128 |                        144 bytes, 4.5 bpw
        6-bit scale and min per 32 (get_scale_min_k4): s < 4 in bytes s and s + 4; s >= 4 low
        nibbles in byte s + 4, top 2 bits in the top of bytes s - 4 and s
        q = nibble (s even: low, odd: high) of qs[32 (s // 2) + l]; w = d*sc_s * q - dmin*m_s
  Q5_K  | d:2 | dmin:2 | scales:12 | qh:32 | qs:128 |                176 bytes, 5.5 bpw
        as Q4_K, plus bit s of qh[l] as the fifth bit of q
  Q6_K  | ql:128 | qh:64 | scales:16 (int8) | d:2 |                  210 bytes, 6.5625 bpw
        k = e % 128 // 32: low 4 bits from ql[64h + 32 (k % 2) + l] (k < 2: low nibble, else
        high), top 2 bits (qh[32h + l] >> 2k) & 3; w = d*scales_s * (q - 32)
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .floats import f16_bits_to_f32

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
Ints = npt.NDArray[np.integer]
QK_K = 256

_SHIFT_2BIT = np.array([0, 2, 4, 6], dtype=np.uint8)
_SHIFT_NIBBLE = np.array([0, 4], dtype=np.uint8)
_SHIFT_BIT = np.arange(8, dtype=np.uint8)


def _f16(blocks: U8, offset: int) -> F32:
    """The fp16 field at `offset` of every block, as a (n_blocks, 1) float32 column."""
    return f16_bits_to_f32(blocks[:, offset : offset + 2].view("<u2"))


def _two_bit_planes(qs: U8) -> U8:
    """(n, 64) -> (n, 256) 2-bit quants: element 128h + 32j + l is (qs[32h + l] >> 2j) & 3."""
    q = (qs.reshape(-1, 2, 1, 32) >> _SHIFT_2BIT.reshape(1, 1, 4, 1)) & np.uint8(3)
    return q.reshape(-1, QK_K)


def _bit_planes(mask: U8) -> U8:
    """(n, 32) -> (n, 256) bits: element 32b + l is bit b of mask[l]."""
    return ((mask.reshape(-1, 1, 32) >> _SHIFT_BIT.reshape(1, 8, 1)) & np.uint8(1)).reshape(-1, QK_K)


def _nibble_pairs(qs: U8) -> U8:
    """(n, 128) -> (n, 256) 4-bit quants: sub-block 2p takes the low nibbles of qs[32p:32p+32], 2p+1 the high."""
    q = (qs.reshape(-1, 4, 1, 32) >> _SHIFT_NIBBLE.reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    return q.reshape(-1, QK_K)


def q3_k_scales(packed: U8) -> npt.NDArray[np.int8]:
    """(n, 12) packed 6-bit scales -> (n, 16) int8 in [-32, 31], as the kmask shuffle in dequantize_row_q3_K."""
    low = np.concatenate([packed[:, :8] & np.uint8(0x0F), packed[:, :8] >> np.uint8(4)], axis=1)
    high = (packed[:, None, 8:12] >> _SHIFT_2BIT.reshape(1, 4, 1)) & np.uint8(3)
    return (low | (high.reshape(-1, 16) << np.uint8(4))).view(np.int8) - np.int8(32)


def k4_scales_mins(packed: U8) -> tuple[U8, U8]:
    """(n, 12) packed 6-bit scales and mins -> two (n, 8) arrays, as get_scale_min_k4."""
    a, b, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    top = np.uint8(6)
    sc = np.concatenate([a & np.uint8(63), (c & np.uint8(0x0F)) | ((a >> top) << np.uint8(4))], axis=1)
    mn = np.concatenate([b & np.uint8(63), (c >> np.uint8(4)) | ((b >> top) << np.uint8(4))], axis=1)
    return sc, mn


# ---- dequantizers


def dequantize_q2_k(blocks: U8) -> F32:
    """Q2_K super-blocks to float32, as dequantize_row_q2_K."""
    sc = blocks[:, 0:16]
    dl = _f16(blocks, 80) * (sc & np.uint8(0x0F)).astype(np.float32)  # (n, 16)
    ml = _f16(blocks, 82) * (sc >> np.uint8(4)).astype(np.float32)
    q = _two_bit_planes(blocks[:, 16:80]).reshape(-1, 16, 16).astype(np.float32)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(-1, QK_K)


def dequantize_q3_k(blocks: U8) -> F32:
    """Q3_K super-blocks to float32, as dequantize_row_q3_K."""
    dl = _f16(blocks, 108) * q3_k_scales(blocks[:, 96:108]).astype(np.float32)  # (n, 16)
    q = _two_bit_planes(blocks[:, 32:96]) | (_bit_planes(blocks[:, 0:32]) << np.uint8(2))
    q = (q.view(np.int8) - np.int8(4)).reshape(-1, 16, 16).astype(np.float32)
    return (dl[:, :, None] * q).reshape(-1, QK_K)


def dequantize_q4_k(blocks: U8) -> F32:
    """Q4_K super-blocks to float32, as dequantize_row_q4_K."""
    sc, mn = k4_scales_mins(blocks[:, 4:16])
    dl = _f16(blocks, 0) * sc.astype(np.float32)  # (n, 8)
    ml = _f16(blocks, 2) * mn.astype(np.float32)
    q = _nibble_pairs(blocks[:, 16:144]).reshape(-1, 8, 32).astype(np.float32)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(-1, QK_K)


def dequantize_q5_k(blocks: U8) -> F32:
    """Q5_K super-blocks to float32, as dequantize_row_q5_K."""
    sc, mn = k4_scales_mins(blocks[:, 4:16])
    dl = _f16(blocks, 0) * sc.astype(np.float32)
    ml = _f16(blocks, 2) * mn.astype(np.float32)
    q = _nibble_pairs(blocks[:, 48:176]) | (_bit_planes(blocks[:, 16:48]) << np.uint8(4))
    q = q.reshape(-1, 8, 32).astype(np.float32)
    return (dl[:, :, None] * q - ml[:, :, None]).reshape(-1, QK_K)


def dequantize_q6_k(blocks: U8) -> F32:
    """Q6_K super-blocks to float32, as dequantize_row_q6_K."""
    low = (blocks[:, 0:128].reshape(-1, 2, 1, 64) >> _SHIFT_NIBBLE.reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    high = (blocks[:, 128:192].reshape(-1, 2, 1, 32) >> _SHIFT_2BIT.reshape(1, 1, 4, 1)) & np.uint8(3)
    q = low.reshape(-1, QK_K) | (high.reshape(-1, QK_K) << np.uint8(4))
    q = (q.view(np.int8) - np.int8(32)).reshape(-1, 16, 16).astype(np.float32)
    dl = _f16(blocks, 208) * blocks[:, 192:208].view(np.int8).astype(np.float32)
    return (dl[:, :, None] * q).reshape(-1, QK_K)


# ---- packers: quants in element order (n, 256) -> the byte fields above


def _or_reduce(parts: Ints, axis: int) -> Ints:
    return np.bitwise_or.reduce(parts, axis=axis)


def pack_two_bit(q: Ints) -> U8:
    """(n, 256) quants 0..3 -> (n, 64) qs: qs[32h + l] = q[128h + l] | q[128h + 32 + l] << 2 | ..."""
    parts = (q.reshape(-1, 2, 4, 32).astype(np.uint8) & np.uint8(3)) << _SHIFT_2BIT.reshape(1, 1, 4, 1)
    return _or_reduce(parts, axis=2).reshape(-1, 64)


def pack_bits(bits: Ints) -> U8:
    """(n, 256) bits -> (n, 32) masks, element 32b + l at bit b of byte l."""
    parts = bits.reshape(-1, 8, 32).astype(np.uint8) << _SHIFT_BIT.reshape(1, 8, 1)
    return _or_reduce(parts, axis=1)


def pack_nibble_pairs(q: Ints) -> U8:
    """(n, 256) quants -> (n, 128): qs[32p + l] = q[64p + l] & 15 | (q[64p + 32 + l] & 15) << 4."""
    parts = (q.reshape(-1, 4, 2, 32).astype(np.uint8) & np.uint8(0x0F)) << _SHIFT_NIBBLE.reshape(1, 1, 2, 1)
    return _or_reduce(parts, axis=2).reshape(-1, 128)


def pack_q3_k_scales(l6: Ints) -> U8:
    """(n, 16) 6-bit values 0..63 -> (n, 12) bytes, as the packing in quantize_row_q3_K_ref."""
    l6 = l6.astype(np.uint8)
    low = (l6[:, :8] & np.uint8(0x0F)) | ((l6[:, 8:] & np.uint8(0x0F)) << np.uint8(4))
    high = ((l6 >> np.uint8(4)).reshape(-1, 4, 4) & np.uint8(3)) << _SHIFT_2BIT.reshape(1, 4, 1)
    return np.concatenate([low, _or_reduce(high, axis=1)], axis=1)


def pack_k4_scales_mins(ls: Ints, lm: Ints) -> U8:
    """(n, 8) 6-bit scales and mins -> (n, 12) bytes, the inverse of get_scale_min_k4."""
    ls, lm = ls.astype(np.uint8), lm.astype(np.uint8)
    top = np.uint8(6)
    a = ls[:, :4] | ((ls[:, 4:] >> np.uint8(4)) << top)
    b = lm[:, :4] | ((lm[:, 4:] >> np.uint8(4)) << top)
    c = (ls[:, 4:] & np.uint8(0x0F)) | ((lm[:, 4:] & np.uint8(0x0F)) << np.uint8(4))
    return np.concatenate([a, b, c], axis=1)


def pack_q6_k_quants(q: Ints) -> tuple[U8, U8]:
    """(n, 256) quants 0..63 -> (ql (n, 128), qh (n, 64)), as the packing in quantize_row_q6_K_ref."""
    q = q.astype(np.uint8)
    low = (q.reshape(-1, 2, 2, 64) & np.uint8(0x0F)) << _SHIFT_NIBBLE.reshape(1, 1, 2, 1)
    ql = _or_reduce(low, axis=2).reshape(-1, 128)
    high = ((q.reshape(-1, 2, 4, 32) >> np.uint8(4)) & np.uint8(3)) << _SHIFT_2BIT.reshape(1, 1, 4, 1)
    qh = _or_reduce(high, axis=2).reshape(-1, 64)
    return ql, qh
