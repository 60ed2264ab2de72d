"""Compiled k-quant products with the numerics of ggml-cpu's tiled MUL_MAT path (ggml-cpu/tiled), bit for bit.

llama.cpp multiplies a k-quant weight that stays in the plain CPU buffer (Q3_K, Q5_K and Q6_K always on x86,
Q4_K when its row count is not a multiple of 8; see kquant_repack.py) by the tiled path when the batch has 8 or
more activation rows, and by ggml_vec_dot_q*_K_q8_K (kquant_dot.py) below that. Per (activation a, weight row r),
super-blocks in order, acc starting at 0:

  Q3_K, Q6_K: res = float(isum) * fp16(d)                                   acc = fma(res, d8, acc)
  Q4_K, Q5_K: res = fma(-fp16(dmin), float(imin), float(isum) * fp16(d))    acc = fma(res, d8, acc)

isum / imin are the exact integers of vec_dot's super-block (the sum over sub-blocks of scale * dot, and of
min * bsum); d8 is the block_q8_K scale (activations from quantize_row_q8_K, as for vec_dot). GCC contracts
the microkernel's `acc + res * d8` into the fma. The integer parts are kquant_lanes.py's.

  gemm_tiled_q6_k(blocks, xq, out)   blocks (n_rows, nb * 210), xq (m, nb * 292) -> out (m, n_rows)
  gemm_tiled_q4_k(blocks, xq, out)   blocks (n_rows, nb * 144), the same
  gemm_tiled_q3_k / gemm_tiled_q5_k  blocks (n_rows, nb * 110) / (n_rows, nb * 176), the same
  TILED_MIN_ROWS                     the batch size from which llama.cpp takes this path
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.kquant.lanes import decode_q3_k, decode_q4_k, decode_q5_k, decode_q6_k, lanes
from engine.kernels.simd import (
    F32,
    I16,
    I32,
    I64,
    Ops,
    byte_ptr,
    call_intrinsic,
    half_to_float,
    load,
)

TILE = 16  # activations whose accumulators live on the stack while a weight block is decoded once
TILED_MIN_ROWS = 8
u64 = np.uint64
# block bytes, decoder, byte offsets of the fp16 d and dmin (None: no min term)
_SPEC = {"q6_k": (210, decode_q6_k, 208, None), "q4_k": (144, decode_q4_k, 0, 2),
         "q3_k": (110, decode_q3_k, 108, None), "q5_k": (176, decode_q5_k, 0, 2)}


def _reduce(b, v):
    if v.type == I32:  # Q5_K's min term is one integer already
        return v
    return call_intrinsic(b, f"llvm.vector.reduce.add.v{v.type.count}i32", I32, [v])


def _row_tile(name, context, b, pw0, nb, px0, xs, m, po, os):
    size, decode, d_at, dmin_at = _SPEC[name]
    ops = Ops(context, b)
    acc = cgutils.alloca_once(b, F32, size=TILE)
    with cgutils.for_range(b, m) as act:
        b.store(ir.Constant(F32, 0.0), b.gep(acc, [act.index]))
    with cgutils.for_range(b, nb) as loop:
        pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, size))])
        block = decode(ops, b, pw)
        dw = half_to_float(context, b, load(b, pw, I16, d_at))
        dmin = half_to_float(context, b, load(b, pw, I16, dmin_at)) if dmin_at is not None else None
        px_i = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, 292))])
        with cgutils.for_range(b, m) as act:
            px = b.gep(px_i, [b.mul(act.index, xs)])
            q, mins = lanes(ops, b, block, px)
            res = b.fmul(b.sitofp(_reduce(b, q), F32), dw)
            if dmin is not None:
                res = b.fma(b.fneg(dmin), b.sitofp(_reduce(b, mins), F32), res)
            p = b.gep(acc, [act.index])
            b.store(b.fma(res, load(b, px, F32), b.load(p)), p)
    with cgutils.for_range(b, m) as act:
        dst = b.bitcast(b.gep(po, [b.mul(act.index, os)]), F32.as_pointer())
        b.store(b.load(b.gep(acc, [act.index])), dst, align=4)


def _i64(b, v):
    return v if v.type == I64 else b.sext(v, I64)


def _make(name):
    def typer(typingctx, w, wo, nb, x, xo, xs, m, out, oo, os):
        def codegen(context, builder, sig, args):
            w_, wo_, nb_, x_, xo_, xs_, m_, out_, oo_, os_ = args
            pw = byte_ptr(context, builder, sig.args[0], w_, wo_)
            px = byte_ptr(context, builder, sig.args[3], x_, xo_)
            po = byte_ptr(context, builder, sig.args[7], out_, oo_)
            _row_tile(name, context, builder, pw, _i64(builder, nb_), px, _i64(builder, xs_), _i64(builder, m_), po,
                      _i64(builder, os_))
            return context.get_dummy_value()
        return types.void(w, wo, nb, x, xo, xs, m, out, oo, os), codegen
    typer.__name__ = f"tiled_{name}"
    return intrinsic(typer)


_tile_q6_k = _make("q6_k")
_tile_q4_k = _make("q4_k")
_tile_q3_k = _make("q3_k")
_tile_q5_k = _make("q5_k")


@njit(parallel=True, cache=True, error_model="numpy")
def gemm_tiled_q6_k(blocks, xq, out):
    """out (m, n_rows) = tiled Q6_K numerics of blocks (n_rows, nb * 210) with Q8_K rows xq (m, nb * 292)."""
    nb = blocks.shape[1] // 210
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    m = xq.shape[0]
    for r in prange(blocks.shape[0]):
        for a0 in range(0, m, TILE):
            _tile_q6_k(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(TILE, m - a0), out, u64(a0) * os + u64(4 * r), os)
    return out


@njit(parallel=True, cache=True, error_model="numpy")
def gemm_tiled_q4_k(blocks, xq, out):
    """out (m, n_rows) = tiled Q4_K numerics of blocks (n_rows, nb * 144) with Q8_K rows xq (m, nb * 292)."""
    nb = blocks.shape[1] // 144
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    m = xq.shape[0]
    for r in prange(blocks.shape[0]):
        for a0 in range(0, m, TILE):
            _tile_q4_k(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(TILE, m - a0), out, u64(a0) * os + u64(4 * r), os)
    return out


@njit(parallel=True, cache=True, error_model="numpy")
def gemm_tiled_q3_k(blocks, xq, out):
    """out (m, n_rows) = tiled Q3_K numerics of blocks (n_rows, nb * 110) with Q8_K rows xq (m, nb * 292)."""
    nb = blocks.shape[1] // 110
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    m = xq.shape[0]
    for r in prange(blocks.shape[0]):
        for a0 in range(0, m, TILE):
            _tile_q3_k(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(TILE, m - a0), out, u64(a0) * os + u64(4 * r), os)
    return out


@njit(parallel=True, cache=True, error_model="numpy")
def gemm_tiled_q5_k(blocks, xq, out):
    """out (m, n_rows) = tiled Q5_K numerics of blocks (n_rows, nb * 176) with Q8_K rows xq (m, nb * 292)."""
    nb = blocks.shape[1] // 176
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    m = xq.shape[0]
    for r in prange(blocks.shape[0]):
        for a0 in range(0, m, TILE):
            _tile_q5_k(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(TILE, m - a0), out, u64(a0) * os + u64(4 * r), os)
    return out
