"""The one-row product of IQ4_XS rows (ggml_vec_dot_iq4_xs_q8_K's numbers) two sub-blocks a step, no byte reordered.

ggml's AVX2 loop forms, per super-block, eight int32 lanes: lane L = the sum over the eight 32-weight sub-blocks of
scale * (the products of the sub-block's weights 4L..4L+3 with the activation), by decoding each sub-block's 16
nibble bytes into 32 weights (two 128-bit table look-ups and a cross-lane insert), then vpmaddubsw of |w| against
sign(x, w) and vpmaddwd with the scale. Then acc = fma(d_w * d_x, float(lanes), acc) and hsum_float_8(acc).

The lanes are exact integers, so any order of the additions gives them. Here two sub-blocks' 32 nibble bytes are one
256-bit load: their low nibbles (weights 0-15 of each) and high nibbles (weights 16-31) are each one look-up in both
128-bit lanes, with no insert; the activation meets them in the same order, its quants permuted once a call
(`permuted`: per sub-block pair, quants 0-15 of both, then 16-31 of both). The low-nibble products land in lanes
[0-3 of sub-block 2p | 0-3 of 2p + 1], the high ones in [4-7 | 4-7], each into its own accumulator; at the end of a
super-block the halves are added to ggml's eight lanes. About two thirds of the instructions a sub-block.

  permuted(xq, nb)                         the Q8_K activation's quants in the order the rows meet them
  row_iq4_xs_pairs(w, wo, nb, xp)          one row's value (engine.kernels.iquant.dot.gemv_iq4_xs runs it)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.iquant.simd import _KV, _iq4_xs_scales, _signed_pairs
from engine.kernels.kquant import dot as kquant_dot
from engine.kernels.simd import F32, I8, I16, I32, I64, Ops, byte_ptr, call_intrinsic, const_vec, half_to_float, load, \
    prefetch, vec

BLOCK = 136  # block_iq4_xs: d, scales_h, scales_l[4], qs[128]
Q8K = 292  # block_q8_K: d (f32), qs[256], bsums[16]
AHEAD = 8  # super-blocks ahead that a row prefetches (as the k-quants' one-row products)
u64 = np.uint64
V32 = vec(I8, 32)


def _lookup(ops: Ops, b, idx):
    """<32 x i8>: kvalues_iq4nl[idx] for idx in 0..15, one vpshufb on AVX2 (the table in both lanes)."""
    table = ir.Constant(V32, [ir.Constant(I8, v) for v in _KV + _KV])
    if ops.avx2:
        return call_intrinsic(b, "llvm.x86.avx2.pshuf.b", V32, [table, idx])
    out = ir.Constant(V32, None)
    for k in range(32):
        out = b.insert_element(out, b.extract_element(table, b.extract_element(idx, ir.Constant(I32, k))),
                               ir.Constant(I32, k))
    return out


def _row(context, b, pw0, nb, px0):
    """One IQ4_XS row (nb super-blocks at pw0) against the permuted Q8_K activation at px0: ggml's value."""
    ops = Ops(context, b)
    f8 = vec(F32, 8)
    acc = cgutils.alloca_once_value(b, ir.Constant(f8, None))
    fifteen = ir.Constant(V32, [ir.Constant(I8, 15)] * 32)
    four = ir.Constant(V32, [ir.Constant(I8, 4)] * 32)
    with cgutils.for_range(b, nb) as loop:
        pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, BLOCK))])
        for line in range(0, BLOCK, 64):
            prefetch(b, b.gep(pw, [ir.Constant(I64, AHEAD * BLOCK + line)]))
        px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, Q8K))])
        scales = b.trunc(_iq4_xs_scales(b, pw), vec(I16, 8))
        halves = [None, None]  # the low-nibble and high-nibble lanes
        for p in range(4):
            q = load(b, pw, V32, 8 + 32 * p)
            scale = b.shuffle_vector(scales, scales, const_vec(I32, [2 * p] * 8 + [2 * p + 1] * 8))
            for h, idx in enumerate((b.and_(q, fifteen), b.and_(b.lshr(q, four), fifteen))):
                t = ops.madd(scale, _signed_pairs(ops, b, _lookup(ops, b, idx), load(b, px, V32, 4 + 64 * p + 32 * h)))
                halves[h] = t if halves[h] is None else b.add(halves[h], t)
        lo, hi = halves
        sumi = b.add(b.shuffle_vector(lo, hi, const_vec(I32, [0, 1, 2, 3, 8, 9, 10, 11])),
                     b.shuffle_vector(lo, hi, const_vec(I32, [4, 5, 6, 7, 12, 13, 14, 15])))
        d = b.fmul(load(b, px, F32), half_to_float(context, b, load(b, pw, I16, 0)))
        b.store(kquant_dot._fma(b, d, sumi, b.load(acc)), acc)
    return kquant_dot._hsum8(b, b.load(acc))


@intrinsic
def row_iq4_xs_pairs(typingctx, w, wo, nb, x):
    """(w, wo, nb, x) -> float32: the row of nb super-blocks at byte wo of w against the `permuted` activation x."""
    def codegen(context, builder, signature, args):
        w_, wo_, nb_, x_ = args
        pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
        px = byte_ptr(context, builder, signature.args[3], x_, ir.Constant(I64, 0))
        return _row(context, builder, pw, nb_ if nb_.type == I64 else builder.zext(nb_, I64), px)

    return types.float32(w, wo, nb, x), codegen


@njit(cache=True, error_model="numpy")
def permuted(xq, nb):
    """The Q8_K activation with each super-block's quants in the order _row meets them: per sub-block pair p,
    quants 64p..64p+15 and 64p+32..64p+47, then 64p+16..64p+31 and 64p+48..64p+63 (d and bsums where they were)."""
    xp = xq[: nb * Q8K].copy()
    for blk in range(nb):
        o = blk * Q8K + 4
        for p in range(4):
            for h in range(2):
                for s in range(2):
                    for k in range(16):
                        xp[o + 64 * p + 32 * h + 16 * s + k] = xq[o + 64 * p + 32 * s + 16 * h + k]
    return xp
