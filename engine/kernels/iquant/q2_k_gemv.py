"""The one-row product of Q2_K rows in eights with llama.cpp's q2_K_8x8 numbers, in integers, streaming the blocks.

llama.cpp's AVX-512 build repacks Q2_K rows in eights and its gemv takes, per super-block i of a row,
acc = fma(float(isum), d * d8, acc) and acc_min = fma(float(imin), dmin * d8, acc_min), the row's value being
acc - acc_min (engine.kernels.iquant.tiled: _dot_q2_k_x8, which decodes each row into scratch arrays first and ran
at 1% of the host's read bandwidth). isum = sum over the 16 sub-blocks of scale * (the sub-block's 16 quants times
the activation's) and imin = sum of min * the Q8_K block's bsum are exact integers, so any way to them gives the same
floats. Here one super-block (84 bytes) is four vpmaddubsw of the 2-bit quants (unsigned, 0..3) against the Q8_K
quants (64 each; no int16 pair can saturate: 2 * 3 * 128), each followed by a vpmaddwd with the pairs' sub-block
scales, the four added, and the mins against the bsums by one vpmaddwd: a few dozen instructions a super-block,
no scratch.

  gemv_q2_k_rows(blocks, xq, out)    out (n_rows,) for one Q8_K activation xq (bytes,), blocks (n_rows, nb * 84)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.simd import (
    F32, I8, I16, I32, I64, byte_ptr, call_intrinsic, const_vec, half_to_float, has_feature, load, prefetch,
    splat_const, vec,
)

BLOCK = 84  # block_q2_K: scales[16], qs[64], d, dmin
Q8K = 292  # block_q8_K: d (f32), qs[256], bsums[16] (int16)
_ROWS = 16  # rows per parallel task
u64 = np.uint64


def _hsum_i32(b, v):
    """Integer sum of all lanes (exact in any order)."""
    n = v.type.count
    while n > 1:
        n //= 2
        v = b.add(b.shuffle_vector(v, v, const_vec(I32, list(range(n)))),
                  b.shuffle_vector(v, v, const_vec(I32, list(range(n, 2 * n)))))
    return b.extract_element(v, ir.Constant(I32, 0))


def _scaled64(context, b, q, x, scale):
    """<16 x i32>: sum over each pair of int16 pair sums of (q * x) (vpmaddubsw) times its sub-block's scale
    (vpmaddwd with `scale`, <32 x i16>): lane i = scale * (products 4i..4i+3), exact."""
    if has_feature(context, "avx512bw"):
        pairs = call_intrinsic(b, "llvm.x86.avx512.pmaddubs.w.512", vec(I16, 32), [q, x])
        return call_intrinsic(b, "llvm.x86.avx512.pmaddw.d.512", vec(I32, 16), [pairs, scale])
    ext = vec(I32, 64)  # any other target: the same integers in plain vector IR (LLVM picks the instructions)
    prod = b.mul(b.zext(q, ext), b.sext(x, ext))
    quads = [b.shuffle_vector(prod, prod, const_vec(I32, list(range(k, 64, 4)))) for k in range(4)]
    sums = b.add(b.add(quads[0], quads[1]), b.add(quads[2], quads[3]))
    return b.mul(sums, b.sext(b.shuffle_vector(scale, scale, const_vec(I32, list(range(0, 32, 2)))), vec(I32, 16)))


def _row(context, b, pw0, nb, px0, po) -> None:
    """One Q2_K row (pw0) against the Q8_K activation (px0) into out at po."""
    acc = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))
    acc_min = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))
    three = splat_const(I8, 3, 64)
    with cgutils.for_range(b, nb) as loop:
        pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, BLOCK))])
        px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, Q8K))])
        prefetch(b, b.gep(pw, [ir.Constant(I64, 8 * BLOCK)]))
        scales = load(b, pw, vec(I8, 16))
        sc = b.zext(b.and_(scales, splat_const(I8, 15, 16)), vec(I16, 16))
        total = None
        for h in range(2):  # bytes 32h..32h+31 of qs hold elements 128h + 32j + k at bits 2j
            qs = load(b, pw, vec(I8, 32), 16 + 32 * h)
            for jj in range(2):
                parts = [b.lshr(qs, splat_const(I8, 2 * j, 32)) if j else qs for j in (2 * jj, 2 * jj + 1)]
                q = b.and_(b.shuffle_vector(parts[0], parts[1], const_vec(I32, list(range(64)))), three)
                v = 2 * h + jj  # elements 64v..64v+63: sub-blocks 4v..4v+3, four lanes each
                scale = b.shuffle_vector(sc, sc, const_vec(I32, [4 * v + p // 8 for p in range(32)]))  # per pair
                term = _scaled64(context, b, q, load(b, px, vec(I8, 64), 4 + 64 * v), scale)
                total = term if total is None else b.add(total, term)
        isum = _hsum_i32(b, total)
        mins = b.zext(b.lshr(scales, splat_const(I8, 4, 16)), vec(I16, 16))
        bsums = load(b, px, vec(I16, 16), 260)
        if has_feature(context, "avx2"):
            pm = call_intrinsic(b, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), [mins, bsums])
        else:
            pm = b.mul(b.sext(mins, vec(I32, 16)), b.sext(bsums, vec(I32, 16)))
        imin = _hsum_i32(b, pm)
        d8 = load(b, px, F32)
        d = half_to_float(context, b, load(b, pw, I16, 80))
        dmin = half_to_float(context, b, load(b, pw, I16, 82))
        fma = "llvm.fma.f32"
        b.store(call_intrinsic(b, fma, F32, [b.sitofp(isum, F32), b.fmul(d, d8), b.load(acc)]), acc)
        b.store(call_intrinsic(b, fma, F32, [b.sitofp(imin, F32), b.fmul(dmin, d8), b.load(acc_min)]), acc_min)
    b.store(b.fsub(b.load(acc), b.load(acc_min)), b.bitcast(po, F32.as_pointer()), align=4)


@intrinsic
def _q2_k_row(typingctx, w, wo, nb, x, out, oo):
    def codegen(context, builder, signature, args):
        w_, wo_, nb_, x_, out_, oo_ = args
        pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
        px = byte_ptr(context, builder, signature.args[3], x_, ir.Constant(I64, 0))
        po = byte_ptr(context, builder, signature.args[4], out_, oo_)
        n = nb_ if nb_.type == I64 else builder.zext(nb_, I64)
        _row(context, builder, pw, n, px, po)
        return context.get_dummy_value()

    return types.void(w, wo, nb, x, out, oo), codegen


@njit(parallel=True, cache=True, error_model="numpy")
def gemv_q2_k_rows(blocks, xq, out):
    """out[r] = the q2_K_8x8 gemv's value of Q2_K row r of `blocks` with the Q8_K activation xq (bytes,)."""
    if blocks.ndim != 2 or blocks.shape[1] % BLOCK or xq.shape[0] != blocks.shape[1] // BLOCK * Q8K:
        raise ValueError("Q2_K rows against one Q8_K row of the same length")
    nb, n, rs = u64(blocks.shape[1] // BLOCK), blocks.shape[0], u64(blocks.strides[0])
    for task in prange((n + _ROWS - 1) // _ROWS):
        for r in range(task * _ROWS, min(n, (task + 1) * _ROWS)):
            _q2_k_row(blocks, u64(r) * rs, nb, xq, out, u64(4 * r))
    return out
