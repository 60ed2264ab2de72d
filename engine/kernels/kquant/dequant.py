"""Compiled k-quant dequantization of a row range, bit-identical with engine.quant.dequantize_rows.

For prefill tiles (dequantize a few rows into scratch, then BLAS) and embedding look-ups. The
float steps are those of engine/quant/kquants.py (and dequantize_row_q*_K in ggml-quants.c):
one float32 product for the sub-block scale, `dl * q`, then `- ml` where there is a minimum,
with no fused multiply-add; only the lane layout is vectorised, as explicit LLVM vectors.

`dequantize_rows_<type>(blocks, r0, r1, out)` writes rows r0 .. r1 - 1 of the (n_rows,
row_bytes) uint8 weights into `out`, a C-contiguous (r1 - r0, n_cols) float32 array, threads
over rows, and returns `out`.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from engine.kernels.kquant.lanes import k4_scales_mins_ir, q3_k_scales_ir
from engine.kernels.simd import (
    F32,
    I8,
    I16,
    I32,
    byte_ptr,
    const_vec,
    half_to_float,
    load,
    splat_const,
    vec,
)

u64 = np.uint64
V32 = vec(I8, 32)
F32x32 = vec(F32, 32)


def _bv(value: int, n: int = 32) -> ir.Constant:
    return splat_const(I8, value - 256 if value > 127 else value, n)


def _half(context, builder, ptr, offset: int) -> ir.Value:
    return half_to_float(context, builder, load(builder, ptr, I16, offset))


def _splat_f(builder, v: ir.Value, n: int) -> ir.Value:
    u = builder.insert_element(ir.Constant(vec(F32, n), None), v, ir.Constant(I32, 0))
    return builder.shuffle_vector(u, u, const_vec(I32, [0] * n))


def _pick(builder, v: ir.Value, k0: int, k1: int) -> ir.Value:
    """<32 x float>: v[k0] for elements 0..15, v[k1] for 16..31."""
    return builder.shuffle_vector(v, v, const_vec(I32, [k0] * 16 + [k1] * 16))


def _store(builder, ptr, offset: int, v: ir.Value) -> None:
    p = builder.gep(ptr, [ir.Constant(ir.IntType(64), offset)]) if offset else ptr
    builder.store(v, builder.bitcast(p, v.type.as_pointer()), align=4)


def _emit(builder, out, e0: int, q: ir.Value, dl: ir.Value, ml: ir.Value | None, signed: bool) -> None:
    """out[e0 : e0 + 32] = dl * float(q) (- ml), q a <32 x i8> of quants."""
    qf = builder.sitofp(q, F32x32) if signed else builder.uitofp(q, F32x32)
    w = builder.fmul(dl, qf)
    if ml is not None:
        w = builder.fsub(w, ml)
    _store(builder, out, 4 * e0, w)


def _dequant_intrinsic(body):
    """`body(context, builder, pw, po)` writes one super-block's 256 floats at the byte pointer po."""

    def typer(typingctx, w, wo, out, oo):
        ok = (isinstance(w, types.Array) and w.dtype == types.uint8 and isinstance(out, types.Array)
              and out.dtype == types.float32 and isinstance(wo, types.Integer) and isinstance(oo, types.Integer))
        if not ok:
            return None
        sig = types.void(w, wo, out, oo)

        def codegen(context, builder, signature, args):
            pw = byte_ptr(context, builder, signature.args[0], args[0], args[1])
            po = byte_ptr(context, builder, signature.args[2], args[2], args[3])
            body(context, builder, pw, po)
            return context.get_dummy_value()

        return sig, codegen

    typer.__name__ = body.__name__
    return intrinsic(typer)


def _scaled(builder, d: ir.Value, ints: ir.Value, signed: bool) -> ir.Value:
    n = ints.type.count
    f = builder.sitofp(ints, vec(F32, n)) if signed else builder.uitofp(ints, vec(F32, n))
    return builder.fmul(_splat_f(builder, d, n), f)


