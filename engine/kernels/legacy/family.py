"""Products and dequantization on F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights, with ggml-cpu's numerics.

Per type `<t>` (lower-case ggml name):
  gemv_<t>(blocks, xq, out)               out (n_rows,) = W x for one activation xq (bytes,)
  gemm_<t>(blocks, xq, out)               out (m, n_rows) for m activations xq (m, bytes)
  dequantize_rows_<t>(blocks, r0, r1, out) rows [r0, r1) of W into out (r1 - r0, n_cols) float32
  repack_<t>(blocks) -> weight            a faster layout for the products (legacy quants; floats as they are)

`blocks` is the weight's raw GGUF blocks (n_rows, row_bytes) uint8, often a read-only memory map,
or what repack_<t> returned. `xq` is the activation already in the type's vec_dot_type bytes
(activations.quantize_activation: Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, F16, BF16, F32).
Every product equals llama.cpp's ggml_vec_dot_<t> on an AVX-512 build bit for bit (see
legacy_dot.py and legacy_floats.py for the order of operations), and so do the NumPy references
in legacy_ref.py, which run here when numba is missing. dequantize_rows equals
engine.quant.dequantize_rows bit for bit.

Speed: the legacy quants run fastest on repack_<t>'s byte planes (one SIMD lane per row, 64 rows
at a time); on raw blocks each 64-row group is first copied into that layout, 4-8x slower. A
model should repack each legacy weight once at load (same bytes, same memory) and repack again
when a weight's blocks are swapped. Each type's kernel compiles on first use (a few seconds,
cached on disk by numba); the array arguments are normalised (read-only weights and activations,
C-contiguous output) so that one specialisation per type serves every caller.

Callers that may run kernels from several Python threads hold activations.KERNEL_LOCK around each call.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from engine.quant import dequantize_rows
from engine.quant.types import GGMLType

from engine.kernels.legacy import dequant as legacy_dequant
from engine.kernels.floats import vec_dot as legacy_floats
from engine.kernels.floats.tinyblas import bf16_available
from engine.kernels.legacy import products as legacy_products
from engine.kernels import isa
from engine.kernels.activations import HAVE_NUMBA
from engine.kernels.legacy.ref import dot_ref
from engine.kernels.legacy.repack import Repacked, repack, unpack_planes

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
Weight = U8 | Repacked
_T = GGMLType


def _raw(blocks: Weight) -> U8:
    return unpack_planes(blocks) if isinstance(blocks, Repacked) else blocks


_DUMMY_RAW = np.zeros((1, 1), np.uint8)
_DUMMY_RAW.flags.writeable = False
_DUMMY_PLANES = np.zeros((1, 1), np.uint8)


def _read_only(a: np.ndarray) -> np.ndarray:
    """a as a read-only C-contiguous array (a view when it already is contiguous): the one array
    type each kernel is compiled for, whether the caller passed a memory map or a fresh array."""
    a = np.ascontiguousarray(a)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


def _sources(blocks: Weight) -> tuple[np.ndarray, np.ndarray, bool]:
    """(raw, planes, planar) arguments of the compiled legacy kernels."""
    if isinstance(blocks, Repacked):
        return _DUMMY_RAW, blocks.planes.reshape(blocks.planes.shape[0], -1), True
    return _read_only(blocks), _DUMMY_PLANES, False


def _float_dot(qtype: GGMLType | int) -> Callable[[np.ndarray, np.ndarray, F32], None]:
    """vec_dot of a float type in the order of the build engine.kernels.isa names (the step of its four
    accumulators: 64 on AVX-512, 32 on AVX2)."""
    step = np.int64(4 * isa.lanes())
    dot = {_T.F32: legacy_floats.dot_f32, _T.F16: legacy_floats.dot_f16}.get(qtype, legacy_floats.dot_bf16)
    if qtype == _T.BF16 and step == 64 and bf16_available():  # VDPBF16PS itself, for one activation row
        dp = legacy_floats.dot_bf16_dp
        return lambda w, y, out: dp(w, y, out) if y.shape[0] == 1 else dot(w, y, out, step)
    return lambda w, y, out: dot(w, y, out, step)


def _float_view(qtype: GGMLType | int) -> type:
    return np.float32 if qtype == _T.F32 else np.uint16


def _product(qtype: GGMLType | int, blocks: Weight, xq: U8, out: F32) -> None:
    """out (m, n_rows) = vec_dot of every row with every activation row of xq (m, bytes)."""
    if not HAVE_NUMBA:
        out[:] = dot_ref(qtype, _raw(blocks), xq, 4 * isa.lanes())
        return
    target = out if out.flags.c_contiguous else np.empty(out.shape, np.float32)
    xq = _read_only(xq)
    if qtype in (_T.F32, _T.F16, _T.BF16):
        _float_dot(qtype)(_read_only(blocks).view(_float_view(qtype)), xq.view(_float_view(qtype)), target)
    else:
        raw, planes, planar = _sources(blocks)
        legacy_products.product(int(qtype), raw, planes, planar, blocks.shape[0], xq, target)
    if target is not out:
        out[:] = target


def bind_gemv(qtype: GGMLType | int, blocks: Weight, xq: U8, out: F32) -> Callable[[], None]:
    """The gemv of `blocks` with one activation buffer xq (1, bytes) and out (1, n_rows) fixed: a call without
    arguments runs it on whatever xq holds then (a decode step fills the same buffers token after token).
    Compiled kernels only; the caller holds KERNEL_LOCK."""
    xq = _read_only(xq)  # a read-only view of the caller's buffer: the kernels' one specialisation
    if qtype in (_T.F32, _T.F16, _T.BF16):
        dot, view = _float_dot(qtype), _float_view(qtype)
        w, y = _read_only(blocks).view(view), xq.view(view)
        return lambda: dot(w, y, out)
    raw, planes, planar = _sources(blocks)
    fn, n = legacy_products.PRODUCT[int(qtype)], blocks.shape[0]
    return lambda: fn(raw, planes, planar, n, xq, out)


def kind_gemv(kind: int) -> Callable[[Weight, U8, F32], None]:
    """The one-row product for a kernel type id of legacy_products.PRODUCT (legacy_dot.Q4_0_X8 too)."""

    def gemv(blocks: Weight, xq: U8, out: F32) -> None:
        _product(kind, blocks, xq.reshape(1, -1), out.reshape(1, -1))

    return gemv


def _gemv(qtype: GGMLType) -> Callable[[Weight, U8, F32], None]:
    gemv = kind_gemv(qtype)
    gemv.__name__ = f"gemv_{qtype.name.lower()}"
    gemv.__doc__ = f"out (n_rows,) = ggml_vec_dot of each {qtype.name} row with one activation xq (bytes,)."
    return gemv


def _gemm(qtype: GGMLType) -> Callable[[Weight, U8, F32], None]:
    def gemm(blocks: Weight, xq: U8, out: F32) -> None:
        _product(qtype, blocks, xq, out)

    gemm.__name__ = f"gemm_{qtype.name.lower()}"
    gemm.__doc__ = f"out (m, n_rows) = ggml_vec_dot of each {qtype.name} row with each activation xq (m, bytes)."
    return gemm


def _dequantize(qtype: GGMLType) -> Callable[[Weight, int, int, F32], None]:
    def dequantize(blocks: Weight, r0: int, r1: int, out: F32) -> None:
        if not HAVE_NUMBA:
            out[:] = dequantize_rows(_raw(blocks)[r0:r1], qtype)
        elif qtype == _T.F32:
            out[:] = blocks[r0:r1].view(np.float32)
        elif qtype in (_T.F16, _T.BF16):
            fn = legacy_dequant.dequant_f16 if qtype == _T.F16 else legacy_dequant.dequant_bf16
            fn(_read_only(blocks).view(np.uint16), r0, r1, out)
        else:
            raw, planes, planar = _sources(blocks)
            legacy_dequant.dequant(int(qtype), raw, planes, planar, r0, r1, out)

    dequantize.__name__ = f"dequantize_rows_{qtype.name.lower()}"
    dequantize.__doc__ = f"Rows [r0, r1) of {qtype.name} blocks into out float32, as engine.quant.dequantize_rows."
    return dequantize


def _repack(qtype: GGMLType) -> Callable[[U8], Weight]:
    def repack_type(blocks: U8) -> Weight:
        if qtype in (_T.F32, _T.F16, _T.BF16):
            return blocks  # already one SIMD lane per value: nothing to gain
        return repack(qtype, blocks)

    repack_type.__name__ = f"repack_{qtype.name.lower()}"
    repack_type.__doc__ = f"{qtype.name} blocks in the layout the products read fastest (byte planes; floats unchanged)."
    return repack_type


TYPES = (_T.F32, _T.F16, _T.BF16, _T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0)
GEMV = {t: _gemv(t) for t in TYPES}
GEMM = {t: _gemm(t) for t in TYPES}
DEQUANTIZE_ROWS = {t: _dequantize(t) for t in TYPES}
REPACK = {t: _repack(t) for t in TYPES}

gemv_f32, gemv_f16, gemv_bf16 = GEMV[_T.F32], GEMV[_T.F16], GEMV[_T.BF16]
gemv_q4_0, gemv_q4_1, gemv_q5_0, gemv_q5_1, gemv_q8_0 = (GEMV[t] for t in TYPES[3:])
gemm_f32, gemm_f16, gemm_bf16 = GEMM[_T.F32], GEMM[_T.F16], GEMM[_T.BF16]
gemm_q4_0, gemm_q4_1, gemm_q5_0, gemm_q5_1, gemm_q8_0 = (GEMM[t] for t in TYPES[3:])
dequantize_rows_f32, dequantize_rows_f16, dequantize_rows_bf16 = (DEQUANTIZE_ROWS[t] for t in TYPES[:3])
dequantize_rows_q4_0, dequantize_rows_q4_1, dequantize_rows_q5_0, dequantize_rows_q5_1, dequantize_rows_q8_0 = (
    DEQUANTIZE_ROWS[t] for t in TYPES[3:])
repack_f32, repack_f16, repack_bf16 = (REPACK[t] for t in TYPES[:3])
repack_q4_0, repack_q4_1, repack_q5_0, repack_q5_1, repack_q8_0 = (REPACK[t] for t in TYPES[3:])
