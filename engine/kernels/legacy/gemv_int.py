"""One-row products of Q4_0, Q4_1, Q5_0 and Q5_1 weights on their GGUF blocks, in integers, two rows a vector.

A decode step multiplies one activation row by every weight: the product should stream the weight at the
memory's speed. The byte-plane kernel (legacy_dot) forms each lane in float32 from one weight a SIMD lane,
which is compute-bound (Q5_0 at 29% of the host's read bandwidth on an AMD EPYC, benchmarks/bandwidth.py).
Here each block's 32 weights go in as their unsigned codes u = w + offset (Q4_0: the nibble, offset 8; Q5_0:
nibble | fifth bit << 4, offset 16; Q4_1 / Q5_1: unsigned already), two rows side by side in one 64-byte vector,
against the activation block's 32 quants (repeated), and each lane (the sum of four neighbouring products) is

    lane = sum(u * x) - offset * (x0 + x1 + x2 + x3)

exact in int32: vpdpbusd with the correction as its starting value (AVX512-VNNI), or vpmaddubsw then vpmaddwd
(AVX-512BW, AVX2: no pair of products can saturate int16: at most 2 * 31 * 128). The float steps are then
ggml_vec_dot's (ggml-cpu/arch/x86/quants.c), unchanged: acc = fma(fp16(d_w) * fp16(d_x), float(lane), acc)
per block, summs = fma(fp16(m_w), fp16(s_x), summs), out = hsum_float_8(acc) (+ summs); for Q4_0 rows in eights
(llama.cpp repacks them, legacy_dot.Q4_0_X8) one fma of the block's exact integer sum per row instead.
So the numbers are the byte-plane kernel's bit for bit, read from the blocks as the file holds them
(no second copy of the weight). Q4_0 rows in eights (a multiple of eight rows) go eight rows a step through
engine.kernels.iquant.eights.rows8_q4_0_x8 instead (the same integers and fma, fewer shuffles a block).

  GEMV_INT[kind](blocks, xq, out)     out (n_rows,) for one activation xq (bytes,) in block_q8_0 / q8_1 bytes
  available()                          whether numba's target has 512-bit byte ops or AVX2 (else: legacy_dot)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.quant.types import GGMLType

from engine.kernels.activations import f16_to_f32
from engine.kernels.kquant.dot import _hsum8
from engine.kernels.iquant.eights import rows8_q4_0_x8
from engine.kernels.legacy.dot import Q4_0_X8
from engine.kernels.legacy.gemm import _SPEC, _i64
from engine.kernels.simd import (
    F32, I8, I16, I32, I64, byte_ptr, call_intrinsic, const_vec, half_to_float, has_feature, has_vnni,
    load, prefetch, splat_const, vec,
)
from engine.kernels.variants import per_kind, specialise

KINDS = (int(GGMLType.Q4_0), int(GGMLType.Q4_1), int(GGMLType.Q5_0), int(GGMLType.Q5_1), Q4_0_X8)
_OFFSET = {int(GGMLType.Q4_0): 8, int(GGMLType.Q4_1): 0, int(GGMLType.Q5_0): 16, int(GGMLType.Q5_1): 0, Q4_0_X8: 8}
_ROWS = 32  # rows per parallel task (16 pairs)
u64 = np.uint64


def available() -> bool:
    """Whether numba's target runs these kernels in SIMD (AVX2 at least; elsewhere the byte-plane kernel)."""
    from engine.kernels.isa import target  # noqa: PLC0415

    return target() in ("avx512", "avx2")


