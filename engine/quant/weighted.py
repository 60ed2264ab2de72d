"""Quantizing with an importance matrix: the quant_weights paths of ggml_quantize_chunk, byte-exact.

When llama-quantize has an imatrix it passes each tensor's per-column importance (`quant_weights`, one
float per column of the row) to quantize_q4_0 .. quantize_q6_K, which then run quantize_row_*_impl
instead of the _ref quantizers: the weight of x[j] in every scale search is qw[j] * sqrt(sigma2 + x[j]^2)
(sigma2 the row's or super-block's mean square; Q6_K uses qw[j] alone), the legacy types search a scale
with make_qx_quants / make_qkx3_quants, and the k-quants also choose their 6-bit sub-block scales and
mins with make_qp_quants instead of rounding. IQ4_NL and IQ4_XS (quantize_iq4_nl / quantize_iq4_xs) go
through quantize_row_iq4_nl_impl with or without weights (without: x[j]^2). Q8_0 ignores the weights.

Each kernel maps rows (n_rows, n_cols) float32 and qw (n_cols,) float32 to (n_rows, row_bytes) uint8.
Block layouts are drawn in legacy.py, kquants.py and iquants.py; the searches are in weighted_search.py.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from .types import TYPES, GGMLType
from .weighted_iq4 import iq4_rows
from .weighted_search import (
    ONE,
    ZERO,
    _f,
    importance_weights,
    make_qkx3_quants,
    make_qp_quants,
    make_qx_quants_w,
    nearest_int,
    njit,
    put_f16,
)

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
QK_K = 256


@njit
def _sigma2(row, n, factor):
    """factor * sum(x^2) / n over a row or super-block, summed in order from 0."""
    s = ZERO
    for j in range(n):
        s += row[j] * row[j]
    return factor * s / _f(n) if factor != ONE else s / _f(n)


@njit
def _legacy_rows(x, qw, out, kind):
    """Q4_0 (kind 0), Q4_1 (1), Q5_0 (2), Q5_1 (3): quantize_row_q*_impl over every row."""
    n_rows, n_cols = x.shape
    nb = n_cols // 32
    size = (18, 20, 22, 24)[kind]
    weight = np.empty(32, np.float32)
    L = np.zeros(32, np.int32)
    Lu = np.zeros(32, np.uint8)
    Laux = np.zeros(32, np.uint8)
    for r in range(n_rows):
        row = x[r]
        sigma2 = _sigma2(row, n_cols, ONE)
        for ib in range(nb):
            xb = row[32 * ib : 32 * ib + 32]
            importance_weights(xb, qw[32 * ib : 32 * ib + 32], sigma2, 32, weight)
            y = out[r, ib * size : (ib + 1) * size]
            if kind == 0 or kind == 2:
                d = make_qx_quants_w(32, 8 if kind == 0 else 16, xb, L, weight)
                put_f16(y, 0, d)
                for j in range(32):
                    Lu[j] = L[j] & 0xFF
                qs = 2 if kind == 0 else 6
            else:
                d, mn = make_qkx3_quants(32, 15 if kind == 1 else 31, xb, weight, Lu, Laux)
                put_f16(y, 0, d)
                put_f16(y, 2, -mn)
                qs = 4 if kind == 1 else 8
            if kind >= 2:  # the fifth bits into the little-endian uint32 qh
                qh = 0
                for j in range(16):
                    qh |= ((int(Lu[j]) & 0x10) >> 4) << j
                    qh |= ((int(Lu[j + 16]) & 0x10) >> 4) << (j + 16)
                for b in range(4):
                    y[qs - 4 + b] = (qh >> (8 * b)) & 0xFF
            for j in range(16):
                y[qs + j] = ((int(Lu[j]) & 0x0F) | ((int(Lu[j + 16]) & 0x0F) << 4)) & 0xFF


@njit
def _pack_two_bit(L, y, o):
    """qs[j/4 + l] = L[j+l] | L[j+l+32] << 2 | L[j+l+64] << 4 | L[j+l+96] << 6, for j = 0, 128."""
    for j in range(0, QK_K, 128):
        for l in range(32):
            y[o + j // 4 + l] = (int(L[j + l]) | (int(L[j + l + 32]) << 2) | (int(L[j + l + 64]) << 4)
                                 | (int(L[j + l + 96]) << 6)) & 0xFF


@njit
def _q2_k_rows(x, qw, out):
    """quantize_row_q2_K_impl: | scales:16 | qs:64 | d:2 | dmin:2 |."""
    n_rows, n_cols = x.shape
    L = np.zeros(QK_K, np.uint8)
    Laux = np.zeros(16, np.uint8)
    weight = np.empty(16, np.float32)
    scales = np.empty(16, np.float32)
    mins = np.empty(16, np.float32)
    sw = np.empty(16, np.float32)
    Ls = np.zeros(16, np.uint8)
    Lm = np.zeros(16, np.uint8)
    for r in range(n_rows):
        for i in range(n_cols // QK_K):
            xs = x[r, QK_K * i : QK_K * (i + 1)]
            y = out[r, 84 * i : 84 * (i + 1)]
            sigma2 = _sigma2(xs, QK_K, ONE)
            for j in range(16):
                importance_weights(xs[16 * j : 16 * j + 16], qw[QK_K * i + 16 * j : QK_K * i + 16 * j + 16], sigma2, 16, weight)
                s = ZERO
                for l in range(16):
                    s += weight[l]
                sw[j] = s
                scales[j], mins[j] = make_qkx3_quants(16, 3, xs[16 * j : 16 * j + 16], weight, L[16 * j : 16 * j + 16], Laux)
            dm = put_f16(y, 80, make_qp_quants(16, 15, scales, Ls, sw))
            mm = put_f16(y, 82, make_qp_quants(16, 15, mins, Lm, sw))
            for j in range(16):
                y[j] = (int(Ls[j]) | (int(Lm[j]) << 4)) & 0xFF
            for j in range(16):
                d = dm * _f(int(y[j]) & 0xF)
                if d == 0:
                    continue
                m = mm * _f(int(y[j]) >> 4)
                for ii in range(16):
                    L[16 * j + ii] = max(0, min(3, nearest_int((xs[16 * j + ii] + m) / d)))
            _pack_two_bit(L, y, 16)


@njit
def _q3_k_rows(x, qw, out):
    """quantize_row_q3_K_impl: | hmask:32 | qs:64 | scales:12 | d:2 |."""
    n_rows, n_cols = x.shape
    L = np.zeros(QK_K, np.int32)
    weight = np.empty(16, np.float32)
    scales = np.empty(16, np.float32)
    sw = np.empty(16, np.float32)
    Ls = np.zeros(16, np.int32)
    for r in range(n_rows):
        for i in range(n_cols // QK_K):
            xs = x[r, QK_K * i : QK_K * (i + 1)]
            y = out[r, 110 * i : 110 * (i + 1)]
            y[:] = 0
            sigma2 = _sigma2(xs, QK_K, _f(2.0))
            for j in range(16):
                importance_weights(xs[16 * j : 16 * j + 16], qw[QK_K * i + 16 * j : QK_K * i + 16 * j + 16], sigma2, 16, weight)
                s = ZERO
                for l in range(16):
                    s += weight[l]
                sw[j] = s
                scales[j] = make_qx_quants_w(16, 4, xs[16 * j : 16 * j + 16], L[16 * j : 16 * j + 16], weight)
            d_block = make_qx_quants_w(16, 32, scales, Ls, sw)
            for j in range(16):
                l = Ls[j]
                if j < 8:
                    y[96 + j] = l & 0xF
                else:
                    y[96 + j - 8] |= (l & 0xF) << 4
                l >>= 4
                y[96 + j % 4 + 8] |= (l << (2 * (j // 4))) & 0xFF
            dq = put_f16(y, 108, d_block)
            for j in range(16):
                lo = (np.int64(y[96 + j]) & 0xF) if j < 8 else (np.int64(y[96 + j - 8]) >> 4)
                hi = (np.int64(y[104 + j % 4]) >> (2 * (j // 4))) & 3
                d = dq * _f((lo | (hi << 4)) - 32)
                if d == 0:
                    continue
                for ii in range(16):
                    L[16 * j + ii] = max(-4, min(3, nearest_int(xs[16 * j + ii] / d))) + 4
            m = 0
            hm = 1
            for j in range(QK_K):
                if L[j] > 3:
                    y[m] |= hm
                    L[j] -= 4
                m += 1
                if m == 32:
                    m = 0
                    hm <<= 1
            _pack_two_bit(L, y, 32)


@njit
def _k4_scale_min(q, j):
    """get_scale_min_k4 on the 12 packed bytes q."""
    a, b, c = int(q[j]), int(q[j + 4]), int(q[j - 4]) if j >= 4 else 0
    if j < 4:
        return a & 63, b & 63
    return (b & 0xF) | ((c >> 6) << 4), (b >> 4) | ((a >> 6) << 4)


@njit
def _q45_k_rows(x, qw, out, nmax):
    """quantize_row_q4_K_impl (nmax 15) and _q5_K_impl (31): | d:2 | dmin:2 | scales:12 | (qh:32) | qs:128 |."""
    n_rows, n_cols = x.shape
    size = 144 if nmax == 15 else 176
    L = np.zeros(QK_K, np.uint8)
    Laux = np.zeros(32, np.uint8)
    weight = np.empty(32, np.float32)
    scales = np.empty(8, np.float32)
    mins = np.empty(8, np.float32)
    sw = np.empty(8, np.float32)
    Ls = np.zeros(8, np.uint8)
    Lm = np.zeros(8, np.uint8)
    for r in range(n_rows):
        for i in range(n_cols // QK_K):
            xs = x[r, QK_K * i : QK_K * (i + 1)]
            y = out[r, size * i : size * (i + 1)]
            sigma2 = _sigma2(xs, QK_K, _f(2.0))
            for j in range(8):
                importance_weights(xs[32 * j : 32 * j + 32], qw[QK_K * i + 32 * j : QK_K * i + 32 * j + 32], sigma2, 32, weight)
                s = ZERO
                for l in range(32):
                    s += weight[l]
                sw[j] = s
                scales[j], mins[j] = make_qkx3_quants(32, nmax, xs[32 * j : 32 * j + 32], weight, L[32 * j : 32 * j + 32], Laux)
            d_block = make_qp_quants(8, 63, scales, Ls, sw)
            m_block = make_qp_quants(8, 63, mins, Lm, sw)
            sc = y[4:16]
            for j in range(8):
                ls = int(Ls[j]) if nmax == 15 else min(63, int(Ls[j]))
                lm = int(Lm[j]) if nmax == 15 else min(63, int(Lm[j]))
                if j < 4:
                    sc[j] = ls
                    sc[j + 4] = lm
                else:
                    sc[j + 4] = ((ls & 0xF) | ((lm & 0xF) << 4)) & 0xFF
                    sc[j - 4] |= ((ls >> 4) << 6) & 0xFF
                    sc[j] |= ((lm >> 4) << 6) & 0xFF
            dq = put_f16(y, 0, d_block)
            mq = put_f16(y, 2, m_block)
            for j in range(8):
                s_j, m_j = _k4_scale_min(sc, j)
                d = dq * _f(s_j)
                if d == 0:
                    continue
                dm = mq * _f(m_j)
                for ii in range(32):
                    L[32 * j + ii] = max(0, min(nmax, nearest_int((xs[32 * j + ii] + dm) / d)))
            if nmax == 15:
                for j in range(0, QK_K, 64):
                    for l in range(32):
                        y[16 + j // 2 + l] = (int(L[j + l]) | (int(L[j + l + 32]) << 4)) & 0xFF
                continue
            y[16:48] = 0
            m1 = 1
            m2 = 2
            for n in range(0, QK_K, 64):
                for j in range(32):
                    l1 = np.int32(L[n + j])
                    if l1 > 15:
                        l1 -= 16
                        y[16 + j] |= m1
                    l2 = np.int32(L[n + j + 32])
                    if l2 > 15:
                        l2 -= 16
                        y[16 + j] |= m2
                    y[48 + n // 2 + j] = (l1 | (l2 << 4)) & 0xFF
                m1 <<= 2
                m2 <<= 2


@njit
def _q6_k_rows(x, qw, out):
    """quantize_row_q6_K_impl: | ql:128 | qh:64 | scales:16 (int8) | d:2 |."""
    n_rows, n_cols = x.shape
    L = np.zeros(QK_K, np.int32)
    scales = np.empty(16, np.float32)
    sc = np.zeros(16, np.int32)
    for r in range(n_rows):
        for i in range(n_cols // QK_K):
            xs = x[r, QK_K * i : QK_K * (i + 1)]
            y = out[r, 210 * i : 210 * (i + 1)]
            max_scale = ZERO
            max_abs = ZERO
            for ib in range(16):
                scale = make_qx_quants_w(16, 32, xs[16 * ib : 16 * ib + 16], L[16 * ib : 16 * ib + 16],
                                         qw[QK_K * i + 16 * ib : QK_K * i + 16 * ib + 16])
                scales[ib] = scale
                if abs(scale) > max_abs:
                    max_abs = abs(scale)
                    max_scale = scale
            if max_abs < _f(1e-15):
                y[:] = 0
                continue
            iscale = _f(-128.0) / max_scale
            dq = put_f16(y, 208, ONE / iscale)
            for ib in range(16):
                v = min(127, nearest_int(iscale * scales[ib]))
                sc[ib] = ((v + 128) & 0xFF) - 128  # stored in an int8_t
                y[192 + ib] = v & 0xFF
            for j in range(16):
                d = dq * _f(sc[j])
                if d == 0:
                    continue
                for ii in range(16):
                    L[16 * j + ii] = max(-32, min(31, nearest_int(xs[16 * j + ii] / d))) + 32
            for j in range(0, QK_K, 128):
                for l in range(32):
                    q1 = L[j + l] & 0xF
                    q2 = L[j + l + 32] & 0xF
                    q3 = L[j + l + 64] & 0xF
                    q4 = L[j + l + 96] & 0xF
                    y[j // 2 + l] = (q1 | (q3 << 4)) & 0xFF
                    y[j // 2 + l + 32] = (q2 | (q4 << 4)) & 0xFF
                    y[128 + j // 4 + l] = ((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2)
                                           | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6)) & 0xFF


_LEGACY_KIND = {GGMLType.Q4_0: 0, GGMLType.Q4_1: 1, GGMLType.Q5_0: 2, GGMLType.Q5_1: 3}
WEIGHTED_TYPES = (*_LEGACY_KIND, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K)
IQ4_TYPES = (GGMLType.IQ4_NL, GGMLType.IQ4_XS)


def quantize_weighted(x: F32, qtype: GGMLType, qw: F32 | None) -> U8:
    """Rows (n_rows, n_cols) of `qtype` as ggml_quantize_chunk makes them with quant_weights `qw` (n_cols,).

    qw None is allowed for IQ4_NL / IQ4_XS only (their quantizer has no separate reference path).
    """
    x = np.ascontiguousarray(x, np.float32)
    n_rows, n_cols = x.shape
    out = np.zeros((n_rows, TYPES[qtype].row_bytes(n_cols)), np.uint8)
    if qtype in IQ4_TYPES:
        w = np.zeros(n_cols, np.float32) if qw is None else np.ascontiguousarray(qw, np.float32)
        iq4_rows(x, w, out, 32 if qtype == GGMLType.IQ4_NL else QK_K, qw is not None)
        return out
    assert qw is not None
    w = np.ascontiguousarray(qw, np.float32)
    if qtype in _LEGACY_KIND:
        _legacy_rows(x, w, out, _LEGACY_KIND[qtype])
    elif qtype == GGMLType.Q2_K:
        _q2_k_rows(x, w, out)
    elif qtype == GGMLType.Q3_K:
        _q3_k_rows(x, w, out)
    elif qtype in (GGMLType.Q4_K, GGMLType.Q5_K):
        _q45_k_rows(x, w, out, 15 if qtype == GGMLType.Q4_K else 31)
    elif qtype == GGMLType.Q6_K:
        _q6_k_rows(x, w, out)
    else:
        raise ValueError(f"{qtype.name} has no importance-weighted quantizer")
    return out
