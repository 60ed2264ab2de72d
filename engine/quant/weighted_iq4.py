"""IQ4_NL and IQ4_XS quantization: quantize_row_iq4_nl_impl of ggml-quants.c, with or without an imatrix.

A block of 32 weights takes one of the 16 non-linear levels kvalues_iq4nl times a scale; the scale is searched
over 15 trial inverse scales for the best weighted fit (weights qw[j] * sqrt(sigma2 + x^2) with an imatrix,
x^2 without). IQ4_NL stores that scale as fp16 per block; IQ4_XS keeps one fp16 per 256 weights and a 6-bit
scale per block (low nibbles in scales_l, high two bits in scales_h). Layouts are drawn in iquants.py.
"""
from __future__ import annotations

import numpy as np

from .weighted_search import (
    IQ4NL_VALUES,
    ONE,
    ZERO,
    _f,
    best_index_int8,
    importance_weights,
    nearest_int,
    njit,
    put_f16,
)


@njit
def iq4_rows(x, qw, out, sb, has_qw):
    """quantize_iq4_nl (sb 32: | d:2 | qs:16 |) and quantize_iq4_xs (sb 256: | d:2 | scales_h:2 | scales_l:4 | qs:128 |)."""
    n_rows, n_cols = x.shape
    size = 18 if sb == 32 else 136
    values = IQ4NL_VALUES
    L = np.zeros(sb, np.int32)
    weight = np.empty(32, np.float32)
    scales = np.zeros(sb // 32, np.float32)
    for r in range(n_rows):
        for ibl in range(n_cols // sb):
            xs = x[r, sb * ibl : sb * (ibl + 1)]
            y = out[r, size * ibl : size * (ibl + 1)]
            y[:] = 0
            sigma2 = ZERO
            for j in range(sb):
                sigma2 += xs[j] * xs[j]
            sigma2 *= _f(2.0) / _f(sb)
            max_scale = ZERO
            amax_scale = ZERO
            for ib in range(sb // 32):
                xb = xs[32 * ib : 32 * ib + 32]
                if has_qw:
                    importance_weights(xb, qw[sb * ibl + 32 * ib : sb * ibl + 32 * ib + 32], sigma2, 32, weight)
                else:
                    for j in range(32):
                        weight[j] = xb[j] * xb[j]
                amax = ZERO
                mx = ZERO
                for j in range(32):
                    if abs(xb[j]) > amax:
                        amax = abs(xb[j])
                        mx = xb[j]
                if amax < _f(1e-15):
                    scales[ib] = 0
                    continue
                d = -mx / values[0]
                inv = ONE / d
                sumqx = ZERO
                sumq2 = ZERO
                for j in range(32):
                    l = best_index_int8(values, inv * xb[j])
                    L[32 * ib + j] = l
                    q = values[l]
                    sumqx += weight[j] * q * xb[j]
                    sumq2 += weight[j] * q * q
                d = sumqx / sumq2 if sumq2 > 0 else ZERO
                best = d * sumqx
                for itry in range(-7, 8):
                    inv = _f(itry - 127) / mx
                    sumqx = ZERO
                    sumq2 = ZERO
                    for j in range(32):
                        q = values[best_index_int8(values, inv * xb[j])]
                        sumqx += weight[j] * q * xb[j]
                        sumq2 += weight[j] * q * q
                    if sumq2 > 0 and sumqx * sumqx > best * sumq2:
                        d = sumqx / sumq2
                        best = d * sumqx
                scales[ib] = d
                if abs(d) > amax_scale:
                    amax_scale = abs(d)
                    max_scale = d
            if sb > 32:
                d = -max_scale / _f(32.0)
                put_f16(y, 0, d)
                inv = ONE / d if d != 0 else ZERO
                scales_h = 0
                for ib in range(sb // 32):
                    l = max(-32, min(31, nearest_int(inv * scales[ib])))
                    dl = d * _f(l)
                    idl = ONE / dl if dl != 0 else ZERO
                    for j in range(32):
                        L[32 * ib + j] = best_index_int8(values, idl * xs[32 * ib + j])
                    l += 32
                    if ib % 2 == 0:
                        y[4 + ib // 2] = l & 0xF
                    else:
                        y[4 + ib // 2] |= (l & 0xF) << 4
                    scales_h |= (l >> 4) << (2 * (ib % 8))
                y[2] = scales_h & 0xFF
                y[3] = (scales_h >> 8) & 0xFF
                qs = 8
            else:
                put_f16(y, 0, scales[0])
                inv = ONE / scales[0] if scales[0] != 0 else ZERO
                for j in range(32):
                    L[j] = best_index_int8(values, inv * xs[j])
                qs = 2
            for i in range(sb // 32):
                for j in range(16):
                    y[qs + 16 * i + j] = (L[32 * i + j] | (L[32 * i + 16 + j] << 4)) & 0xFF
