"""The parallel entry points of the legacy-quant products: one compiled function per weight type.

Each entry runs the row groups of a weight in parallel (numba prange) and, per group, the fused
kernel of legacy_dot once per activation (a batch re-reads the group's planes from cache). The
shared helpers take the type as an np.int64 argument, not a literal (a literal would compile them
once more per type, seconds at first start each), so they compile once and serve every type.
Arguments always have the same array types (raw blocks read-only, planes writable), so there is
one specialisation per entry:

  product_<t>(raw, planes, planar, n_rows, xq, out)
    raw     (n_rows, row_bytes) uint8, read-only: the GGUF blocks (a 1x1 dummy when planar)
    planes  (ng, nb * size * ROW_GROUP) uint8: byte planes (legacy_repack; a 1x1 dummy when raw)
    xq      (m, bytes) uint8, read-only: activations in block_q8_0 / block_q8_1 bytes
    out     (m, n_rows) float32
"""
from __future__ import annotations

import numpy as np

from .activations import njit, prange
from .legacy_dot import (
    ACC,
    BLOCK_BYTES_ARR,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_0_X8,
    G,
    _dot_group,
    _finish,
)
from .legacy_repack import QK, gather_group, unpack_q8


@njit(cache=True)
def _setup(kind, raw, planes, planar, xq):
    """(nb, size, groups, d, s, quants) of one call: the activation unpacked to float32 once."""
    size = BLOCK_BYTES_ARR[kind]
    nb = (planes.shape[1] // (size * G)) if planar else raw.shape[1] // size
    ng = planes.shape[0] if planar else (raw.shape[0] + G - 1) // G
    m = xq.shape[0]
    yd = np.empty((m, nb), np.float32)
    ys = np.empty((m, nb), np.float32)
    yf = np.empty((m, nb, QK), np.float32)
    unpack_q8(xq, xq.shape[1] // nb, yd, ys, yf)
    return nb, size, ng, yd, ys, yf


@njit(cache=True)
def _group(kind, raw, planes, planar, g, n_rows, nb, size, yd, ys, yf, out):
    """Every activation against row group g (g as int64: prange may hand out unsigned indices, which
    would compile a second specialisation)."""
    if planar:
        pl = planes[g]
    else:
        pl = np.empty(nb * size * G, np.uint8)
        gather_group(raw, g, size, pl)
    acc = np.empty(ACC * G, np.float32)
    n = min(G, n_rows - g * G)
    for i in range(yf.shape[0]):
        acc[:] = 0.0
        _dot_group(kind, pl, size, yd, ys, yf, i, acc)
        _finish(acc, out, i, g * G, n, kind == Q4_1 or kind == Q5_1)


@njit(cache=True, parallel=True)
def product_q4_0(raw, planes, planar, n_rows, xq, out):
    """Q4_0 x Q8_0: ggml_vec_dot_q4_0_q8_0 of every row and activation."""
    nb, size, ng, yd, ys, yf = _setup(np.int64(Q4_0), raw, planes, planar, xq)
    for g in prange(ng):
        _group(np.int64(Q4_0), raw, planes, planar, np.int64(g), n_rows, nb, size, yd, ys, yf, out)


@njit(cache=True, parallel=True)
def product_q4_1(raw, planes, planar, n_rows, xq, out):
    """Q4_1 x Q8_1: ggml_vec_dot_q4_1_q8_1 of every row and activation."""
    nb, size, ng, yd, ys, yf = _setup(np.int64(Q4_1), raw, planes, planar, xq)
    for g in prange(ng):
        _group(np.int64(Q4_1), raw, planes, planar, np.int64(g), n_rows, nb, size, yd, ys, yf, out)


@njit(cache=True, parallel=True)
def product_q5_0(raw, planes, planar, n_rows, xq, out):
    """Q5_0 x Q8_0: ggml_vec_dot_q5_0_q8_0 of every row and activation."""
    nb, size, ng, yd, ys, yf = _setup(np.int64(Q5_0), raw, planes, planar, xq)
    for g in prange(ng):
        _group(np.int64(Q5_0), raw, planes, planar, np.int64(g), n_rows, nb, size, yd, ys, yf, out)


@njit(cache=True, parallel=True)
def product_q5_1(raw, planes, planar, n_rows, xq, out):
    """Q5_1 x Q8_1: ggml_vec_dot_q5_1_q8_1 of every row and activation."""
    nb, size, ng, yd, ys, yf = _setup(np.int64(Q5_1), raw, planes, planar, xq)
    for g in prange(ng):
        _group(np.int64(Q5_1), raw, planes, planar, np.int64(g), n_rows, nb, size, yd, ys, yf, out)


@njit(cache=True, parallel=True)
def product_q8_0(raw, planes, planar, n_rows, xq, out):
    """Q8_0 x Q8_0: ggml_vec_dot_q8_0_q8_0 of every row and activation."""
    nb, size, ng, yd, ys, yf = _setup(np.int64(Q8_0), raw, planes, planar, xq)
    for g in prange(ng):
        _group(np.int64(Q8_0), raw, planes, planar, np.int64(g), n_rows, nb, size, yd, ys, yf, out)


@njit(cache=True, parallel=True)
def product_q4_0_x8(raw, planes, planar, n_rows, xq, out):
    """Q4_0 x Q8_0 as ggml_gemv_q4_0_8x8_q8_0 (a weight llama.cpp repacks): one fma per block and row."""
    nb, size, ng, yd, ys, yf = _setup(np.int64(Q4_0), raw, planes, planar, xq)
    for g in prange(ng):
        _group(np.int64(Q4_0_X8), raw, planes, planar, np.int64(g), n_rows, nb, size, yd, ys, yf, out)


PRODUCTS = {Q4_0: product_q4_0, Q4_1: product_q4_1, Q5_0: product_q5_0, Q5_1: product_q5_1, Q8_0: product_q8_0,
            Q4_0_X8: product_q4_0_x8}
