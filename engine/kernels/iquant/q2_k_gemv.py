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

Rows in eights (every full group of eight rows) go eight at a step (`_rows8`): a super-block's 64 quant bytes are
one 64-byte vector whose shift by 2j holds the elements 32j..32j+31 and 128+32j..128+32j+31, which the activation
meets in that order (its quants permuted once a call, `_permuted`), so no weight byte moves; the eight rows' isum
and imin lanes are gathered by a transposing reduction and the float steps run on <8 x float>, a lane a row.

  gemv_q2_k_rows(blocks, xq, out)    out (n_rows,) for one Q8_K activation xq (bytes,), blocks (n_rows, nb * 84)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.kquant.repack import _halves8, _row_sums, _splat8
from engine.kernels.simd import (
    F32, I8, I16, I32, I64, byte_ptr, call_intrinsic, const_vec, half_to_float, has_feature, load, opaque, prefetch,
    splat_const, vec,
)

BLOCK = 84  # block_q2_K: scales[16], qs[64], d, dmin
Q8K = 292  # block_q8_K: d (f32), qs[256], bsums[16] (int16)
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
    if has_feature(context, "avx2"):  # two 256-bit halves
        halves = []
        for h in range(2):
            cut = lambda v, n: b.shuffle_vector(v, v, const_vec(I32, list(range(n * h, n * h + n))))  # noqa: E731
            pairs = call_intrinsic(b, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), [cut(q, 32), cut(x, 32)])
            halves.append(call_intrinsic(b, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), [pairs, cut(scale, 16)]))
        return b.shuffle_vector(halves[0], halves[1], const_vec(I32, list(range(16))))
    ext = vec(I32, 64)  # any other target: the same integers in plain vector IR (LLVM picks the instructions)
    prod = b.mul(b.zext(q, ext), b.sext(x, ext))
    quads = [b.shuffle_vector(prod, prod, const_vec(I32, list(range(k, 64, 4)))) for k in range(4)]
    sums = b.add(b.add(quads[0], quads[1]), b.add(quads[2], quads[3]))
    return b.mul(sums, b.sext(b.shuffle_vector(scale, scale, const_vec(I32, list(range(0, 32, 2)))), vec(I32, 16)))


def _min_lanes(context, b, scales, bsums):
    """<8 x i32> (AVX2: vpmaddwd) or <16 x i32>: the sub-blocks' mins (scales >> 4) times the Q8_K bsums."""
    mins = b.zext(b.lshr(scales, splat_const(I8, 4, 16)), vec(I16, 16))
    if has_feature(context, "avx2"):
        return call_intrinsic(b, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), [mins, bsums])
    return b.mul(b.sext(mins, vec(I32, 16)), b.sext(bsums, vec(I32, 16)))


def _eight(b, v):
    """<8 x i32>: the lanes of v (<8 x i32> or <16 x i32>) added to eight, exact."""
    if v.type.count == 8:
        return v
    return b.add(b.shuffle_vector(v, v, const_vec(I32, list(range(8)))),
                 b.shuffle_vector(v, v, const_vec(I32, list(range(8, 16)))))


