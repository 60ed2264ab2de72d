"""One-row products of Q4_0, Q4_1, Q5_0 and Q5_1 weights on their GGUF blocks, in integers, two rows at a time.

A decode step multiplies one activation row by every weight: the product should stream the weight at the
memory's speed. The byte-plane kernel (legacy_dot) forms each lane in float32 from one weight a SIMD lane,
which is compute-bound (Q5_0 at 29% of the host's read bandwidth on an AMD EPYC, benchmarks/bandwidth.py).
Here each block's 32 weights go in as their unsigned codes u = w + offset (Q4_0: the nibble, offset 8; Q5_0:
nibble | fifth bit << 4, offset 16; Q4_1 / Q5_1: unsigned already), two rows side by side in 256-bit vectors (the
rows' low nibbles in one, against the activation's first 16 quants twice; their high nibbles in the other, against
its last 16: no byte of the weight is reordered), and each lane (the sum of four neighbouring products) is

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
from engine.kernels.kquant.dot import _hsum4, _splat
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


def _halves(kind: int, context, b, pa, pb):
    """(lo, hi), each <32 x i8>: the unsigned codes of weights 0-15 of the blocks at pa and pb side by side (lo),
    and of their weights 16-31 (hi). The two rows' 16 nibble bytes are one 32-byte vector, never reordered: the
    low nibbles are weights 0-15, the high ones 16-31. Q5_0 / Q5_1: bit i of the little-endian qh is the fifth bit
    of weight i, so lo takes bits 0-15 of both rows' qh as one 32-bit mask and hi bits 16-31 (16 where set)."""
    _, qs, qh, _, _, _ = _SPEC[kind]
    v = b.shuffle_vector(load(b, pa, vec(I8, 16), qs), load(b, pb, vec(I8, 16), qs), const_vec(I32, list(range(32))))
    lo, hi = b.and_(v, splat_const(I8, 15, 32)), b.lshr(v, splat_const(I8, 4, 32))
    if qh < 0:
        return lo, hi
    ha, hb = load(b, pa, I32, qh), load(b, pb, I32, qh)
    sixteen, zero = splat_const(I8, 16, 32), ir.Constant(vec(I8, 32), None)
    if has_feature(context, "avx512bw"):  # each half's 32 bits a mask register, 16 where set
        c = lambda n: ir.Constant(I32, n)  # noqa: E731
        masks = (b.or_(b.and_(ha, c(0xFFFF)), b.shl(hb, c(16))), b.or_(b.lshr(ha, c(16)), b.and_(hb, c(-65536))))
        return tuple(b.or_(u, b.select(b.bitcast(m, vec(ir.IntType(1), 32)), sixteen, zero))
                     for u, m in zip((lo, hi), masks))
    # AVX2 (bytes_from_bits_32's way): row a's qh in the low 128-bit lane, row b's in the high one, byte i // 8 of
    # the half's 16 bits spread to byte i, its bit i % 8 picked by a mask
    two = b.insert_element(b.insert_element(ir.Constant(vec(I32, 2), None), ha, ir.Constant(I32, 0)), hb,
                           ir.Constant(I32, 1))
    both = b.bitcast(b.shuffle_vector(two, two, const_vec(I32, [0] * 4 + [1] * 4)), vec(I8, 32))
    bits = const_vec(I8, [(1 << (i % 8)) if i % 8 < 7 else -128 for i in range(32)])
    out = []
    for h, u in enumerate((lo, hi)):
        spread = b.shuffle_vector(both, both, const_vec(I32, [16 * (i // 16) + 2 * h + (i % 16) // 8 for i in range(32)]))
        set_ = b.icmp_unsigned("!=", b.and_(spread, bits), zero)
        out.append(b.or_(u, b.select(set_, sixteen, zero)))
    return tuple(out)


def _lanes8(context, b, u, x, corr):
    """<8 x i32>: corr + the four-product sums of the unsigned codes u with the signed quants x (both <32 x i8>)."""
    i32x8 = vec(I32, 8)
    if has_vnni(context):
        return call_intrinsic(b, "llvm.x86.avx512.vpdpbusd.256", i32x8, [corr, b.bitcast(u, i32x8), b.bitcast(x, i32x8)])
    if has_feature(context, "avx2"):
        pairs = call_intrinsic(b, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), [u, x])
        return b.add(corr, call_intrinsic(b, "llvm.x86.avx2.pmadd.wd", i32x8, [pairs, splat_const(I16, 1, 16)]))
    ext = vec(I32, 32)  # any other target: the same integers in plain vector IR
    prod = b.mul(b.zext(u, ext), b.sext(x, ext))
    quads = [b.shuffle_vector(prod, prod, const_vec(I32, list(range(k, 32, 4)))) for k in range(4)]
    return b.add(corr, b.add(b.add(quads[0], quads[1]), b.add(quads[2], quads[3])))


def _scales(context, b, pa, pb, has_m: bool):
    """<4 x float> [d_a, m_a, d_b, m_b] (Q4_1 / Q5_1: one 32-bit load a row) or <2 x float> [d_a, d_b], converted
    from fp16 side by side (F16C), else one by one (exact either way)."""
    n = 4 if has_m else 2
    v = ir.Constant(vec(I16, n), None)
    for r, p in enumerate((pa, pb)):
        for k in range(n // 2):
            v = b.insert_element(v, load(b, p, I16, 2 * k), ir.Constant(I32, r * n // 2 + k))
    if has_feature(context, "f16c"):
        return b.fpext(b.bitcast(v, vec(ir.HalfType(), n)), vec(F32, n))
    out = ir.Constant(vec(F32, n), None)
    for i in range(n):
        out = b.insert_element(out, half_to_float(context, b, b.extract_element(v, ir.Constant(I32, i))), ir.Constant(I32, i))
    return out


def _pair_rows(kind: int, context, b, pa0, pb0, nb, px0, pd0, po_a, po_b) -> None:
    """Rows a and b (pa0, pb0: their first blocks) against the packed activation (px0: per block 128 bytes, _pack;
    pd0: per block d then s as float32) into out at po_a and po_b.

    Per block, ggml's eight int32 lanes of each row come in two 256-bit halves: lo = [a's lanes 0-3 | b's lanes
    0-3] (the low nibbles against x's first 16 quants), hi = [a's 4-7 | b's 4-7], each with its float accumulator
    (acc = fma(d_w * d_x, float(lane), acc) lane by lane, as ggml's one <8 x float>). hsum_float_8 adds a row's
    high four lanes to its low four first: that is acc_hi + acc_lo, then _hsum4 of each row's half."""
    size, _, _, _, has_m, _ = _SPEC[kind]
    whole = kind == Q4_0_X8
    f8 = vec(F32, 8)
    accs = [cgutils.alloca_once_value(b, ir.Constant(f8, None)) for _ in range(1 if whole else 2)]
    summs = cgutils.alloca_once_value(b, ir.Constant(vec(F32, 4), None))  # lanes 1 and 3: rows a and b's summs
    # the next pair of rows (2 nb blocks on: one block of memory when the rows are contiguous) in address order,
    # two blocks' bytes a step: one sequential stream of prefetches. Rows are short streams (a 4096-wide Q5_0 row
    # is 2.8 KB) that the hardware prefetchers barely learn: none 14.3, the next rows' same blocks 27.3 GB/s
    # (Q5_0 from memory, AMD EPYC)
    ahead = b.mul(nb, ir.Constant(I64, 2 * size))
    with cgutils.for_range(b, nb) as loop:
        at = b.mul(loop.index, ir.Constant(I64, size))
        pa, pb = b.gep(pa0, [at]), b.gep(pb0, [at])
        nxt = b.gep(pa0, [b.add(ahead, b.add(at, at))])
        prefetch(b, nxt)
        prefetch(b, b.gep(nxt, [ir.Constant(I64, 2 * size - 1)]))
        px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, 128))])
        pd = b.gep(pd0, [b.mul(loop.index, ir.Constant(I64, 8))])
        lanes = [_lanes8(context, b, u, load(b, px, vec(I8, 32), 32 * h), load(b, px, vec(I32, 8), 64 + 32 * h))
                 for h, u in enumerate(_halves(kind, context, b, pa, pb))]
        wm = _scales(context, b, pa, pb, has_m)
        dd = b.fmul(wm, _splat(b, load(b, pd, F32), len(wm.type)))  # fp16(d_w) * fp16(d_x), each row's once
        d8 = b.shuffle_vector(dd, dd, const_vec(I32, [0] * 4 + [len(wm.type) // 2] * 4))
        if whole:  # ggml_gemv_q4_0_8x8_q8_0: acc = fma(float(block sum), d_w * d_x, acc); lanes 0 and 4: the sums
            t = b.add(lanes[0], lanes[1])
            for width in (2, 1):
                t = b.add(t, b.shuffle_vector(t, t, const_vec(I32, [i ^ width for i in range(8)])))
            b.store(call_intrinsic(b, "llvm.fma.v8f32", f8, [b.sitofp(t, f8), d8, b.load(accs[0])]), accs[0])
        else:
            for acc, lane in zip(accs, lanes):
                b.store(call_intrinsic(b, "llvm.fma.v8f32", f8, [d8, b.sitofp(lane, f8), b.load(acc)]), acc)
        if has_m:  # summs = fma(fp16(m_w), fp16(s_x), summs): lanes 1 and 3 (0 and 2 are never read)
            sx = _splat(b, load(b, pd, F32, 4), 4)
            b.store(call_intrinsic(b, "llvm.fma.v4f32", vec(F32, 4), [wm, sx, b.load(summs)]), summs)
    if whole:
        v = b.load(accs[0])
        totals = [b.extract_element(v, ir.Constant(I32, 4 * r)) for r in range(2)]
    else:
        v = b.fadd(b.load(accs[1]), b.load(accs[0]))  # each row's lanes 4-7 + its lanes 0-3
        totals = [_hsum4(b, b.shuffle_vector(v, v, const_vec(I32, list(range(4 * r, 4 * r + 4))))) for r in range(2)]
        if has_m:
            sm = b.load(summs)
            totals = [b.fadd(t, b.extract_element(sm, ir.Constant(I32, 2 * r + 1))) for r, t in enumerate(totals)]
    for total, po in zip(totals, (po_a, po_b)):
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
    """Per block of the activation, 128 bytes: its quants 0-15 twice, its quants 16-31 twice (one copy per row of a
    pair), then the lane corrections -offset * (sum of the lane's four quants) of lanes 0-3 twice and of lanes 4-7
    twice (int32); and its d (and s) as float32."""
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
            half, k = lane // 4, lane % 4
            s = 0
            for e in range(4):
                v = xq[q + 4 * lane + e]
                xp[blk, 32 * half + 4 * k + e] = v
                xp[blk, 32 * half + 16 + 4 * k + e] = v
                s += (np.int32(v) ^ 128) - 128
            corr[blk, 16 + 8 * half + k] = -offset * s
            corr[blk, 20 + 8 * half + k] = -offset * s
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
