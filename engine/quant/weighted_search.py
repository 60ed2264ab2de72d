"""The scale searches of ggml-quants.c's importance-weighted quantizers, as scalar float32 loops.

make_qx_quants (rmse_type 1 with weights), make_qkx3_quants, make_qp_quants and best_index_int8, the
helpers quantize_row_*_impl and quantize_row_iq4_nl_impl call when llama-quantize is given an imatrix.
They are written as the C loops are, one weight after another, in float32 with every product grouped
as the C expression groups it (`w*x[i]*l` is `(w*x[i])*(float)l`), so scales and quants come out
bit-identical. With numba they compile to native loops (nogil, so a thread pool quantizes tensors in
parallel); without it the same functions run as Python on NumPy float32 scalars and give the same bits,
only slowly. Every constant is a float32 so that numba never widens a sum to float64.
"""
from __future__ import annotations

import math

import numpy as np

try:  # numba is optional: without it these run as plain Python on float32 scalars, with the same bits
    import numba

    def njit(fn):
        return numba.njit(cache=True, nogil=True)(fn)
except ImportError:  # pragma: no cover - exercised only where numba is absent
    numba = None

    def njit(fn):
        return fn

HAVE_NUMBA = numba is not None

_f = np.float32
ZERO = _f(0.0)
ONE = _f(1.0)
MAGIC = _f(12582912.0)  # 1.5 * 2^23, nearest_int's rounding constant
LIMIT = _f(4194303.0)  # nearest_int's asserted range
EPS = _f(1e-15)  # GROUP_MAX_EPS
TENTH = _f(0.1)
RMIN = _f(-0.9)  # make_qkx3_quants' rmin, rdelta and nstep as the k-quant impls pass them
RDELTA = _f(0.05)
NSTEP = 36
# kvalues_iq4nl in ggml-common.h, as float32 (the C code compares floats with these int8s promoted)
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


@njit
def nearest_int(f):
    """ggml's nearest_int: round to nearest, ties to even, via the bits of f + 1.5*2^23."""
    v = f + MAGIC
    if abs(f) <= LIMIT:
        return int(v) - 12582912
    if v != v:  # noqa: PLR0124 - NaN; a quiet NaN's mantissa is 0x400000
        return 0
    a = abs(float(v))
    if a == math.inf:
        return -4194304
    m, e = math.frexp(a)  # the low 23 bits of the float32 v, then minus 0x400000
    mant = int((m * 2.0 - 1.0) * 8388608.0) if e >= -125 else int(a * 2.0**149)
    return mant - 4194304


@njit
def f16_round(v):
    """The float32 value of GGML_FP32_TO_FP16(v) (round to nearest even, as F16C's vcvtps2ph)."""
    if v != v or v == 0:  # noqa: PLR0124 - NaN or zero
        return v
    a = abs(float(v))
    if a >= 65520.0:
        return _f(math.copysign(math.inf, float(v)))
    m, e = math.frexp(a)
    if e >= -13:  # a normal half: 11 significant bits
        q = math.ldexp(np.rint(math.ldexp(m, 11)), e - 11)
    else:  # subnormal: a multiple of 2^-24
        q = math.ldexp(np.rint(math.ldexp(a, 24)), -24)
    return _f(math.copysign(q, float(v)))


@njit
def f16_bits(q):
    """The fp16 bit pattern of a float32 that f16_round made (exactly representable)."""
    if q != q:  # noqa: PLR0124 - NaN
        return 0x7E00
    s = 0x8000 if math.copysign(1.0, float(q)) < 0 else 0
    a = abs(float(q))
    if a == math.inf:
        return s | 0x7C00
    if a == 0.0:
        return s
    m, e = math.frexp(a)
    if e >= -13:
        return s | ((e + 14) << 10) | (int(m * 2048.0) - 1024)
    return s | int(a * 16777216.0)


@njit
def put_f16(out, o, v):
    """Store fp16(v) little-endian at out[o:o+2]; returns the float32 value stored."""
    q = f16_round(v)
    b = f16_bits(q)
    out[o] = b & 0xFF
    out[o + 1] = (b >> 8) & 0xFF
    return q


@njit
def importance_weights(xb, qwb, sigma2, n, out):
    """out[j] = qw[j] * sqrtf(sigma2 + x[j]*x[j]): the impls' weighting of the importance matrix."""
    for j in range(n):
        out[j] = qwb[j] * np.sqrt(sigma2 + xb[j] * xb[j])