def _codes2(kind: int, b, pa, pb):
    """<64 x i8>: the unsigned codes of the block at pa (bytes 0-31) and of the block at pb (32-63)."""
    _, qs, qh, _, _, _ = _SPEC[kind]
    v = b.shuffle_vector(load(b, pa, vec(I8, 16), qs), load(b, pb, vec(I8, 16), qs), const_vec(I32, list(range(32))))
    lo = b.and_(v, splat_const(I8, 15, 32))
    hi = b.lshr(v, splat_const(I8, 4, 32))
    order = list(range(16)) + list(range(32, 48)) + list(range(16, 32)) + list(range(48, 64))
    u = b.shuffle_vector(lo, hi, const_vec(I32, order))  # row a: its low nibbles, its high; then row b's
    if qh >= 0:  # bit i of the little-endian qh is the fifth bit of weight i
        two = b.shuffle_vector(load(b, pa, vec(I8, 4), qh), load(b, pb, vec(I8, 4), qh), const_vec(I32, list(range(8))))
        spread = b.shuffle_vector(two, two, const_vec(I32, [i // 8 for i in range(32)] + [4 + i // 8 for i in range(32)]))
        bit = b.and_(spread, const_vec(I8, [(1 << (i % 8)) if i % 8 < 7 else -128 for i in range(64)]))
        set_ = b.icmp_unsigned("!=", bit, ir.Constant(vec(I8, 64), None))
        u = b.or_(u, b.select(set_, splat_const(I8, 16, 64), ir.Constant(vec(I8, 64), None)))
    return u


def _lanes(context, b, u, x, corr):
    """<16 x i32>: corr + the four-product sums of the unsigned codes u with the signed quants x (both <64 x i8>)."""
    i32x16 = vec(I32, 16)
    if has_vnni(context):
        return call_intrinsic(b, "llvm.x86.avx512.vpdpbusd.512", i32x16, [corr, b.bitcast(u, i32x16), b.bitcast(x, i32x16)])
    if has_feature(context, "avx512bw"):
        pairs = call_intrinsic(b, "llvm.x86.avx512.pmaddubs.w.512", vec(I16, 32), [u, x])
        return b.add(corr, call_intrinsic(b, "llvm.x86.avx512.pmaddw.d.512", i32x16, [pairs, splat_const(I16, 1, 32)]))
    halves = []
    for h in range(2):  # AVX2: one row a 256-bit half (the halves are the two rows)
        idx = const_vec(I32, list(range(32 * h, 32 * h + 32)))
        uh, xh = b.shuffle_vector(u, u, idx), b.shuffle_vector(x, x, idx)
        if has_feature(context, "avx2"):
            pairs = call_intrinsic(b, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), [uh, xh])
            halves.append(call_intrinsic(b, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), [pairs, splat_const(I16, 1, 16)]))
        else:  # any other target: the same integers in plain vector IR
            ext = vec(I32, 32)
            prod = b.mul(b.zext(uh, ext), b.sext(xh, ext))
            quads = [b.shuffle_vector(prod, prod, const_vec(I32, list(range(k, 32, 4)))) for k in range(4)]
            halves.append(b.add(b.add(quads[0], quads[1]), b.add(quads[2], quads[3])))
    return b.add(corr, b.shuffle_vector(halves[0], halves[1], const_vec(I32, list(range(16)))))


def _splat2(b, da, db):
    """<16 x float>: da eight times, then db eight times."""
    two = b.insert_element(b.insert_element(ir.Constant(vec(F32, 2), None), da, ir.Constant(I32, 0)), db,
                           ir.Constant(I32, 1))
    return b.shuffle_vector(two, two, const_vec(I32, [0] * 8 + [1] * 8))


def _pair_rows(kind: int, context, b, pa0, pb0, nb, px0, pd0, po_a, po_b) -> None:
    """Rows a and b (pa0, pb0: their first blocks) against the packed activation (px0: per block 64 quant bytes
    then 16 int32 corrections; pd0: per block d then s as float32) into out at po_a and po_b."""
    size, _, _, _, has_m, _ = _SPEC[kind]
    whole = kind == Q4_0_X8
    f16x = vec(F32, 16)
    acc = cgutils.alloca_once_value(b, ir.Constant(f16x, None))
    sa = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))  # summs (Q4_1 / Q5_1), row a
    sb = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))
    ahead = b.mul(nb, ir.Constant(I64, 2 * size))  # prefetched 1 pair ahead: 14.3 -> 27.3 GB/s (Q5_0, AMD EPYC)
    with cgutils.for_range(b, nb) as loop:
        at = b.mul(loop.index, ir.Constant(I64, size))
        pa, pb = b.gep(pa0, [at]), b.gep(pb0, [at])
        prefetch(b, b.gep(pa, [ahead]))  # the same block of the next pair of rows: rows are short streams (a
        prefetch(b, b.gep(pb, [ahead]))  # 4096-wide Q5_0 row is 2.8 KB) that the hardware prefetchers barely learn
        px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, 128))])
        pd = b.gep(pd0, [b.mul(loop.index, ir.Constant(I64, 8))])
        lanes = _lanes(context, b, _codes2(kind, b, pa, pb), load(b, px, vec(I8, 64)), load(b, px, vec(I32, 16), 64))
        dx = load(b, pd, F32)
        da = b.fmul(half_to_float(context, b, load(b, pa, I16, 0)), dx)  # fp16(d_w) * fp16(d_x)
        db = b.fmul(half_to_float(context, b, load(b, pb, I16, 0)), dx)
        if whole:  # ggml_gemv_q4_0_8x8_q8_0: acc = fma(float(block sum), d_w * d_x, acc), per row: the sums of
            # each half's eight lanes by three rounds of shuffle and add (exact), lanes 0 and 8 the rows' sums
            for width in (4, 2, 1):
                swap = [i ^ width for i in range(16)]
                lanes = b.add(lanes, b.shuffle_vector(lanes, lanes, const_vec(I32, swap)))
        fma = call_intrinsic(b, "llvm.fma.v16f32", f16x, [b.sitofp(lanes, f16x), _splat2(b, da, db), b.load(acc)]
                             if whole else [_splat2(b, da, db), b.sitofp(lanes, f16x), b.load(acc)])
        b.store(fma, acc)
        if has_m:  # summs = fma(fp16(m_w), fp16(s_x), summs)
            sx = load(b, pd, F32, 4)
            for slot, p in ((sa, pa), (sb, pb)):
                m = half_to_float(context, b, load(b, p, I16, 2))
                b.store(call_intrinsic(b, "llvm.fma.f32", F32, [m, sx, b.load(slot)]), slot)
    v = b.load(acc)
    for half, slot, po in ((0, sa, po_a), (8, sb, po_b)):
        if whole:  # lane 0 of the row's half holds its sum
            total = b.extract_element(v, ir.Constant(I32, half))
        else:
            total = _hsum8(b, b.shuffle_vector(v, v, const_vec(I32, list(range(half, half + 8)))))
            if has_m:
                total = b.fadd(total, b.load(slot))
        b.store(total, b.bitcast(po, F32.as_pointer()), align=4)


