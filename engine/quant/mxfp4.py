"""MXFP4 (ggml type 39): the OCP microscaling 4-bit float format gpt-oss ships its experts in.

A block is 32 weights in 17 bytes: one E8M0 exponent byte `e`, then 16 bytes of 4-bit E2M1 codes, the first 16
weights in the low nibbles and the last 16 in the high ones (block_mxfp4 in ggml-common.h):

    byte 0      e          scale 2^(e - 127); ggml stores the E2M1 values doubled, so it multiplies by half of it
    bytes 1-16  qs[j]      weight j = kvalues[qs[j] & 15] * d,  weight j + 16 = kvalues[qs[j] >> 4] * d

with kvalues = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12} (E2M1 times two) and
d = GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128) (e < 2: the subnormals 2^-128 and 2^-127).

Quantizing follows quantize_row_mxfp4_ref: e = (uint8_t)(floorf(log2f(amax)) - 2 + 127) (0 for an all-zero block;
the float-to-uint8 conversion keeps the low byte of the int32 conversion, as x86's cvttss2si does), then each weight
takes the first code whose value is nearest (best_index_mxfp4: |kvalues[i] * d - x| in float32, strict <).
floorf(log2f(amax)) is the exponent of amax except where log2f rounds up to an integer just below a power of two;
those few blocks ask the C library's log2f itself.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np
import numpy.typing as npt

QK = 32
BLOCK_BYTES = 1 + QK // 2
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # kvalues_mxfp4 (E2M1 x 2)

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]


def e8m0_half(e: npt.NDArray[np.uint8]) -> F32:
    """GGML_E8M0_TO_FP32_HALF: 2^(e - 128) as float32 bits, the subnormals 2^-128 / 2^-127 for e < 2."""
    e32 = e.astype(np.uint32)
    bits = np.where(e32 < 2, np.uint32(0x00200000) << e32, (e32 - 1) << 23).astype(np.uint32)
    return bits.view(np.float32)


def dequantize_mxfp4(blocks: U8) -> F32:
    """(n, 17) MXFP4 blocks -> (n, 32) float32, as dequantize_row_mxfp4."""
    d = e8m0_half(blocks[:, 0])[:, None]
    qs = blocks[:, 1:]
    lo = KVALUES[qs & 0x0F].astype(np.float32)
    hi = KVALUES[qs >> 4].astype(np.float32)
    with np.errstate(over="ignore"):  # 12 * 2^127 is inf, as in C
        return np.concatenate([lo * d, hi * d], axis=1)


INF_EXPONENT = 253  # the smallest exponent byte with a code whose value overflows float32 (8 * 2^125 = 2^128)


def first_infinite_block(data: U8) -> tuple[int, int] | None:
    """(block index, exponent byte) of the first MXFP4 block in `data` (rows of whole blocks) whose dequantized
    weights include an infinity, or None. Only blocks with an exponent byte of 253 or more can overflow, so the
    rest are never dequantized."""
    blocks = np.ascontiguousarray(data).reshape(-1, BLOCK_BYTES)
    big = np.flatnonzero(blocks[:, 0] >= INF_EXPONENT)
    if big.size:
        bad = ~np.isfinite(dequantize_mxfp4(blocks[big])).all(axis=1)
        if bad.any():
            i = int(big[np.argmax(bad)])
            return i, int(blocks[i, 0])
    return None


def refuse_infinite(name: str, data: U8) -> None:
    """ModelFormatError naming tensor `name` when one of its MXFP4 blocks dequantizes to an infinity (llama.cpp would
    compute with it: every logit downstream becomes NaN)."""
    from engine.errors import ModelFormatError  # noqa: PLC0415

    bad = first_infinite_block(data)
    if bad is not None:
        raise ModelFormatError(name, f"MXFP4 block {bad[0]} has exponent byte {bad[1]}, which makes its weights "
                               "infinite; the file is damaged")


@functools.cache
def _libm_log2f():  # noqa: ANN202 - a ctypes function or None
    """The C library's log2f (what ggml's compiled code calls), or None where there is none to load."""
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).log2f
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return fn


def _floor_log2f(amax: F32) -> npt.NDArray[np.float64]:
    """floorf(log2f(amax)) for positive float32 amax (inf where amax is inf)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mant, exp = np.frexp(amax)  # amax = mant * 2^exp, mant in [0.5, 1): the exact floor is exp - 1
    out = (exp - 1).astype(np.float64)
    out[~np.isfinite(amax)] = np.inf
    # log2f may round up to the next integer just below a power of two (amax = 2^k (1 - tiny)): ask log2f there
    edge = np.flatnonzero(np.isfinite(amax) & (mant > np.float32(1.0 - 2.0**-12)))
    log2f = _libm_log2f()
    for i in edge:
        value = log2f(float(amax[i])) if log2f is not None else float(np.log2(amax[i].astype(np.float32)))
        out[i] = np.floor(np.float32(value))
    return out


def _to_uint8(v: npt.NDArray[np.float64]) -> U8:
    """(uint8_t) of a float as x86 compiles it: cvttss2si to int32 (0x80000000 for inf/NaN/overflow), low byte."""
    ok = np.isfinite(v) & (np.abs(v) < 2.0**31)
    i32 = np.where(ok, np.trunc(np.where(ok, v, 0.0)), -(2.0**31)).astype(np.int64)
    return (i32 & 0xFF).astype(np.uint8)


def quantize_mxfp4(x: F32) -> U8:
    """(n, 32) float32 -> (n, 17) MXFP4 blocks, byte for byte quantize_row_mxfp4_ref."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK)
    with np.errstate(invalid="ignore"):
        amax = np.fmax.reduce(np.abs(x), axis=1, initial=np.float32(0.0))  # a NaN never becomes the maximum
    amax = amax.astype(np.float32)
    e = np.zeros(len(x), np.uint8)
    pos = amax > 0
    if pos.any():
        e[pos] = _to_uint8(_floor_log2f(amax[pos]) - 2 + 127)
    d = e8m0_half(e)
    values = KVALUES.astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        err = np.abs(values[None, None, :] * d[:, None, None] - x[:, :, None])  # (n, 32, 16), float32
    err = np.where(np.isnan(err), np.float32(np.inf), err)  # NaN compares false: index 0 stays
    idx = np.argmin(err, axis=2).astype(np.uint8)  # the first of equal errors, as the strict < loop keeps it
    out = np.empty((len(x), BLOCK_BYTES), np.uint8)
    out[:, 0] = e
    out[:, 1:] = idx[:, : QK // 2] | (idx[:, QK // 2 :] << 4)
    return out
