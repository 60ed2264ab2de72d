"""NumPy versions of the scalar helpers in ggml-quants.c, exact to the bit.

llama.cpp's quantizers are plain C loops in float32. To get their bytes, NumPy must round the
same way (`nearest_int`, `roundf`, float->int8 casts), add in the same order (`seq_sum`: NumPy's
own sum is pairwise) and break ties the same way (`first_absmax`: the first element wins,
a block of zeros gives +0). Arrays are float32 throughout; errors are silenced because C does
not trap on 0/0 either, and callers mask those lanes.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]

MAGIC_ROUND = np.float32(12582912.0)  # 1.5 * 2^23: adding it leaves round(x) in the low mantissa bits
GROUP_MAX_EPS = np.float32(1e-15)  # as GROUP_MAX_EPS in ggml-quants.c


def nearest_int(v: F32) -> I32:
    """Round to nearest (ties to even) by ggml's 1.5*2^23 trick, as nearest_int in ggml-quants.c."""
    bits = (np.asarray(v, dtype=np.float32) + MAGIC_ROUND).view(np.int32)
    return (bits & np.int32(0x007FFFFF)) - np.int32(0x00400000)


def roundf(v: F32) -> F32:
    """C roundf: to nearest, ties away from zero (NumPy's round goes to even)."""
    t = np.trunc(v)
    frac = v - t  # exact for every float32
    return t + np.where(np.abs(frac) >= np.float32(0.5), np.sign(v), np.float32(0.0))


def f32_to_i32(v: F32) -> I32:
    """C float -> int conversion (truncation; x86 gives INT_MIN for NaN and out-of-range)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(v, dtype=np.float32).astype(np.int32)


def wrap_i8(v: I32) -> I32:
    """The value of an int stored into an int8_t (two's complement wrap)."""
    return ((v + 128) & 0xFF) - 128


def seq_sum(terms: F32) -> F32:
    """Sum float32 terms over axis 0 strictly in order from 0.0f, like a C `s += t` loop.

    NumPy's sum is pairwise (and accumulate along axis 0 is slow), so add row by row.
    """
    acc = terms[0] + np.float32(0.0)  # 0.0f + t0: a -0.0 first term gives +0.0, as in C
    for t in terms[1:]:
        acc += t
    return acc


def seq_sum_from_first(terms: F32) -> F32:
    """Like seq_sum, but the C loop starts from the first term (`s = t[0]; for i >= 1: s += t[i]`)."""
    acc = terms[0].copy()
    for t in terms[1:]:
        acc += t
    return acc


def max_from_zero(v: F32, axis: int = -1) -> F32:
    """`m = 0; if (v > m) m = v` over `axis`: the largest positive value, else +0 (NaN ignored)."""
    m = np.fmax.reduce(v, axis=axis)
    return np.where(m > 0, m, np.float32(0.0)).astype(np.float32)


def first_absmax(x: F32, axis: int = -1) -> tuple[F32, F32]:
    """(amax, max): largest |x| and the signed value first reaching it; (0, +0) for a zero block.

    As the loop `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }` with amax starting at 0:
    NaN never wins and ties keep the earliest element.
    """
    a = np.abs(x)
    amax = np.fmax.reduce(a, axis=axis, keepdims=True)  # NaN-ignoring; all-NaN gives NaN
    amax = np.where(amax > 0, amax, np.float32(0.0))
    first = np.argmax(a == amax, axis=axis, keepdims=True)
    mx = np.take_along_axis(x, first, axis=axis)
    mx = np.where(amax > 0, mx, np.float32(0.0))
    return np.squeeze(amax, axis=axis), np.squeeze(mx, axis=axis)


def first_extreme(x: F32, largest: bool, axis: int = -1) -> F32:
    """min (or max) as `if (v < m) m = v` from m = +-FLT_MAX: NaN ignored, the first zero keeps its sign."""
    red = np.fmax if largest else np.fmin
    m = red.reduce(x, axis=axis, keepdims=True)
    fmax = np.finfo(np.float32).max
    m = np.where(np.isnan(m), np.float32(-fmax if largest else fmax), m)
    if np.any(m == 0):
        first_zero = np.argmax(x == 0, axis=axis, keepdims=True)
        m = np.where(m == 0, np.take_along_axis(x, first_zero, axis=axis), m)
    return np.squeeze(m, axis=axis).astype(np.float32, copy=False)


def seq_extreme(x: F32, largest: bool) -> F32:
    """min (or max) over axis 0 as `m = x[0]; for i >= 1: if (x[i] < m) m = x[i]`."""
    m = x[0]
    for xi in x[1:]:
        m = np.where(xi > m, xi, m) if largest else np.where(xi < m, xi, m)
    return m
