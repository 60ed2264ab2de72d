"""Batched products of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights in integers, row by row on the GGUF blocks.

The byte-plane kernels of legacy_dot.py form each lane's four products in float (one fused multiply-add per
weight, 64 rows in the SIMD lanes), which suits one activation row. A prompt meets each weight block with many
activation rows, and there integer products win: per (row, block) the 32 weights are decoded once into a
<32 x i8> (bytes_from_nibbles_32, the fifth bits of Q5_x, the -8 / -16 offsets of Q4_0 / Q5_0) and, per
activation, multiplied with its 32 quants by vpmaddubsw / vpmaddwd (ggml's mul_sum_us8_pairs_float and, with
_mm256_sign_epi8 first, mul_sum_i8_pairs_float) into eight int32 lanes, each the sum of four neighbouring
products. Then ggml_vec_dot_<type>_q8_<0|1>'s float steps, which is all that decides the bits (kind Q4_0_X8:
the q4_0_8x8 path's instead, one fma per block of the eight lanes' exact sum, see legacy_dot._dot_group):

  acc = fma(fp16(d_w) * fp16(d_x), float(lanes), acc)    (<8 x float>, block after block)
  summs = fma(fp16(m_w), fp16(s_x), summs)               (Q4_1, Q5_1)
  out = hsum_float_8(acc) (+ summs)

The integer lanes are exact (|weight| <= 128 and |quant| <= 127 keep every vpmaddubsw pair below 2^15), so the
results equal gemv / gemm of legacy.py bit for bit. The weights are read as (n_rows, row_bytes) raw blocks.

  gemm_int(kind, blocks, xq, out)    blocks (n_rows, nb * size) uint8, xq (m, nb * 34 | 36), out (m, n_rows)
  GEMM_INT[kind](blocks, xq, out)    the same: a compiled copy per type (engine.kernels.variants), made on first use
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.quant.types import GGMLType

from engine.kernels.activations import f16_to_f32
from engine.kernels.legacy.dot import Q4_0_X8
from engine.kernels.kquant.dot import _fma, _hsum8, _splat
from engine.kernels.variants import early, per_kind, specialise
from engine.kernels.simd import (
    F32,
    I8,
    I16,
    I32,
    I64,
    Ops,
    byte_ptr,
    call_intrinsic,
    const_vec,
    half_to_float,
    has_vnni,
    load,
    shuffle,
    splat_const,
    vec,
)

TILE = 16  # activations sharing one decode of each weight block (their accumulators live on the stack)
_ROWS = 16  # rows per parallel task
u64 = np.uint64
V32 = vec(I8, 32)
# kind -> (block bytes, qs offset, qh offset or -1, offset subtracted from the weights, has a min, act block bytes)
_SPEC = {
    int(GGMLType.Q4_0): (18, 2, -1, 8, False, 34),
    int(GGMLType.Q4_1): (20, 4, -1, 0, True, 36),
    int(GGMLType.Q5_0): (22, 6, 2, 16, False, 34),
    int(GGMLType.Q5_1): (24, 8, 4, 0, True, 36),
    int(GGMLType.Q8_0): (34, 2, -1, 0, False, 34),
}
# Q4_0 with llama.cpp's q4_0_8x8 numbers (legacy_dot._dot_group): per block one exact integer, one fma per row
_SPEC[Q4_0_X8] = _SPEC[int(GGMLType.Q4_0)]
KINDS = tuple(_SPEC)


def _decode(kind: int, b, pw):
    """The 32 weight integers of the block at pw as <32 x i8>, and whether they are signed."""
    _, qs, qh, offset, _, _ = _SPEC[kind]
    if kind == int(GGMLType.Q8_0):
        return load(b, pw, V32, qs), True
    v = load(b, pw, vec(I8, 16), qs)
    lo = b.and_(v, splat_const(I8, 15, 16))
    hi = b.lshr(v, splat_const(I8, 4, 16))
    w = b.shuffle_vector(lo, hi, const_vec(I32, list(range(32))))  # bytes_from_nibbles_32: low nibbles, then high
    if qh >= 0:  # bit i of the little-endian qh is the fifth bit of weight i (bytes_from_bits_32, in bytes):
        # byte i // 8 of qh into byte i, its bit i % 8 picked by a mask, 16 where it is set
        four = b.bitcast(b.insert_element(ir.Constant(vec(I32, 8), None), load(b, pw, I32, qh), ir.Constant(I32, 0)),
                         V32)
        spread = shuffle(b, four, [i // 8 for i in range(32)])
        bit = b.and_(spread, const_vec(I8, [(1 << (i % 8)) if i % 8 < 7 else -128 for i in range(32)]))
        fifth = b.select(b.icmp_unsigned("!=", bit, ir.Constant(V32, None)), splat_const(I8, 16, 32),
                         ir.Constant(V32, None))
        w = b.or_(w, fifth)
    if offset:
        w = b.sub(w, splat_const(I8, offset, 32))
    return w, bool(offset)


def _lanes(ops: Ops, b, w, ax, x):
    """<8 x i32>: lane k = sum of the products of weights 4k..4k+3 with quants 4k..4k+3 (maddubs, madd). For
    signed weights ax is _mm256_sign_epi8(w, w) (made once per block) and the quants go through
    _mm256_sign_epi8(x, w); else ax is w itself."""
    sx = x if ax is w else ops.sign(x, w)
    if ops.vnni:  # one vpdpbusd: the same four-product sums, without the int16 step
        i32x8 = vec(I32, 8)
        return call_intrinsic(b, "llvm.x86.avx512.vpdpbusd.256", i32x8,
                              [ir.Constant(i32x8, None), b.bitcast(ax, i32x8), b.bitcast(sx, i32x8)])
    return ops.madd(ops.maddubs(ax, sx), splat_const(I16, 1, 16))


def _block_sums(b, pairs) -> ir.Value:
    """Q4_0_X8: <TILE x i32> of each activation's block sum, from TILE / 2 <16 x i32> vectors that hold two
    activations' eight lanes each: three rounds of adding even and odd lanes of two vectors (exact integers)."""
    even, odd = list(range(0, 32, 2)), list(range(1, 32, 2))
    level = pairs
    while len(level) > 1:
        level = [b.add(_shuffle2(b, u, v, even), _shuffle2(b, u, v, odd)) for u, v in zip(level[::2], level[1::2])]
    return level[0]


