"""The parallel entry point of the legacy-quant products: a compiled copy per weight type, made on first use.

`PRODUCT[kind]` runs the row groups of a weight in parallel (numba prange) and, per group, the fused kernel of
legacy_dot once per activation (a batch re-reads the group's planes from cache). The functions here are plain
Python; each weight type gets its own compiled copy of the three (engine.kernels.variants.specialise, the
global KIND a constant in it), so a first start compiles the code of the model's types only, not of all six.
Arguments always have the same array types (raw blocks read-only, planes writable), so each copy has one
specialisation:

  PRODUCT[kind](raw, planes, planar, n_rows, xq, out)
  product(kind, raw, planes, planar, n_rows, xq, out)      the same, looked up per call
    kind    the type id (legacy_dot: Q4_0 ... Q8_0, or Q4_0_X8 for llama.cpp's repacked Q4_0 numbers)
    raw     (n_rows, row_bytes) uint8, read-only: the GGUF blocks (a 1x1 dummy when planar)
    planes  (ng, nb * size * ROW_GROUP) uint8: byte planes (legacy_repack; a 1x1 dummy when raw)
    xq      (m, bytes) uint8, read-only: activations in block_q8_0 / block_q8_1 bytes
    out     (m, n_rows) float32
"""
from __future__ import annotations

import numpy as np

from engine.kernels.activations import prange
from engine.kernels.legacy import dot
from engine.kernels.legacy.dot import ACC, BLOCK_BYTES_ARR, Q4_0, Q4_0_X8, Q4_1, Q5_0, Q5_1, Q8_0, G, _finish
from engine.kernels.legacy.repack import QK, gather_group, unpack_q8
from engine.kernels.variants import per_kind, specialise

KIND = Q4_0  # a constant in each compiled copy
KINDS = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_0_X8)


def _setup(raw, planes, planar, xq):
    """(nb, size, groups, d, s, quants) of one call: the activation unpacked to float32 once."""
    size = BLOCK_BYTES_ARR[Q4_0 if KIND == Q4_0_X8 else KIND]
    nb = (planes.shape[1] // (size * G)) if planar else raw.shape[1] // size
    ng = planes.shape[0] if planar else (raw.shape[0] + G - 1) // G
    m = xq.shape[0]
    yd = np.empty((m, nb), np.float32)
    ys = np.empty((m, nb), np.float32)
    yf = np.empty((m, nb, QK), np.float32)
    unpack_q8(xq, xq.shape[1] // nb, yd, ys, yf)
    return nb, size, ng, yd, ys, yf


def _group(raw, planes, planar, g, n_rows, nb, size, yd, ys, yf, out):
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
        _dot_group(pl, size, yd, ys, yf, i, acc)
        _finish(acc, out, i, g * G, n, KIND == Q4_1 or KIND == Q5_1)


def _product(raw, planes, planar, n_rows, xq, out):
    """ggml_vec_dot_<type>_q8_<0|1> of every row and activation (Q4_0_X8: ggml_gemv_q4_0_8x8_q8_0's numbers)."""
    nb, size, ng, yd, ys, yf = _setup(raw, planes, planar, xq)
    for g in prange(ng):
        _group(raw, planes, planar, np.int64(g), n_rows, nb, size, yd, ys, yf, out)


_NAMES = {Q4_0: "q4_0", Q4_1: "q4_1", Q5_0: "q5_0", Q5_1: "q5_1", Q8_0: "q8_0", Q4_0_X8: "q4_0_x8"}


@per_kind(KINDS)
def PRODUCT(kind: int):  # noqa: N802 - a table, read as PRODUCT[kind]
    """The compiled product of one type: _product, _setup, _group and legacy_dot._dot_group copied with KIND fixed."""
    name, fixed = _NAMES[kind], {"KIND": kind}
    inner = specialise(dot._dot_group, name, fixed, cache=True)
    group = specialise(_group, name, {**fixed, "_dot_group": inner}, cache=True)
    setup = specialise(_setup, name, fixed, cache=True)
    return specialise(_product, name, {**fixed, "_group": group, "_setup": setup}, cache=True, parallel=True)


def product(kind, raw, planes, planar, n_rows, xq, out):
    """PRODUCT[kind](raw, planes, planar, n_rows, xq, out)."""
    PRODUCT[kind](raw, planes, planar, n_rows, xq, out)
