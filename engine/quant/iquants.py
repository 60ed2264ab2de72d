"""The i-quant types IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M: dequantizers.

Most i-quants store, per group of 4 or 8 weights, an index into a fixed grid of small magnitudes
(iquant_grids.py, from ggml-common.h) and a sign per weight; IQ4_NL / IQ4_XS store 4-bit indices into 16
non-linear levels. Dequantizers map (n_blocks, type_size) uint8 -> (n_blocks, block_size) float32 with the
float operations of dequantize_row_iq* in ggml-quants.c, in the order gguf-py's quants.py applies them
(e.g. IQ2_XXS: ((d * (0.5 + ls)) * 0.25 * grid) * sign), so the results are bit for bit gguf-py's.

Layouts (bytes; sub-block b = 32 weights, group g = 8 weights unless said; nib(x, i) = nibble i of x):
  IQ2_XXS | d:2 | qs:64 |                                    66 bytes, 2.0625 bpw
          per b two uint32: a0 = 4 grid indices (bytes), a1 = 4 x 7 sign bits | ls << 28
          w = d * (0.5 + ls) * 0.25 * iq2xxs_grid[a0 byte g][k] * ksigns(a1 >> 7g)[k]
  IQ2_XS  | d:2 | qs:64 (uint16 x 32) | scales:8 |           74 bytes, 2.3125 bpw
          q = qs[4b + g]: grid index q & 511, sign index q >> 9; ls = nib(scales[b], 16-weight half)
  IQ2_S   | d:2 | qs:32 | signs:32 | qh:8 | scales:8 |       82 bytes, 2.5625 bpw
          grid index qs[4b + g] | ((qh[b] >> 2g) & 3) << 8 (iq2s_grid); sign bit k of signs[4b + g]
  IQ3_XXS | d:2 | qs:64 | scales_signs:32 (uint32 x 8) |     98 bytes, 3.0625 bpw
          groups of 4: iq3xxs_grid[qs[8b + j]]; signs as IQ2_XXS; w = d * (0.5 + ls) * 0.5 * ...
  IQ3_S   | d:2 | qs:64 | qh:8 | signs:32 | scales:4 |       110 bytes, 3.4375 bpw
          groups of 4: iq3s_grid[qs[8b + j] | ((qh[b] >> j) & 1) << 8]; w = d * (1 + 2 nib(scales[b/2], b%2)) * ...
  IQ1_S   | d:2 | qs:32 | qh:16 (uint16 x 8) |               50 bytes, 1.5625 bpw
          h = qh[b]: grid index qs[4b + g] | ((h >> 3g) & 7) << 8 (iq1s_grid, -1/0/1),
          w = d * (2 ((h >> 12) & 7) + 1) * (grid + (h & 0x8000 ? -0.125 : 0.125))
  IQ1_M   | qs:32 | qh:16 | scales:8 (uint16 x 4) |           56 bytes, 1.75 bpw
          fp16 d = the top nibbles of the four scale words; 3-bit scale s per 16 weights (word s / 4,
          bits 3 (s % 4)); byte qh[2b + g/2] nibble g%2: 3 high index bits and the delta's sign (bit 3)
  IQ4_NL  | d:2 | qs:16 |                                    18 bytes per 32, 4.5 bpw
          weight j < 16: kvalues[qs[j] & 15], j >= 16: kvalues[qs[j - 16] >> 4]; w = d * kvalue
  IQ4_XS  | d:2 | scales_h:2 | scales_l:4 | qs:128 |         136 bytes, 4.25 bpw
          ls = nib(scales_l[b/2], b%2) | ((scales_h >> 2b) & 3) << 4; w = d * (ls - 32) * kvalue (as IQ4_NL)
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .floats import f16_bits_to_f32
from .iquant_grids import grid_bytes, ksigns, kvalues_iq4nl

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
QK_K = 256

_BIT = np.arange(8, dtype=np.uint8)
_NIBBLE = np.array([0, 4], dtype=np.uint8)
_HALF, _QUARTER = np.float32(0.5), np.float32(0.25)
IQ1_DELTA = np.float32(0.125)  # IQ1S_DELTA / IQ1M_DELTA in ggml-common.h


def _grid(name: str) -> F32:
    """A grid as float32 magnitudes (entries, weights per entry); iq1s_grid read as int8 (-1, 0, 1)."""
    raw = grid_bytes(name)
    return (raw.view(np.int8) if name == "iq1s_grid" else raw).astype(np.float32)


_GRIDS: dict[str, F32] = {}


def grid(name: str) -> F32:
    got = _GRIDS.get(name)
    if got is None:
        got = _GRIDS[name] = _grid(name)
    return got


def _f16(blocks: U8, offset: int) -> F32:
    """The fp16 field at `offset` of every block as a (n, 1) float32 column."""
    return f16_bits_to_f32(np.ascontiguousarray(blocks[:, offset : offset + 2]).view("<u2"))


def _u32(raw: U8) -> npt.NDArray[np.uint32]:
    return np.ascontiguousarray(raw).view("<u4")


def _u16(raw: U8) -> npt.NDArray[np.uint16]:
    return np.ascontiguousarray(raw).view("<u2")


def _sign_bits(bits: U8) -> F32:
    """(..., ) sign bytes -> (..., 8) factors: bit k set -> -1, else +1."""
    on = (bits[..., None] >> _BIT) & np.uint8(1)
    return np.where(on == 0, np.float32(1), np.float32(-1))


def _sign_index_factors(sign_idx: npt.NDArray[np.integer]) -> F32:
    """7-bit sign indices -> (..., 8) factors through ksigns_iq2xs (the eighth sign makes the parity even)."""
    return _sign_bits(ksigns()[sign_idx])


def _nibbles(scales: U8) -> U8:
    """(n, k) bytes -> (n, 2k) nibbles, low nibble first."""
    return ((scales[..., None] >> _NIBBLE) & np.uint8(0x0F)).reshape(scales.shape[0], -1)


# ---- the grid types


def dequantize_iq2_xxs(blocks: U8) -> F32:
    """IQ2_XXS super-blocks to float32, as dequantize_row_iq2_xxs."""
    n = len(blocks)
    d = _f16(blocks, 0)
    aux = _u32(blocks[:, 2:66]).reshape(n, 8, 2)
    db = (d * (_HALF + (aux[..., 1] >> np.uint32(28)).astype(np.float32)) * _QUARTER)[..., None, None]
    idx = np.ascontiguousarray(aux[..., 0]).view(np.uint8).reshape(n, 8, 4)
    signs = _sign_index_factors((aux[..., 1, None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(127))
    return (db * grid("iq2xxs_grid")[idx] * signs).reshape(n, QK_K)


def dequantize_iq2_xs(blocks: U8) -> F32:
    """IQ2_XS super-blocks to float32, as dequantize_row_iq2_xs."""
    n = len(blocks)
    d = _f16(blocks, 0)
    q = _u16(blocks[:, 2:66]).reshape(n, 16, 2)  # (n, 16-weight half, group)
    db = (d * (_HALF + _nibbles(blocks[:, 66:74]).astype(np.float32)) * _QUARTER)[..., None, None]
    signs = _sign_index_factors(q >> np.uint16(9))
    return (db * grid("iq2xs_grid")[q & np.uint16(511)] * signs).reshape(n, QK_K)


def dequantize_iq2_s(blocks: U8) -> F32:
    """IQ2_S super-blocks to float32, as dequantize_row_iq2_s."""
    n = len(blocks)
    d = _f16(blocks, 0)
    qh = (blocks[:, 66:74, None] >> np.array([0, 2, 4, 6], np.uint8)) & np.uint8(3)  # (n, 8, 4)
    idx = blocks[:, 2:34].astype(np.uint16) | (qh.reshape(n, 32).astype(np.uint16) << np.uint16(8))
    db = (d * (_HALF + _nibbles(blocks[:, 74:82]).astype(np.float32)) * _QUARTER)[..., None, None]
    signs = _sign_bits(blocks[:, 34:66]).reshape(n, 16, 2, 8)
    return (db * grid("iq2s_grid")[idx.reshape(n, 16, 2)] * signs).reshape(n, QK_K)


def dequantize_iq3_xxs(blocks: U8) -> F32:
    """IQ3_XXS super-blocks to float32, as dequantize_row_iq3_xxs."""
    n = len(blocks)
    d = _f16(blocks, 0)
    aux = _u32(blocks[:, 66:98])  # (n, 8)
    db = (d * (_HALF + (aux >> np.uint32(28)).astype(np.float32)) * _HALF)[..., None, None]
    signs = _sign_index_factors((aux[..., None] >> np.array([0, 7, 14, 21], np.uint32)) & np.uint32(127))
    g = grid("iq3xxs_grid")[blocks[:, 2:66]].reshape(n, 8, 4, 8)  # two grid points per group of 8
    return (db * g * signs).reshape(n, QK_K)


def dequantize_iq3_s(blocks: U8) -> F32:
    """IQ3_S super-blocks to float32, as dequantize_row_iq3_s."""
    n = len(blocks)
    d = _f16(blocks, 0)
    qh = (blocks[:, 66:74, None] >> _BIT) & np.uint8(1)  # (n, 8, 8)
    idx = blocks[:, 2:66].astype(np.uint16) | (qh.reshape(n, 64).astype(np.uint16) << np.uint16(8))
    db = (d * (np.uint8(1) + np.uint8(2) * _nibbles(blocks[:, 106:110])))[..., None, None]
    signs = _sign_bits(blocks[:, 74:106]).reshape(n, 8, 4, 8)
    g = grid("iq3s_grid")[idx].reshape(n, 8, 4, 8)
    return (db * g * signs).reshape(n, QK_K)


def dequantize_iq1_s(blocks: U8) -> F32:
    """IQ1_S super-blocks to float32, as dequantize_row_iq1_s."""
    n = len(blocks)
    d = _f16(blocks, 0)
    qh = _u16(blocks[:, 34:50])  # (n, 8)
    dl = (d * (np.uint16(2) * ((qh >> np.uint16(12)) & np.uint16(7)) + np.uint16(1)))[..., None, None]
    delta = np.where((qh & np.uint16(0x8000)) == 0, IQ1_DELTA, -IQ1_DELTA)[..., None, None]
    high = (qh[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)  # (n, 8, 4)
    idx = blocks[:, 2:34].astype(np.uint16) | (high.reshape(n, 32) << np.uint16(8))
    g = grid("iq1s_grid")[idx.reshape(n, 8, 4)]
    return (dl * (g + delta)).reshape(n, QK_K)


def iq1_m_scale(blocks: U8) -> F32:
    """The fp16 super-block scale of IQ1_M, assembled from the top nibbles of its four scale words (n, 1)."""
    sc = _u16(blocks[:, 48:56])
    bits = (sc & np.uint16(0xF000)) >> np.array([12, 8, 4, 0], np.uint16)
    return f16_bits_to_f32(np.bitwise_or.reduce(bits, axis=1, keepdims=True).astype(np.uint16))


def dequantize_iq1_m(blocks: U8) -> F32:
    """IQ1_M super-blocks to float32, as dequantize_row_iq1_m."""
    n = len(blocks)
    d = iq1_m_scale(blocks)
    sc = _u16(blocks[:, 48:56])
    s = ((sc[..., None] >> np.array([0, 3, 6, 9], np.uint16)) & np.uint16(7)).reshape(n, 16)
    dl = (d * (np.uint16(2) * s + np.uint16(1))).reshape(n, 8, 2, 1, 1)
    qh = ((blocks[:, 32:48, None] >> _NIBBLE) & np.uint8(0x0F)).reshape(n, 32)  # one nibble per group
    idx = blocks[:, 0:32].astype(np.uint16) | ((qh & np.uint8(7)).astype(np.uint16) << np.uint16(8))
    delta = np.where((qh & np.uint8(8)) == 0, IQ1_DELTA, -IQ1_DELTA).reshape(n, 8, 2, 2, 1)
    g = grid("iq1s_grid")[idx.reshape(n, 8, 2, 2)]
    return (dl * (g + delta)).reshape(n, QK_K)


# ---- the non-linear 4-bit types


def _iq4_levels(qs: U8) -> F32:
    """(n, k * 16) packed nibbles -> (n, k, 32) levels: per 16 bytes, the low nibbles then the high ones."""
    n = len(qs)
    nib = (qs.reshape(n, -1, 1, 16) >> _NIBBLE.reshape(1, 1, 2, 1)) & np.uint8(0x0F)
    return kvalues_iq4nl()[nib].astype(np.float32).reshape(n, -1, 32)


def dequantize_iq4_nl(blocks: U8) -> F32:
    """IQ4_NL blocks (32 weights) to float32, as dequantize_row_iq4_nl."""
    return (_f16(blocks, 0) * _iq4_levels(blocks[:, 2:18])[:, 0]).astype(np.float32)


def iq4_xs_scales(blocks: U8) -> npt.NDArray[np.int8]:
    """The eight 6-bit sub-block scales of IQ4_XS, minus 32 (n, 8) int8."""
    n = len(blocks)
    high = (_u16(blocks[:, 2:4]) >> (2 * np.arange(8, dtype=np.uint16))) & np.uint16(3)  # (n, 8)
    low = _nibbles(blocks[:, 4:8])
    return (low | (high.astype(np.uint8) << np.uint8(4))).reshape(n, 8).astype(np.int8) - np.int8(32)


def dequantize_iq4_xs(blocks: U8) -> F32:
    """IQ4_XS super-blocks to float32, as dequantize_row_iq4_xs."""
    dl = (_f16(blocks, 0) * iq4_xs_scales(blocks).astype(np.float32))[..., None]
    return (dl * _iq4_levels(blocks[:, 8:136])).reshape(len(blocks), QK_K)