def _pair_intrinsic(kind: int):
    def typer(typingctx, w, wa, wb, nb, x, d, out, oa, ob):
        def codegen(context, builder, signature, args):
            w_, wa_, wb_, nb_, x_, d_, out_, oa_, ob_ = args
            pa = byte_ptr(context, builder, signature.args[0], w_, wa_)
            pb = byte_ptr(context, builder, signature.args[0], w_, wb_)
            px = byte_ptr(context, builder, signature.args[4], x_, ir.Constant(I64, 0))
            pd = byte_ptr(context, builder, signature.args[5], d_, ir.Constant(I64, 0))
            po_a = byte_ptr(context, builder, signature.args[6], out_, oa_)
            po_b = byte_ptr(context, builder, signature.args[6], out_, ob_)
            _pair_rows(kind, context, builder, pa, pb, _i64(builder, nb_), px, pd, po_a, po_b)
            return context.get_dummy_value()

        return types.void(w, wa, wb, nb, x, d, out, oa, ob), codegen

    name = "q4_0_x8" if kind == Q4_0_X8 else GGMLType(kind).name.lower()
    typer.__name__ = f"gemv_pair_{name}"
    return intrinsic(typer)


@njit(cache=True, error_model="numpy")
def _pack(xq, nb, act, offset):
    """Per block of the activation: its 32 quants twice (one per row of a pair) then the 8 lane corrections
    -offset * (sum of the lane's four quants) twice, as 128 bytes; and its d (and s) as float32."""
    xp = np.zeros((nb, 128), np.uint8)
    ds = np.zeros((nb, 2), np.float32)
    corr = xp.view(np.int32)
    for blk in range(nb):
        o = blk * act
        ds[blk, 0] = f16_to_f32(np.uint16(xq[o]) | (np.uint16(xq[o + 1]) << np.uint16(8)))
        if act == 36:
            ds[blk, 1] = f16_to_f32(np.uint16(xq[o + 2]) | (np.uint16(xq[o + 3]) << np.uint16(8)))
        q = o + act - 32
        for lane in range(8):
            s = 0
            for e in range(4):
                v = xq[q + 4 * lane + e]
                xp[blk, 4 * lane + e] = v
                xp[blk, 32 + 4 * lane + e] = v
                s += (np.int32(v) ^ 128) - 128
            corr[blk, 16 + lane] = -offset * s
            corr[blk, 24 + lane] = -offset * s
    return xp, ds


KIND = KINDS[0]  # a constant in each compiled copy (GEMV_INT)
_pair = None  # each copy's pair intrinsic


def _gemv_int(blocks, xq, out):
    """out[r] = ggml_vec_dot of row r of the raw blocks with the activation xq, for weights of type KIND."""
    size = 18 if KIND == KINDS[0] or KIND == KINDS[4] else 20 if KIND == KINDS[1] else 22 if KIND == KINDS[2] else 24
    act = 36 if KIND == KINDS[1] or KIND == KINDS[3] else 34
    offset = 8 if KIND == KINDS[0] or KIND == KINDS[4] else 16 if KIND == KINDS[2] else 0
    nb = blocks.shape[1] // size
    rs, n = u64(blocks.strides[0]), blocks.shape[0]
    if KIND == KINDS[4] and n % 8 == 0:  # Q4_0 rows in eights: eight rows a step
        for g in prange(n // 8):
            rows8_q4_0_x8(blocks, u64(8 * g) * rs, rs, u64(nb), xq, u64(0), out, u64(32 * g))
        return out
    xp, ds = _pack(xq, nb, act, offset)
    for task in prange((n + _ROWS - 1) // _ROWS):
        stop = min(n, (task + 1) * _ROWS)
        for r in range(task * _ROWS, stop, 2):
            r2 = r + 1 if r + 1 < stop else r  # an odd last row: computed twice, stored once
            _pair(blocks, u64(r) * rs, u64(r2) * rs, nb, xp, ds, out, u64(4 * r), u64(4 * r2))
    return out


@per_kind(KINDS)
def GEMV_INT(kind: int):  # noqa: N802 - a table, read as GEMV_INT[kind]
    """The compiled one-row kernel of one type: _gemv_int with KIND and its pair intrinsic fixed."""
    name = "q4_0_x8" if kind == Q4_0_X8 else GGMLType(kind).name.lower()
    return specialise(_gemv_int, name, {"KIND": kind, "_pair": _pair_intrinsic(kind)}, cache=True, parallel=True,
                      error_model="numpy")
