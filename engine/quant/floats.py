"""F32, F16 and BF16 tensors, and the exact fp32 -> fp16 / bf16 conversions ggml uses.

The quantizers store their scales through `f32_to_f16_bits`, a port of
ggml_compute_fp32_to_fp16 in ggml-impl.h (round to nearest even, NaN -> 0x7E00), so that the
bytes match llama.cpp even for NaN inputs, where NumPy's own cast keeps the payload.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]


def f16_bits_to_f32(bits: npt.NDArray[np.uint16]) -> F32:
    """Widen fp16 bit patterns to float32 (exact; NaN stays NaN)."""
    return bits.view(np.float16).astype(np.float32)


def f32_to_f16_bits(x: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """fp16 bit patterns of float32 values, as ggml_compute_fp32_to_fp16 in ggml-impl.h."""
    x = np.asarray(x, dtype=np.float32)
    w = x.view(np.uint32)
    with np.errstate(over="ignore", under="ignore"):
        # scaling by 2^112 then 2^-110 makes the float unit do the rounding at fp16 precision
        base = (np.abs(x) * np.float32(2.0**112)) * np.float32(2.0**-110)
    shl1_w = w + w  # wraps: drops the sign bit
    sign = w & np.uint32(0x80000000)
    bias = np.maximum(shl1_w & np.uint32(0xFF000000), np.uint32(0x71000000))
    base = ((bias >> np.uint32(1)) + np.uint32(0x07800000)).view(np.float32) + base
    bits = base.view(np.uint32)
    exp_bits = (bits >> np.uint32(13)) & np.uint32(0x00007C00)
    mantissa_bits = bits & np.uint32(0x00000FFF)
    nonsign = np.where(shl1_w > np.uint32(0xFF000000), np.uint32(0x7E00), exp_bits + mantissa_bits)
    return ((sign >> np.uint32(16)) | nonsign).astype(np.uint16)


def f32_to_bf16_bits(x: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """bf16 bit patterns of float32 values, as ggml_compute_fp32_to_bf16 (nearest even, NaN quieted)."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    is_nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    nan_bits = (u >> np.uint32(16)) | np.uint32(64)
    return np.where(is_nan, nan_bits, rounded).astype(np.uint16)


# ---- dequantizers: (n_blocks, type_size) uint8 -> (n_blocks, block_size) float32, block_size 1


def dequantize_f32(blocks: U8) -> F32:
    """F32 'blocks' of 4 little-endian bytes to float32."""
    return np.ascontiguousarray(blocks).view("<f4").astype(np.float32, copy=False)


def dequantize_f16(blocks: U8) -> F32:
    """F16 blocks of 2 bytes to float32, as ggml_fp16_to_fp32_row."""
    return np.ascontiguousarray(blocks).view("<f2").astype(np.float32)


def dequantize_bf16(blocks: U8) -> F32:
    """BF16 blocks of 2 bytes to float32: the bits become the top half of a float32."""
    bits = np.ascontiguousarray(blocks).view("<u2").astype(np.uint32)
    return (bits << np.uint32(16)).view(np.float32)


# ---- quantizers: (n_blocks, block_size) float32 -> (n_blocks, type_size) uint8


def quantize_f16(x: F32) -> U8:
    """float32 to F16 bytes, as ggml_fp32_to_fp16_row."""
    return f32_to_f16_bits(x).astype("<u2").view(np.uint8)


def quantize_bf16(x: F32) -> U8:
    """float32 to BF16 bytes, as ggml_fp32_to_bf16_row_ref."""
    return f32_to_bf16_bits(x).astype("<u2").view(np.uint8)


def quantize_f32(x: F32) -> U8:
    """float32 to F32 bytes (a copy)."""
    return np.ascontiguousarray(x, dtype="<f4").view(np.uint8).copy()
