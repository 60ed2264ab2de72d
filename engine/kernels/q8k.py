"""Activation quantization to Q8_K, byte for byte as ggml-cpu does before every k-quant product.

The k-quant dot products (ggml_vec_dot_q*_K_q8_K) take their right-hand side as Q8_K blocks,
which ggml-cpu makes with `quantize_row_q8_K`. On x86 (AVX2 / AVX-512 builds) that function
calls `quantize_row_q8_K_ref` in ggml-quants.c, which ggml-base compiles without FMA
contraction; so the scale is the signed value of largest magnitude (the first one on ties),
`iscale = -127 / max`, every weight is `nearest_int(iscale * x)` (the 1.5 * 2^23 trick: round
half to even, a NaN product maps to its low mantissa bits) clamped to 127, and `d = 1 / iscale`.
An all-zero block keeps d = 0 and zero quants; its bsums, which C leaves untouched, are zero here.

block_q8_K (ggml-common.h), 292 bytes, little-endian:
  | d: float32 | qs: int8[256] | bsums: int16[16] |     bsums[j] = sum of qs[16j : 16j + 16]

`quantize_q8_k` runs the compiled kernel (one block as LLVM vector IR; `quantize_q8_k_into` is the
njit entry for compiled callers); `quantize_q8_k_ref` is the vectorised NumPy reference (and the
fallback without numba) producing the same bytes.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.kernels import precompile
from engine.kernels.types import ACT_BLOCK
from engine.quant.types import GGMLType

try:  # numba is optional: without it quantize_q8_k is the NumPy reference
    from llvmlite import ir
    from numba import njit, prange, types
    from numba.extending import intrinsic

    from engine.kernels.simd import (
        F32 as _F,  # the LLVM float type (F32 here is the NumPy array alias)
    )
    from engine.kernels.simd import I8, I16, I32, byte_ptr, call_intrinsic, load, shuffle, vec
except ImportError:  # pragma: no cover - exercised only where numba is absent
    njit = None

QK_K = 256
Q8K_BLOCK_BYTES = ACT_BLOCK[GGMLType.Q8_K][1]  # 4 + QK_K + 2 * (QK_K // 16): d, 256 quants, 16 sums

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]

# nearest_int in ggml-quants.c: adding 1.5 * 2^23 leaves the rounded integer in the mantissa
_MAGIC = np.float32(12582912.0)


def _check_rows(x: npt.ArrayLike) -> F32:
    if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous):
        x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim not in (1, 2):
        raise ValueError(f"quantize_q8_k expects a row or a (m, n) batch, got shape {x.shape}")
    if x.shape[-1] % QK_K:
        raise ValueError(f"row size {x.shape[-1]} is not a multiple of Q8_K block size ({QK_K})")
    return x


# ---- compiled kernel: one block as LLVM vector IR, 16 floats at a time

if njit is not None:

    def _splat(value, n: int = 16):
        """A constant vector of n copies of a constant."""
        return ir.Constant(vec(value.type, n), [value] * n)

    def _bcast(b, value, n: int = 16):
        """n copies of a run-time scalar."""
        u = b.insert_element(ir.Constant(vec(value.type, n), None), value, ir.Constant(I32, 0))
        return shuffle(b, u, [0] * n)

    def _store(b, ptr, offset: int, value) -> None:
        p = b.gep(ptr, [ir.Constant(ir.IntType(64), offset)]) if offset else ptr
        b.store(value, b.bitcast(p, value.type.as_pointer()), align=1)

    def _quantize_block_ir(b, px, po) -> None:
        """quantize_row_q8_K_ref for the 256 floats at px into the block_q8_K at po (both i8 pointers)."""
        f16x = vec(_F, 16)
        fabs = [call_intrinsic(b, "llvm.fabs.v16f32", f16x, [load(b, px, f16x, 64 * k)]) for k in range(16)]
        amax = ir.Constant(f16x, None)
        for ax in fabs:  # `if (ax > amax)`: a NaN never wins
            amax = b.select(b.fcmp_ordered(">", ax, amax), ax, amax)
        m = ir.Constant(_F, 0.0)
        for lane in range(16):
            v = b.extract_element(amax, ir.Constant(I32, lane))
            m = b.select(b.fcmp_ordered(">", v, m), v, m)
        # the value C keeps is the first one of that magnitude
        none = _splat(ir.Constant(I32, QK_K))
        first = none
        for k, ax in enumerate(fabs):
            idx = ir.Constant(vec(I32, 16), [ir.Constant(I32, 16 * k + i) for i in range(16)])
            hit = b.select(b.fcmp_ordered("==", ax, _bcast(b, m)), idx, none)
            first = call_intrinsic(b, "llvm.umin.v16i32", vec(I32, 16), [first, hit])
        j = call_intrinsic(b, "llvm.vector.reduce.umin.v16i32", I32, [first])
        j = b.select(b.icmp_unsigned("<", j, ir.Constant(I32, QK_K)), j, ir.Constant(I32, 0))  # all NaN: unused
        i64 = ir.IntType(64)
        vmax = b.load(b.bitcast(b.gep(px, [b.shl(b.zext(j, i64), ir.Constant(i64, 2))]), _F.as_pointer()), align=4)
        zero = b.fcmp_ordered("==", m, ir.Constant(_F, 0.0))
        iscale = b.fdiv(ir.Constant(_F, -127.0), vmax)
        scale, magic = _bcast(b, iscale), _splat(ir.Constant(_F, float(_MAGIC)))
        for k in range(16):
            t = b.fadd(b.fmul(scale, load(b, px, f16x, 64 * k)), magic)  # nearest_int(iscale * x)
            q = b.sub(b.and_(b.bitcast(t, vec(I32, 16)), _splat(ir.Constant(I32, 0x007FFFFF))),
                      _splat(ir.Constant(I32, 0x00400000)))
            q = call_intrinsic(b, "llvm.smin.v16i32", vec(I32, 16), [q, _splat(ir.Constant(I32, 127))])
            q8 = b.select(zero, ir.Constant(vec(I8, 16), None), b.trunc(q, vec(I8, 16)))
            _store(b, po, 4 + 16 * k, q8)
            bsum = call_intrinsic(b, "llvm.vector.reduce.add.v16i32", I32, [b.sext(q8, vec(I32, 16))])
            _store(b, po, 4 + QK_K + 2 * k, b.trunc(bsum, I16))
        _store(b, po, 0, b.select(zero, ir.Constant(_F, 0.0), b.fdiv(ir.Constant(_F, 1.0), iscale)))

    @intrinsic
    def _quantize_block(typingctx, x, xo, out, oo):
        """Block at byte xo of the float32 array x -> the 292 bytes at byte oo of the uint8 array out."""
        ok = (isinstance(x, types.Array) and x.dtype == types.float32 and isinstance(out, types.Array)
              and out.dtype == types.uint8 and isinstance(xo, types.Integer) and isinstance(oo, types.Integer))
        if not ok:
            return None

        def codegen(context, builder, signature, args):
            px = byte_ptr(context, builder, signature.args[0], args[0], args[1])
            po = byte_ptr(context, builder, signature.args[2], args[2], args[3])
            _quantize_block_ir(builder, px, po)
            return context.get_dummy_value()

        return types.void(x, xo, out, oo), codegen

    @njit(cache=True, error_model="numpy")
    def quantize_q8_k_into(x, out):
        """Q8_K bytes of the float32 rows x (m, n), n a multiple of 256, into out (m, n // 256 * 292) uint8."""
        n = x.shape[1]
        if x.shape[0] != out.shape[0] or out.shape[1] != n // QK_K * Q8K_BLOCK_BYTES or n % QK_K:
            raise ValueError("quantize_q8_k_into: out must be (m, n // 256 * 292) for x (m, n), n a multiple of 256")
        if x.size and (x.strides[1] != 4 or out.strides[1] != 1):
            raise ValueError("quantize_q8_k_into: rows must be contiguous")
        for r in range(x.shape[0]):
            for i in range(x.shape[1] // QK_K):
                _quantize_block(x, r * x.strides[0] + 1024 * i, out, r * out.strides[0] + Q8K_BLOCK_BYTES * i)

    @njit(cache=True, parallel=True, error_model="numpy")
    def _quantize_rows_parallel(x, out):
        for r in prange(x.shape[0]):
            for i in range(x.shape[1] // QK_K):
                _quantize_block(x, r * x.strides[0] + 1024 * i, out, r * out.strides[0] + Q8K_BLOCK_BYTES * i)


# batches at least this large go through the threaded kernel; a decode step's one row does not
_PARALLEL_MIN_ROWS = 16


def quantize_q8_k(x: npt.ArrayLike) -> U8:
    """Q8_K bytes of a float32 row (n,) -> (n // 256 * 292,), or of a batch (m, n) -> (m, n // 256 * 292)."""
    if njit is None:
        return quantize_q8_k_ref(x)
    x = _check_rows(x)
    n = x.shape[-1]
    if x.ndim == 1:  # a decode step: no threads
        out = np.empty((1, n // QK_K * Q8K_BLOCK_BYTES), dtype=np.uint8)
        quantize_q8_k_into(x.reshape(1, n), out)
        return out.reshape(-1)
    out = np.empty((x.shape[0], n // QK_K * Q8K_BLOCK_BYTES), dtype=np.uint8)
    # threads for a batch once the late kernels may run (a first start's helpers compile only the serial loop)
    threads = x.shape[0] >= _PARALLEL_MIN_ROWS and precompile.late_ready()
    (_quantize_rows_parallel if threads else quantize_q8_k_into)(x, out)
    return out


# ---- NumPy reference


def quantize_q8_k_ref(x: npt.ArrayLike) -> U8:
    """The same bytes as quantize_q8_k, computed with vectorised NumPy (the reference and fallback)."""
    x = _check_rows(x)
    blocks = x.reshape(-1, QK_K)
    ax = np.abs(blocks)
    ax = np.where(np.isnan(ax), np.float32(-1.0), ax)  # C's `ax > amax` never picks a NaN
    first = np.argmax(ax, axis=1)  # the first index of the largest magnitude
    vmax = blocks[np.arange(len(blocks)), first]
    zero = ax[np.arange(len(blocks)), first] <= 0
    with np.errstate(all="ignore"):
        iscale = np.float32(-127.0) / np.where(zero, np.float32(1.0), vmax)
        shifted = (iscale[:, None] * blocks + _MAGIC).astype(np.float32)
        q = (shifted.view(np.int32) & np.int32(0x007FFFFF)) - np.int32(0x00400000)
        d = np.float32(1.0) / iscale
    q = np.minimum(q, 127).astype(np.int8)
    q[zero] = 0
    d = np.where(zero, np.float32(0.0), d).astype(np.float32)
    bsums = q.reshape(-1, 16, 16).astype(np.int32).sum(axis=2).astype(np.int16)
    out = np.empty((len(blocks), Q8K_BLOCK_BYTES), dtype=np.uint8)
    out[:, 0:4] = d.astype("<f4").reshape(-1, 1).view(np.uint8)
    out[:, 4 : 4 + QK_K] = q.view(np.uint8)
    out[:, 4 + QK_K :] = bsums.astype("<i2").view(np.uint8)
    n_blocks = x.shape[-1] // QK_K
    return out.reshape(-1) if x.ndim == 1 else out.reshape(x.shape[0], n_blocks * Q8K_BLOCK_BYTES)


def q8k_fields(xq: npt.ArrayLike) -> tuple[F32, npt.NDArray[np.int8], npt.NDArray[np.int16]]:
    """Split Q8_K bytes (..., n_blocks * 292) into d (..., nb), qs (..., nb, 256) and bsums (..., nb, 16)."""
    xq = np.ascontiguousarray(xq, dtype=np.uint8)
    if xq.shape[-1] % Q8K_BLOCK_BYTES:
        raise ValueError(f"Q8_K data of {xq.shape[-1]} bytes per row is not a whole number of 292-byte blocks")
    b = xq.reshape(*xq.shape[:-1], -1, Q8K_BLOCK_BYTES)
    d = np.ascontiguousarray(b[..., 0:4]).view("<f4")[..., 0].astype(np.float32)
    qs = np.ascontiguousarray(b[..., 4 : 4 + QK_K]).view(np.int8)
    bsums = np.ascontiguousarray(b[..., 4 + QK_K :]).view("<i2").astype(np.int16)
    return d, qs, bsums