def _q2_k(context, b, pw, po) -> None:
    sc8 = load(b, pw, vec(I8, 16), 0)
    dl = _scaled(b, _half(context, b, pw, 80), b.and_(sc8, _bv(15, 16)), False)
    ml = _scaled(b, _half(context, b, pw, 82), b.lshr(sc8, _bv(4, 16)), False)
    for h in range(2):
        bits = load(b, pw, V32, 16 + 32 * h)
        for s in range(4):
            c = 4 * h + s
            q = b.and_(b.lshr(bits, _bv(2 * s)), _bv(3))
            _emit(b, po, 32 * c, q, _pick(b, dl, 2 * c, 2 * c + 1), _pick(b, ml, 2 * c, 2 * c + 1), False)


def _q3_k(context, b, pw, po) -> None:
    sc = q3_k_scales_ir(b, pw)
    dl = _scaled(b, _half(context, b, pw, 108), sc, True)
    hmask = load(b, pw, V32, 0)
    for h in range(2):
        bits = load(b, pw, V32, 32 + 32 * h)
        for s in range(4):
            c = 4 * h + s
            low = b.and_(b.lshr(bits, _bv(2 * s)), _bv(3))
            clear = b.icmp_unsigned("==", b.and_(hmask, _bv(1 << c)), _bv(0))
            q = b.sub(low, b.select(clear, _bv(4), _bv(0)))
            _emit(b, po, 32 * c, q, _pick(b, dl, 2 * c, 2 * c + 1), None, True)


def _k4_dl_ml(context, b, pw):
    scales, mins = k4_scales_mins_ir(b, pw)
    return (_scaled(b, _half(context, b, pw, 0), scales, False), _scaled(b, _half(context, b, pw, 2), mins, False))


def _q4_k(context, b, pw, po) -> None:
    dl, ml = _k4_dl_ml(context, b, pw)
    for j in range(4):
        bits = load(b, pw, V32, 16 + 32 * j)
        for h, q in enumerate((b.and_(bits, _bv(15)), b.lshr(bits, _bv(4)))):
            s = 2 * j + h
            _emit(b, po, 32 * s, q, _pick(b, dl, s, s), _pick(b, ml, s, s), False)


def _q5_k(context, b, pw, po) -> None:
    dl, ml = _k4_dl_ml(context, b, pw)
    qh = load(b, pw, V32, 16)
    for j in range(4):
        bits = load(b, pw, V32, 48 + 32 * j)
        for h, low in enumerate((b.and_(bits, _bv(15)), b.lshr(bits, _bv(4)))):
            s = 2 * j + h
            high = b.shl(b.lshr(b.and_(qh, _bv(1 << s)), _bv(s)), _bv(4))
            _emit(b, po, 32 * s, b.or_(low, high), _pick(b, dl, s, s), _pick(b, ml, s, s), False)


def _q6_k(context, b, pw, po) -> None:
    dl = _scaled(b, _half(context, b, pw, 208), load(b, pw, vec(I8, 16), 192), True)
    for h in range(2):
        b1 = load(b, pw, V32, 64 * h)
        b2 = load(b, pw, V32, 64 * h + 32)
        hb = load(b, pw, V32, 128 + 32 * h)
        quants = [
            b.or_(b.and_(b1, _bv(15)), b.shl(b.and_(hb, _bv(3)), _bv(4))),
            b.or_(b.and_(b2, _bv(15)), b.shl(b.and_(hb, _bv(12)), _bv(2))),
            b.or_(b.lshr(b1, _bv(4)), b.and_(hb, _bv(48))),
            b.or_(b.lshr(b2, _bv(4)), b.lshr(b.and_(hb, _bv(192)), _bv(2))),
        ]
        for k, q in enumerate(quants):
            c = 4 * h + k
            _emit(b, po, 32 * c, b.sub(q, _bv(32)), _pick(b, dl, 2 * c, 2 * c + 1), None, True)


