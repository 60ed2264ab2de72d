"""The parallel entry point of the legacy-quant products, one compiled function for every weight type.

`product` runs the row groups of a weight in parallel (numba prange) and, per group, the fused
kernel of legacy_dot once per activation (a batch re-reads the group's planes from cache). The
type is an np.int64 argument all the way down, not a literal (a literal would compile the helpers
once more per type, seconds at first start each), so it compiles once and serves every type.
Arguments always have the same array types (raw blocks read-only, planes writable), so there is
one specialisation:

  product(kind, raw, planes, planar, n_rows, xq, out)
    kind    the type id (legacy_dot: Q4_0 ... Q8_0, or Q4_0_X8 for llama.cpp's repacked Q4_0 numbers)
    raw     (n_rows, row_bytes) uint8, read-only: the GGUF blocks (a 1x1 dummy when planar)
    planes  (ng, nb * size * ROW_GROUP) uint8: byte planes (legacy_repack; a 1x1 dummy when raw)
    xq      (m, bytes) uint8, read-only: activations in block_q8_0 / block_q8_1 bytes
    out     (m, n_rows) float32
"""
from __future__ import annotations

import numpy as np

from engine.kernels.activations import njit, prange
from engine.kernels.legacy.dot import (
    ACC,
    BLOCK_BYTES_ARR,
    Q4_0,
    Q4_0_X8,
    Q4_1,
    Q5_1,
    G,
    _dot_group,
    _finish,
)
from engine.kernels.legacy.repack import QK, gather_group, unpack_q8


@njit(cache=True)
def _setup(kind, raw, planes, planar, xq):
    """(nb, size, groups, d, s, quants) of one call: the activation unpacked to float32 once."""
    size = BLOCK_BYTES_ARR[Q4_0 if kind == Q4_0_X8 else kind]
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
def product(kind, raw, planes, planar, n_rows, xq, out):
    """ggml_vec_dot_<type>_q8_<0|1> of every row and activation (Q4_0_X8: ggml_gemv_q4_0_8x8_q8_0's numbers)."""
    nb, size, ng, yd, ys, yf = _setup(kind, raw, planes, planar, xq)
    for g in prange(ng):
        _group(kind, raw, planes, planar, np.int64(g), n_rows, nb, size, yd, ys, yf, out)
