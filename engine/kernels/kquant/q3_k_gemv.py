"""The one-row product of Q3_K rows (ggml_vec_dot_q3_K_q8_K's numbers) with one byte code a weight.

ggml's AVX2 loop takes, per 32 weights of a super-block, the low two bits q_lo and a high part q_hi (4 where the
weight's hmask bit is clear, else 0), and forms p16 = maddubs(q_lo, x) - maddubs(q_hi, x), then
madd(scales, p16) into eight int32 lanes; acc = fma(d_w * d_x, float(lanes), acc), hsum_float_8 at the end.

Since no pair sum saturates, p16 = maddubs(u, x) - maddubs(4, x) with u = q_lo | hmask bit << 2 (0..7): the same
int16 values, so the same lanes and floats. maddubs(4, x) is the activation's alone, so it is made once a call
(`fours`: per 32 quants their 16 pair sums times 4) and each row's weights take one maddubs a 32, not two, and no
inversion of hmask. Two fewer instructions a 32 weights, the rest as kquant.dot's loop.

  gemv_q3_k(blocks, xq, out)    out (n_rows,) for one Q8_K activation xq (bytes,), blocks (n_rows, nb * 110)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.kquant.dot import _KERNEL, AHEAD, _check_gemv, _fma, _hsum8
from engine.kernels.kquant.lanes import _QS, V32, _byte_vec, q3_k_scales_ir
from engine.kernels.simd import F32, I16, I64, Ops, byte_ptr, half_to_float, load, prefetch, vec

BLOCK = 110  # block_q3_K: hmask[32], qs[64], scales[12], d
Q8K = 292
u64 = np.uint64


def _high4(b, hm, c: int):
    """<32 x i8>: 4 where bit c of the hmask bytes is set, else 0."""
    bit = b.and_(hm, _byte_vec(1 << c))
    return b.lshr(bit, _byte_vec(c - 2)) if c > 2 else b.shl(bit, _byte_vec(2 - c)) if c < 2 else bit


def _row(context, b, pw0, nb, px0, pf0):
    """One Q3_K row (nb super-blocks at pw0) against the Q8_K row at px0 and its `fours` at pf0: ggml's value."""
    ops = Ops(context, b)
    f8 = vec(F32, 8)
    acc = cgutils.alloca_once_value(b, ir.Constant(f8, None))
    with cgutils.for_range(b, nb) as loop:
        pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, BLOCK))])
        for line in range(0, BLOCK, 64):  # the block AHEAD on (a one-row product streams from memory)
            prefetch(b, b.gep(pw, [ir.Constant(I64, AHEAD * BLOCK + line)]))
        px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, Q8K))])
        pf = b.gep(pf0, [b.mul(loop.index, ir.Constant(I64, 256))])
        scales = ops.lane_scales(b.sext(q3_k_scales_ir(b, pw), vec(I16, 16)))
        hm = load(b, pw, V32, 0)
        total = None
        for j in range(2):
            bits = load(b, pw, V32, 32 + 32 * j)
            for s in range(4):
                c = 4 * j + s
                q_lo = b.and_(b.lshr(bits, _byte_vec(2 * s)), _byte_vec(3)) if s else b.and_(bits, _byte_vec(3))
                u = b.or_(q_lo, _high4(b, hm, c))
                p16 = b.sub(ops.maddubs(u, load(b, px, V32, _QS + 32 * c)), load(b, pf, vec(I16, 16), 32 * c))
                t = ops.madd(ops.pair_scales(scales, 2 * c, 2 * c + 1), p16)
                total = t if total is None else b.add(total, t)
        d = b.fmul(load(b, px, F32), half_to_float(context, b, load(b, pw, I16, 108)))
        b.store(_fma(b, d, total, b.load(acc)), acc)
    return _hsum8(b, b.load(acc))


@intrinsic
def _q3_k_row(typingctx, w, wo, nb, x, f):
    def codegen(context, builder, signature, args):
        w_, wo_, nb_, x_, f_ = args
        pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
        px = byte_ptr(context, builder, signature.args[3], x_, ir.Constant(I64, 0))
        pf = byte_ptr(context, builder, signature.args[4], f_, ir.Constant(I64, 0))
        return _row(context, builder, pw, nb_ if nb_.type == I64 else builder.sext(nb_, I64), px, pf)

    return types.float32(w, wo, nb, x, f), codegen


@njit(cache=True, error_model="numpy")
def fours(xq, nb):
    """maddubs(4, x) of each 32 quants of the Q8_K row xq: (nb, 128) int16, pair sums 4 * (x[2i] + x[2i + 1])."""
    out = np.empty((nb, 128), np.int16)
    xs = xq.view(np.int8)
    for blk in range(nb):
        o = blk * Q8K + 4
        for i in range(128):
            out[blk, i] = 4 * (np.int32(xs[o + 2 * i]) + np.int32(xs[o + 2 * i + 1]))
    return out


@njit(**_KERNEL)
def gemv_q3_k(blocks, xq, out):
    """out[r] = ggml_vec_dot_q3_k_q8_K(row r of the Q3_K blocks, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check_gemv(blocks, xq, out, np.int64(BLOCK))
    rs = u64(blocks.strides[0])
    f = fours(xq, nb)
    for r in prange(blocks.shape[0]):
        out[r] = _q3_k_row(blocks, u64(r) * rs, nb, xq, f)
    return out