@njit
def make_qx_quants_w(n, nmax, x, L, qw):
    """make_qx_quants(n, nmax, x, L, rmse_type = 1, qw) with weights: the scale; L gets l + nmax."""
    mx = ZERO
    amax = ZERO
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            mx = x[i]
    if amax < EPS:
        for i in range(n):
            L[i] = 0
        return ZERO
    iscale = _f(-nmax) / mx
    sumlx = ZERO
    suml2 = ZERO
    for i in range(n):
        l = max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
        L[i] = l + nmax
        w = qw[i]
        fl = _f(l)
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    scale = sumlx / suml2 if suml2 != 0 else ZERO
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(_f(nmax) + TENTH * _f(step)) / mx
        sumlx = ZERO
        suml2 = ZERO
        for i in range(n):
            fl = _f(max(-nmax, min(nmax - 1, nearest_int(iscale * x[i]))))
            w = qw[i]
            sumlx += w * x[i] * fl
            suml2 += w * fl * fl
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, nearest_int(iscale * x[i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit
def make_qkx3_quants(n, nmax, x, w, L, Laux):
    """make_qkx3_quants(n, nmax, x, weights, L, &the_min, Laux, -0.9f, 0.05f, 36, false): (scale, the_min)."""
    mn = x[0]
    mx = x[0]
    sum_w = w[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < mn:  # noqa: PLR1730 - the C comparisons, NaN included
            mn = x[i]
        if x[i] > mx:  # noqa: PLR1730
            mx = x[i]
        sum_w += w[i]
        sum_x += w[i] * x[i]
    if mn > 0:
        mn = ZERO
    if mx <= mn:
        for i in range(n):
            L[i] = 0
        return ZERO, -mn
    iscale = _f(nmax) / (mx - mn)
    scale = ONE / iscale
    best_mad = ZERO
    for i in range(n):
        L[i] = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
        diff = scale * _f(L[i]) + mn - x[i]
        best_mad += w[i] * (diff * diff)
    for step in range(NSTEP + 1):
        iscale = (RMIN + RDELTA * _f(step) + _f(nmax)) / (mx - mn)
        sum_l = ZERO
        sum_l2 = ZERO
        sum_xl = ZERO
        for i in range(n):
            l = max(0, min(nmax, nearest_int(iscale * (x[i] - mn))))
            Laux[i] = l
            fl = _f(l)
            wi = w[i]
            sum_l += wi * fl
            sum_l2 += wi * fl * fl
            sum_xl += wi * fl * x[i]
        det = sum_w * sum_l2 - sum_l * sum_l
        if det > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
            if this_min > 0:
                this_min = ZERO
                this_scale = sum_xl / sum_l2
            mad = ZERO
            for i in range(n):
                diff = this_scale * _f(Laux[i]) + this_min - x[i]
                mad += w[i] * (diff * diff)
            if mad < best_mad:
                for i in range(n):
                    L[i] = Laux[i]
                best_mad = mad
                scale = this_scale
                mn = this_min
    return scale, -mn


@njit
def make_qp_quants(n, nmax, x, L, qw):
    """make_qp_quants: a positive scale for positive values (the k-quants' scales and mins); L as uint8."""
    mx = ZERO
    for i in range(n):
        mx = mx if mx > x[i] else x[i]  # noqa: FURB136 - MAX(max, x[i]), NaN as in C
    if mx < EPS:
        for i in range(n):
            L[i] = 0
        return ZERO
    iscale = _f(nmax) / mx
    for i in range(n):
        L[i] = nearest_int(iscale * x[i]) & 0xFF
    scale = ONE / iscale
    best_mse = ZERO
    for i in range(n):
        diff = x[i] - scale * _f(L[i])
        best_mse += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_is = (TENTH * _f(step) + _f(nmax)) / mx
        scale_is = ONE / iscale_is
        mse = ZERO
        for i in range(n):
            l = min(nmax, nearest_int(iscale_is * x[i]))
            diff = x[i] - scale_is * _f(l)
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_is
    sumlx = ZERO
    suml2 = ZERO
    for i in range(n):
        l = min(nmax, nearest_int(iscale * x[i]))
        L[i] = l & 0xFF
        w = qw[i]
        fl = _f(l)
        sumlx += w * x[i] * fl
        suml2 += w * fl * fl
    for _ in range(5):
        n_changed = 0
        for i in range(n):
            w = qw[i]
            li = _f(L[i])
            slx = sumlx - w * x[i] * li
            sl2 = suml2 - w * li * li
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    fl = _f(new_l)
                    slx += w * x[i] * fl
                    sl2 += w * fl * fl
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        n_changed += 1
        if n_changed == 0:
            break
    return sumlx / suml2 if suml2 > 0 else ZERO


@njit
def best_index_int8(values, x):
    """best_index_int8(16, values, x): the index of the nearest of 16 sorted values (ties to the upper)."""
    if x <= values[0]:
        return 0
    if x >= values[15]:
        return 15
    ml = 0
    mu = 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if x < values[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if x - values[mu - 1] < values[mu] - x else mu