def _rows8(context, b, pw0, rs, nb, px0, po) -> None:
    """Eight Q2_K rows (row r at pw0 + r * rs) against the permuted Q8_K activation (px0, `_permuted`) into the
    eight floats at po: per super-block each row's 64 quant bytes are one vector, (Q >> 2j) & 3 its elements
    32j..32j+31 then 128+32j..128+32j+31 against the activation's j-th 64 bytes (the same order), each pair's
    sub-block scale by one shuffle of the row's 16 scales; isum and imin of the eight rows gathered by two
    transposing reductions, then acc = fma(float(isum), d * d8, acc) and acc_min likewise on <8 x float>."""
    f8 = vec(F32, 8)
    acc = cgutils.alloca_once_value(b, ir.Constant(f8, None))
    acc_min = cgutils.alloca_once_value(b, ir.Constant(f8, None))
    three = splat_const(I8, 3, 64)
    # vector j's 128-bit lane g pairs with sub-block 2j + g (g < 2) or 8 + 2j + g - 2: the row's 16 scales as
    # dwords holding the scale in both words, then one dword permutation per vector (fewer shuffles than words)
    sub = lambda j, g: 2 * j + g if g < 2 else 8 + 2 * j + g - 2  # noqa: E731
    pick = [const_vec(I32, [sub(j, g) for g in range(4) for _ in range(4)]) for j in range(4)]
    with cgutils.for_range(b, nb) as loop:
        at = b.mul(loop.index, ir.Constant(I64, BLOCK))
        px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, Q8K))])
        pws = [b.gep(pw0, [b.add(b.mul(ir.Constant(I64, r), rs), at)]) for r in range(8)]
        # the next eight rows (8 rs on: one block of memory when the rows are contiguous) in address order, an
        # eighth of a super-block column's bytes a step, so the prefetches run as one sequential stream
        ahead = b.gep(pw0, [b.add(b.mul(rs, ir.Constant(I64, 8)), b.mul(loop.index, ir.Constant(I64, 8 * BLOCK)))])
        for line in range(0, 8 * BLOCK, 64):
            prefetch(b, b.gep(ahead, [ir.Constant(I64, line)]))
        xs = [load(b, px, vec(I8, 64), 4 + 64 * j) for j in range(4)]
        bsums = load(b, px, vec(I16, 16), 260)
        sums, mins = [], []
        for pw in pws:
            scales = load(b, pw, vec(I8, 16))
            sc = b.zext(b.and_(scales, splat_const(I8, 15, 16)), vec(I32, 16))
            sc = opaque(context, b, b.or_(sc, b.shl(sc, splat_const(I32, 16, 16))))
            qs = load(b, pw, vec(I8, 64), 16)
            total = None
            for j in range(4):
                q = b.and_(b.lshr(qs, splat_const(I8, 2 * j, 64)) if j else qs, three)
                scale = b.bitcast(b.shuffle_vector(sc, sc, pick[j]), vec(I16, 32))
                term = _scaled64(context, b, q, xs[j], scale)
                total = term if total is None else b.add(total, term)
            sums.append(_eight(b, total))
            mins.append(_eight(b, _min_lanes(context, b, scales, bsums)))
        d8s = _splat8(b, load(b, px, F32))
        for slot, ints, at_d in ((acc, _row_sums(b, sums), 80), (acc_min, _row_sums(b, mins), 82)):
            scale = b.fmul(_halves8(context, b, pws, at_d), d8s)
            b.store(call_intrinsic(b, "llvm.fma.v8f32", f8, [b.sitofp(ints, f8), scale, b.load(slot)]), slot)
    b.store(b.fsub(b.load(acc), b.load(acc_min)), b.bitcast(po, f8.as_pointer()), align=4)


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
        imin = _hsum_i32(b, _min_lanes(context, b, scales, load(b, px, vec(I16, 16), 260)))
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


@intrinsic
def _q2_k_rows8(typingctx, w, wo, rs, nb, x, out, oo):
    def codegen(context, builder, signature, args):
        w_, wo_, rs_, nb_, x_, out_, oo_ = args
        pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
        px = byte_ptr(context, builder, signature.args[4], x_, ir.Constant(I64, 0))
        po = byte_ptr(context, builder, signature.args[5], out_, oo_)
        i64 = lambda v: v if v.type == I64 else builder.zext(v, I64)  # noqa: E731
        _rows8(context, builder, pw, i64(rs_), i64(nb_), px, po)
        return context.get_dummy_value()

    return types.void(w, wo, rs, nb, x, out, oo), codegen


@njit(cache=True, error_model="numpy")
def _permuted(xq, nb):
    """The Q8_K activation with each block's quants in the order _rows8 meets them: for j = 0..3, quants
    32j..32j+31 then 128+32j..128+32j+31 (d and bsums where they were)."""
    xp = xq[: nb * Q8K].copy()
    for blk in range(nb):
        o = blk * Q8K + 4
        for j in range(4):
            for k in range(32):
                xp[o + 64 * j + k] = xq[o + 32 * j + k]
                xp[o + 64 * j + 32 + k] = xq[o + 128 + 32 * j + k]
    return xp


@njit(parallel=True, cache=True, error_model="numpy")
def gemv_q2_k_rows(blocks, xq, out):
    """out[r] = the q2_K_8x8 gemv's value of Q2_K row r of `blocks` with the Q8_K activation xq (bytes,)."""
    if blocks.ndim != 2 or blocks.shape[1] % BLOCK or xq.shape[0] != blocks.shape[1] // BLOCK * Q8K:
        raise ValueError("Q2_K rows against one Q8_K row of the same length")
    nb, n, rs = u64(blocks.shape[1] // BLOCK), blocks.shape[0], u64(blocks.strides[0])
    xp = _permuted(xq, nb)
    for g in prange(n // 8):  # rows in eights
        _q2_k_rows8(blocks, u64(8 * g) * rs, rs, nb, xp, out, u64(32 * g))
    for r in range(n // 8 * 8, n):  # the last rows of a count not in eights, one by one
        _q2_k_row(blocks, u64(r) * rs, nb, xq, out, u64(4 * r))
    return out