_block_q2_k = _dequant_intrinsic(_q2_k)
_block_q3_k = _dequant_intrinsic(_q3_k)
_block_q4_k = _dequant_intrinsic(_q4_k)
_block_q5_k = _dequant_intrinsic(_q5_k)
_block_q6_k = _dequant_intrinsic(_q6_k)

_INLINE = {"forceinline": True, "error_model": "numpy", "cache": True}
_KERNEL = {"parallel": True, "error_model": "numpy", "cache": True}


@njit(**_INLINE)
def _check(blocks, r0, r1, out, type_size):
    if blocks.ndim != 2 or (blocks.size and blocks.strides[1] != 1) or blocks.shape[1] % type_size:
        raise ValueError("weights must be 2-D uint8 rows of whole blocks with contiguous bytes")
    if r0 < 0 or r1 > blocks.shape[0] or r1 < r0:
        raise ValueError("row range out of bounds")
    nb = blocks.shape[1] // type_size
    if out.ndim != 2 or out.shape[0] != r1 - r0 or out.shape[1] != nb * 256 or (out.size and out.strides[1] != 4):
        raise ValueError("out must be a (r1 - r0, n_cols) float32 array with contiguous rows")
    return nb


@njit(**_KERNEL)
def dequantize_rows_q2_k(blocks, r0, r1, out):
    """out[r - r0] = the float32 weights of row r of the Q2_K blocks, r0 <= r < r1, as engine.quant.dequantize_rows."""
    nb = _check(blocks, r0, r1, out, 84)
    for r in prange(r0, r1):
        for i in range(nb):
            _block_q2_k(blocks, u64(r) * u64(blocks.strides[0]) + u64(84 * i), out, u64(r - r0) * u64(out.strides[0]) + u64(1024 * i))
    return out


@njit(**_KERNEL)
def dequantize_rows_q3_k(blocks, r0, r1, out):
    """out[r - r0] = the float32 weights of row r of the Q3_K blocks, r0 <= r < r1, as engine.quant.dequantize_rows."""
    nb = _check(blocks, r0, r1, out, 110)
    for r in prange(r0, r1):
        for i in range(nb):
            _block_q3_k(blocks, u64(r) * u64(blocks.strides[0]) + u64(110 * i), out, u64(r - r0) * u64(out.strides[0]) + u64(1024 * i))
    return out


@njit(**_KERNEL)
def dequantize_rows_q4_k(blocks, r0, r1, out):
    """out[r - r0] = the float32 weights of row r of the Q4_K blocks, r0 <= r < r1, as engine.quant.dequantize_rows."""
    nb = _check(blocks, r0, r1, out, 144)
    for r in prange(r0, r1):
        for i in range(nb):
            _block_q4_k(blocks, u64(r) * u64(blocks.strides[0]) + u64(144 * i), out, u64(r - r0) * u64(out.strides[0]) + u64(1024 * i))
    return out


@njit(**_KERNEL)
def dequantize_rows_q5_k(blocks, r0, r1, out):
    """out[r - r0] = the float32 weights of row r of the Q5_K blocks, r0 <= r < r1, as engine.quant.dequantize_rows."""
    nb = _check(blocks, r0, r1, out, 176)
    for r in prange(r0, r1):
        for i in range(nb):
            _block_q5_k(blocks, u64(r) * u64(blocks.strides[0]) + u64(176 * i), out, u64(r - r0) * u64(out.strides[0]) + u64(1024 * i))
    return out


@njit(**_KERNEL)
def dequantize_rows_q6_k(blocks, r0, r1, out):
    """out[r - r0] = the float32 weights of row r of the Q6_K blocks, r0 <= r < r1, as engine.quant.dequantize_rows."""
    nb = _check(blocks, r0, r1, out, 210)
    for r in prange(r0, r1):
        for i in range(nb):
            _block_q6_k(blocks, u64(r) * u64(blocks.strides[0]) + u64(210 * i), out, u64(r - r0) * u64(out.strides[0]) + u64(1024 * i))
    return out