def _shuffle2(b, u, v, idx: list[int]) -> ir.Value:
    """Lanes idx of the concatenation of u and v."""
    return b.shuffle_vector(u, v, const_vec(I32, idx))


def _row_tile(kind: int, context, b, pw0, nb, px0, x_stride, m, po, o_stride, pd0, d_stride) -> None:
    """One weight row against m <= TILE activation rows (px0 + a * x_stride), each block decoded once.

    pd0 points at the activations' scales as float32, per block a row of TILE d values then TILE s values
    (d_stride bytes from block to block), so a block's scale products and Q4_1/Q5_1's min terms are one vector
    operation for all the tile's activations. The activation loop is unrolled (a guard per activation for a
    short tile) with each activation's accumulators in their own stack slot, which LLVM keeps in registers. With
    AVX512-VNNI two activations share one 512-bit vpdpbusd (the same integers, each lane its own activation's)."""
    size, _, _, _, has_m, act = _SPEC[kind]
    whole = kind == Q4_0_X8
    ops = Ops(context, b)
    ops.vnni = has_vnni(context)
    f16x = vec(F32, TILE)
    # each activation's eight float lanes, two activations a slot (the 512-bit vpdpbusd pairs them)
    paccs = [cgutils.alloca_once_value(b, ir.Constant(vec(F32, 16), None)) for _ in range(TILE // 2)]

    def acc_of(a):  # a pointer to activation a's <8 x float> in its pair's slot
        return b.gep(b.bitcast(paccs[a // 2], vec(F32, 8).as_pointer()), [ir.Constant(I32, a % 2)])

    summs = cgutils.alloca_once_value(b, ir.Constant(f16x, None))
    # Q4_0_X8: per block the activations' eight lanes, two activations a slot, summed for all at once, then
    # acc = fma(float(isum), d, acc) for all at once
    pairs = [cgutils.alloca_once_value(b, ir.Constant(vec(I32, 16), None)) for _ in range(TILE // 2)]
    waccs = cgutils.alloca_once_value(b, ir.Constant(f16x, None))
    live = [b.icmp_signed(">", m, ir.Constant(I64, a)) for a in range(TILE)]
    with cgutils.for_range(b, nb) as loop:
        pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, size))])
        w, signed = _decode(kind, b, pw)
        ax = ops.sign(w, w) if signed else w  # once per block, for every activation
        pd = b.gep(pd0, [b.mul(loop.index, d_stride)])
        dw = half_to_float(context, b, load(b, pw, I16, 0))
        dvec = b.fmul(_splat(b, dw, TILE), load(b, pd, f16x))  # fp16(d_w) * fp16(d_x), one product per activation
        if has_m:  # summs = fma(fp16(m_w), fp16(s_x), summs), every activation at once
            mw = half_to_float(context, b, load(b, pw, I16, 2))
            fma = call_intrinsic(b, f"llvm.fma.v{TILE}f32", f16x, [_splat(b, mw, TILE), load(b, pd, f16x, 4 * TILE),
                                                                   b.load(summs)])
            b.store(fma, summs)
        px_b = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, act))])

        def one(a):  # activation a alone: <8 x i32> lanes, one fma into its accumulators
            px = b.gep(px_b, [b.mul(ir.Constant(I64, a), x_stride)])
            q = _lanes(ops, b, w, ax, load(b, px, V32, act - 32))
            if whole:
                half = b.gep(b.bitcast(pairs[a // 2], vec(I32, 8).as_pointer()), [ir.Constant(I32, a % 2)])
                b.store(q, half)
            else:
                d = b.extract_element(dvec, ir.Constant(I32, a))
                b.store(_fma(b, d, q, b.load(acc_of(a))), acc_of(a))

        if not ops.vnni:
            for a in range(TILE):
                with b.if_then(live[a], likely=True):
                    one(a)
        else:  # two activations per 512-bit vpdpbusd: the block's weights in both halves
            w64 = b.shuffle_vector(w, w, const_vec(I32, list(range(32)) * 2))
            if signed:
                zero64 = ir.Constant(vec(I8, 64), None)
                neg64 = b.icmp_signed("<", w64, zero64)
                ax64 = b.select(neg64, b.sub(zero64, w64), w64)
                nil64 = b.icmp_signed("==", w64, zero64)
            else:
                ax64 = w64
            i32x16 = vec(I32, 16)
            for a in range(0, TILE, 2):
                with b.if_else(live[a + 1], likely=True) as (both, single):
                    with both:
                        x0 = load(b, b.gep(px_b, [b.mul(ir.Constant(I64, a), x_stride)]), V32, act - 32)
                        x1 = load(b, b.gep(px_b, [b.mul(ir.Constant(I64, a + 1), x_stride)]), V32, act - 32)
                        x64 = b.shuffle_vector(x0, x1, const_vec(I32, list(range(64))))
                        if signed:  # _mm512_sign_epi8 semantics, as the 256-bit path
                            x64 = b.select(neg64, b.sub(zero64, x64), b.select(nil64, zero64, x64))
                        q = call_intrinsic(b, "llvm.x86.avx512.vpdpbusd.512", i32x16,
                                           [ir.Constant(i32x16, None), b.bitcast(ax64, i32x16), b.bitcast(x64, i32x16)])
                        if whole:
                            b.store(q, pairs[a // 2])
                        else:
                            dp = b.shuffle_vector(dvec, dvec, const_vec(I32, [a] * 8 + [a + 1] * 8))
                            acc = call_intrinsic(b, "llvm.fma.v16f32", vec(F32, 16),
                                                 [dp, b.sitofp(q, vec(F32, 16)), b.load(paccs[a // 2])])
                            b.store(acc, paccs[a // 2])
                    with single, b.if_then(live[a], likely=True):
                        one(a)
        if whole:  # ggml_gemm_q4_0_8x8_q8_0: acc = fma(float(isum), fp16(d_w) * fp16(d_x), acc)
            isum = _block_sums(b, [b.load(p) for p in pairs])
            fma = call_intrinsic(b, f"llvm.fma.v{TILE}f32", f16x, [b.sitofp(isum, f16x), dvec, b.load(waccs)])
            b.store(fma, waccs)
    s_all = b.load(summs)
    wacc = b.load(waccs) if whole else None
    for a in range(TILE):
        with b.if_then(live[a], likely=True):
            if whole:
                total = b.extract_element(wacc, ir.Constant(I32, a))
            else:
                total = _hsum8(b, b.load(acc_of(a)))
            if has_m:
                total = b.fadd(total, b.extract_element(s_all, ir.Constant(I32, a)))
            dst = b.gep(po, [b.mul(ir.Constant(I64, a), o_stride)])
            b.store(total, b.bitcast(dst, F32.as_pointer()), align=4)


def _i64(b, v):
    return v if v.type == I64 else b.sext(v, I64)


def _tile_intrinsic(kind: int):
    def typer(typingctx, w, wo, nb, x, xo, xs, m, out, oo, os, sc, so, ss):
        def codegen(context, builder, signature, args):
            w_, wo_, nb_, x_, xo_, xs_, m_, out_, oo_, os_, sc_, so_, ss_ = args
            pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
            px = byte_ptr(context, builder, signature.args[3], x_, xo_)
            po = byte_ptr(context, builder, signature.args[7], out_, oo_)
            pd = byte_ptr(context, builder, signature.args[10], sc_, so_)
            _row_tile(kind, context, builder, pw, _i64(builder, nb_), px, _i64(builder, xs_), _i64(builder, m_), po,
                      _i64(builder, os_), pd, _i64(builder, ss_))
            return context.get_dummy_value()

        return types.void(w, wo, nb, x, xo, xs, m, out, oo, os, sc, so, ss), codegen

    typer.__name__ = "row_tile_q4_0_x8" if kind == Q4_0_X8 else f"row_tile_{GGMLType(kind).name.lower()}"
    return intrinsic(typer)


_Q4_0, _Q4_1, _Q5_0, _Q5_1, _Q8_0, _Q4_0_X8 = KINDS
KIND = _Q4_0  # a constant in each compiled copy of _gemm_int (GEMM_INT)
_tile = None  # each copy's row-tile intrinsic of its KIND


@njit(cache=True, error_model="numpy")
def _scales(xq, nb, act):
    """The fp16 d (and s) of every activation block as float32: (n_tiles, nb, 2, TILE), zero past the last row."""
    m = xq.shape[0]
    tiles = (m + TILE - 1) // TILE
    sc = np.zeros((tiles, nb, 2, TILE), np.float32)
    for a in range(m):
        for blk in range(nb):
            o = blk * act
            sc[a // TILE, blk, 0, a % TILE] = f16_to_f32(np.uint16(xq[a, o]) | (np.uint16(xq[a, o + 1]) << np.uint16(8)))
            if act == 36:
                sc[a // TILE, blk, 1, a % TILE] = f16_to_f32(np.uint16(xq[a, o + 2]) | (np.uint16(xq[a, o + 3]) << np.uint16(8)))
    return sc


def _gemm_int(blocks, xq, out):
    """out[a, r] = ggml_vec_dot of row r of the raw blocks with activation a, for weights of type KIND."""
    size = 18 if KIND == _Q4_0 or KIND == _Q4_0_X8 else 20 if KIND == _Q4_1 else 22 if KIND == _Q5_0 else 24 if KIND == _Q5_1 else 34
    act = 36 if KIND == _Q4_1 or KIND == _Q5_1 else 34
    nb = blocks.shape[1] // size
    sc = _scales(xq, nb, act)
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    ts, bs = u64(sc.strides[0]), u64(sc.strides[1])
    n, m = blocks.shape[0], xq.shape[0]
    for task in prange((n + _ROWS - 1) // _ROWS):
        for a0 in range(0, m, TILE):
            for r in range(task * _ROWS, min(n, (task + 1) * _ROWS)):
                k = min(TILE, m - a0)
                at, wo, xo, so = u64(a0) * os + u64(4 * r), u64(r) * rs, u64(a0) * xs, u64(a0 // TILE) * ts
                _tile(blocks, wo, nb, xq, xo, xs, k, out, at, os, sc, so, bs)
    return out


@per_kind(KINDS)
def GEMM_INT(kind: int):  # noqa: N802 - a table, read as GEMM_INT[kind]
    """The compiled batch kernel of one type: _gemm_int with KIND and its tile intrinsic fixed."""
    name = "q4_0_x8" if kind == Q4_0_X8 else GGMLType(kind).name.lower()
    return specialise(_gemm_int, name, {"KIND": kind, "_tile": _tile_intrinsic(kind)}, cache=True, parallel=True,
                      error_model="numpy")


def gemm_int(kind, blocks, xq, out):
    """GEMM_INT[kind](blocks, xq, out): out[a, r] = ggml_vec_dot of row r of the raw blocks with activation a (its
    serial twin before the late kernels may run: engine.kernels.variants.early)."""
    return early(GEMM_INT[kind])(blocks, xq, out)
