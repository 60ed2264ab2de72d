"""The legacy 32-weight block types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.

Each type has a dequantizer, (n_blocks, type_size) uint8 -> (n_blocks, 32) float32, and a
quantizer, (n_blocks, 32) float32 -> (n_blocks, type_size) uint8, vectorised over blocks.
Dequantizers match dequantize_row_* in ggml-quants.c (and gguf-py) to the bit; quantizers match
quantize_row_*_ref, which ggml_quantize_chunk uses for these types when no imatrix is given.

Block layouts (bytes, little-endian; d and m are fp16):
  Q4_0  | d:2 | qs:16 |                 w[j] = (nibble_j - 8) * d
  Q4_1  | d:2 | m:2 | qs:16 |           w[j] = nibble_j * d + m
  Q5_0  | d:2 | qh:4 | qs:16 |          w[j] = ((nibble_j | bit_j << 4) - 16) * d
  Q5_1  | d:2 | m:2 | qh:4 | qs:16 |    w[j] = (nibble_j | bit_j << 4) * d + m
  Q8_0  | d:2 | qs:32 (int8) |          w[j] = qs[j] * d
qs[i] holds weight i in its low nibble and weight i + 16 in its high nibble; bit j of the
little-endian uint32 qh is the fifth bit of weight j.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .floats import f16_bits_to_f32, f32_to_f16_bits
from .ggml_math import f32_to_i32, first_absmax, first_extreme, roundf, wrap_i8

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
QK = 32

_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
_BIT_SHIFTS = np.arange(32, dtype=np.uint32).reshape(1, 32)


def _f16(blocks: U8, offset: int) -> F32:
    """The fp16 field at `offset` of every block, as a (n_blocks, 1) float32 column."""
    return f16_bits_to_f32(blocks[:, offset : offset + 2].view("<u2"))


def _nibbles(qs: U8) -> U8:
    """(n, 16) packed bytes -> (n, 32) values: low nibbles are weights 0..15, high ones 16..31."""
    return ((qs[:, None, :] >> _NIBBLE_SHIFTS) & np.uint8(0x0F)).reshape(len(qs), QK)


def _fifth_bits(qh: U8) -> U8:
    """(n, 4) bytes of a little-endian uint32 -> (n, 32) values 0 or 16."""
    bits = np.ascontiguousarray(qh).view("<u4") >> _BIT_SHIFTS
    return ((bits & np.uint32(1)) << np.uint32(4)).astype(np.uint8)


# ---- dequantizers


def dequantize_q4_0(blocks: U8) -> F32:
    """Q4_0 blocks to float32, as dequantize_row_q4_0."""
    q = _nibbles(blocks[:, 2:]).view(np.int8) - np.int8(8)
    return _f16(blocks, 0) * q.astype(np.float32)


def dequantize_q4_1(blocks: U8) -> F32:
    """Q4_1 blocks to float32, as dequantize_row_q4_1."""
    y = _nibbles(blocks[:, 4:]).astype(np.float32)
    y *= _f16(blocks, 0)
    y += _f16(blocks, 2)
    return y


def dequantize_q5_0(blocks: U8) -> F32:
    """Q5_0 blocks to float32, as dequantize_row_q5_0."""
    q = (_nibbles(blocks[:, 6:]) | _fifth_bits(blocks[:, 2:6])).view(np.int8) - np.int8(16)
    return _f16(blocks, 0) * q.astype(np.float32)


def dequantize_q5_1(blocks: U8) -> F32:
    """Q5_1 blocks to float32, as dequantize_row_q5_1."""
    y = (_nibbles(blocks[:, 8:]) | _fifth_bits(blocks[:, 4:8])).astype(np.float32)
    y *= _f16(blocks, 0)
    y += _f16(blocks, 2)
    return y


def dequantize_q8_0(blocks: U8) -> F32:
    """Q8_0 blocks to float32, as dequantize_row_q8_0."""
    y = blocks[:, 2:].view(np.int8).astype(np.float32)
    y *= _f16(blocks, 0)
    return y


# ---- quantizers (reference, no importance matrix)


def _safe_inverse(d: F32) -> F32:
    """`d ? 1.0f/d : 0.0f` (NaN counts as true, as in C)."""
    with np.errstate(divide="ignore"):
        return np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)


def _pack_nibbles(lo: npt.NDArray[np.int32], hi: npt.NDArray[np.int32]) -> U8:
    """`qs[j] = lo[j] | hi[j] << 4` stored into uint8."""
    return ((lo | (hi << 4)) & 0xFF).astype(np.uint8)


def _pack_fifth_bits(q: npt.NDArray[np.int32]) -> U8:
    """Bit 4 of each of the 32 quants into a little-endian uint32 qh, weight j at bit j."""
    bits = ((q >> 4) & 1).astype(np.uint32) << _BIT_SHIFTS
    return np.bitwise_or.reduce(bits, axis=1).astype("<u4").view(np.uint8).reshape(len(q), 4)


def _fields(*parts: U8) -> U8:
    return np.concatenate(parts, axis=1)


def _f16_bytes(v: F32) -> U8:
    return f32_to_f16_bits(v).astype("<u2").view(np.uint8).reshape(len(v), 2)


def quantize_q4_0(x: F32) -> U8:
    """float32 blocks to Q4_0, as quantize_row_q4_0_ref."""
    _, mx = first_absmax(x)
    d = (mx / np.float32(-8)).astype(np.float32)
    v = x * _safe_inverse(d)[:, None] + np.float32(8.5)
    q = np.minimum(15, wrap_i8(f32_to_i32(v)))  # MIN(15, (int8_t)(x0 + 8.5f))
    return _fields(_f16_bytes(d), _pack_nibbles(q[:, :16], q[:, 16:]))


def quantize_q4_1(x: F32) -> U8:
    """float32 blocks to Q4_1, as quantize_row_q4_1_ref."""
    mn = first_extreme(x, largest=False)
    mx = first_extreme(x, largest=True)
    d = ((mx - mn) / np.float32(15)).astype(np.float32)
    v = (x - mn[:, None]) * _safe_inverse(d)[:, None] + np.float32(0.5)
    q = np.minimum(15, wrap_i8(f32_to_i32(v)))
    return _fields(_f16_bytes(d), _f16_bytes(mn), _pack_nibbles(q[:, :16], q[:, 16:]))


def quantize_q5_0(x: F32) -> U8:
    """float32 blocks to Q5_0, as quantize_row_q5_0_ref."""
    _, mx = first_absmax(x)
    d = (mx / np.float32(-16)).astype(np.float32)
    v = x * _safe_inverse(d)[:, None] + np.float32(16.5)
    q = np.minimum(31, wrap_i8(f32_to_i32(v))) & 0xFF  # stored in a uint8_t
    qs = _pack_nibbles(q[:, :16] & 0x0F, q[:, 16:] & 0x0F)
    return _fields(_f16_bytes(d), _pack_fifth_bits(q), qs)


def quantize_q5_1(x: F32) -> U8:
    """float32 blocks to Q5_1, as quantize_row_q5_1_ref."""
    mn = first_extreme(x, largest=False)
    mx = first_extreme(x, largest=True)
    d = ((mx - mn) / np.float32(31)).astype(np.float32)
    v = (x - mn[:, None]) * _safe_inverse(d)[:, None] + np.float32(0.5)
    q = f32_to_i32(v) & 0xFF  # (uint8_t)(x0 + 0.5f), no clamp
    qs = _pack_nibbles(q[:, :16] & 0x0F, q[:, 16:] & 0x0F)
    return _fields(_f16_bytes(d), _f16_bytes(mn), _pack_fifth_bits(q), qs)


def _q8_absmax(x: F32) -> F32:
    """amax as `amax = MAX(amax, fabsf(v))` from 0; that MAX lets a NaN through only from the last element."""
    a = np.abs(x)
    amax = a.max(axis=1)
    nan_rows = np.flatnonzero(np.isnan(amax))
    if len(nan_rows):
        acc = np.zeros(len(nan_rows), dtype=np.float32)
        for col in a[nan_rows].T:
            acc = np.where(acc > col, acc, col)
        amax[nan_rows] = acc
    return amax


def quantize_q8_0(x: F32) -> U8:
    """float32 blocks to Q8_0, as quantize_row_q8_0_ref."""
    d = (_q8_absmax(x) / np.float32(127)).astype(np.float32)
    q = f32_to_i32(roundf(x * _safe_inverse(d)[:, None])) & 0xFF
    return _fields(_f16_bytes(d), q.astype(np.uint8))
