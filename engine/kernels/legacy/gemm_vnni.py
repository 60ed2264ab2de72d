"""legacy_gemm's batched Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 products on AVX512-VNNI, the same bits, fewer instructions.

ggml forms each lane (the sum of four neighbouring products) of a signed weight type with the sign trick:
vpdpbusd(|w|, sign(x, w)). The integer it gets is sum(w * x), and any way to that integer gives the same float
steps afterwards. Here the weights go in as their unsigned codes u = w + offset (Q4_0: the nibble, offset 8;
Q5_0: the five bits, 16; Q8_0: w xor 0x80, 128; Q4_1 / Q5_1 are unsigned already) and the activation side
carries the correction: lane = vpdpbusd(u, x) - offset * (x0 + x1 + x2 + x3), exact in int32. The
corrections and a repacked copy of the activation quants are made once per product (`_pack`): per tile of 16
activations and per block, the 16 activations' 32 quants back to back, so that two activations' quants are
one 64-byte load, and their corrections likewise, as
vpdpbusd's starting value. A short last tile is padded with zero activations, so the
block loop has no per-activation branch; only the live outputs are written.

The float steps are legacy_gemm's, unchanged: acc = fma(fp16(d_w) * fp16(d_x), float(lane), acc) per block,
summs = fma(fp16(m_w), fp16(s_x), summs), out = hsum_float_8(acc) (+ summs); Q4_0_X8 (the q4_0_8x8 numbers):
one fma of the block's exact integer sum per activation.

  gemm_int_vnni(kind, blocks, xq, out)    as legacy_gemm.gemm_int; only where numba targets AVX512-VNNI
  GEMM_INT_VNNI[kind](blocks, xq, out)    the same: a compiled copy per type (engine.kernels.variants), made on
                                          first use, so a first start compiles the model's types only
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.quant.types import GGMLType

from engine.kernels.kquant.dot import _hsum8, _splat
from engine.kernels.legacy.dot import Q4_0_X8
from engine.kernels.legacy.gemm import _SPEC, KINDS, TILE, _block_sums, _i64, _scales
from engine.kernels.variants import per_kind, specialise
from engine.kernels.simd import (
    F32,
    I8,
    I16,
    I32,
    I64,
    byte_ptr,
    call_intrinsic,
    const_vec,
    half_to_float,
    load,
    shuffle,
    splat_const,
    vec,
)

u64 = np.uint64
_ROWS = 16  # rows per parallel task
V32 = vec(I8, 32)
I32X16 = vec(I32, 16)
PAIRS = TILE // 2
NT = 2  # tiles per weight-block decode (2 x 8 pair accumulators in zmm registers)
BLOCK_X = TILE * 32  # bytes of one block's repacked quants in a tile (and of its corrections: TILE * 8 int32)
# kind -> the offset of its unsigned weight codes (0: the codes are the weights)
_OFFSET = {int(GGMLType.Q4_0): 8, int(GGMLType.Q4_1): 0, int(GGMLType.Q5_0): 16, int(GGMLType.Q5_1): 0,
           int(GGMLType.Q8_0): 128, Q4_0_X8: 8}


def _codes(kind: int, b, pw):
    """The block's 32 unsigned weight codes as <32 x i8>: w + offset."""
    _, qs, qh, _, _, _ = _SPEC[kind]
    if kind == int(GGMLType.Q8_0):
        return b.xor(load(b, pw, V32, qs), splat_const(I8, 0x80, 32))
    v = load(b, pw, vec(I8, 16), qs)
    lo = b.and_(v, splat_const(I8, 15, 16))
    hi = b.lshr(v, splat_const(I8, 4, 16))
    w = b.shuffle_vector(lo, hi, const_vec(I32, list(range(32))))  # low nibbles, then high
    if qh >= 0:  # bit i of the little-endian qh is the fifth bit of weight i: byte i // 8, bit i % 8
        qh4 = load(b, pw, vec(I8, 4), qh)
        spread = b.shuffle_vector(qh4, qh4, const_vec(I32, [i // 8 for i in range(32)]))
        set_ = b.icmp_unsigned("!=", b.and_(spread, const_vec(I8, [1 << (i % 8) for i in range(32)])),
                               ir.Constant(V32, None))
        w = b.or_(w, b.select(set_, splat_const(I8, 16, 32), ir.Constant(V32, None)))
    return w


def _row_tile(kind: int, nt: int, context, b, pw0, nb, px0, pc0, m, po, o_stride, pd0, d_stride, t_strides) -> None:
    """One weight row against nt tiles of TILE activations (m of them live): px0 the first tile's repacked
    quants, pc0 its corrections, pd0 its scales (per block TILE d values, then TILE s values); the next tile's
    are t_strides bytes further on (quants, corrections, scales). nt = 1: a short tile, whose pairs of
    activations past the m live ones are skipped (a branch per pair); nt = NT: full tiles, no branch."""
    size, _, _, _, has_m, _ = _SPEC[kind]
    offset = _OFFSET[kind]
    whole = kind == Q4_0_X8
    f16x = vec(F32, TILE)
    paccs = [cgutils.alloca_once_value(b, ir.Constant(vec(F32, 16), None)) for _ in range(nt * PAIRS)]
    summs = [cgutils.alloca_once_value(b, ir.Constant(f16x, None)) for _ in range(nt)]
    waccs = [cgutils.alloca_once_value(b, ir.Constant(f16x, None)) for _ in range(nt)]
    lanes_at = [cgutils.alloca_once_value(b, ir.Constant(I32X16, None)) for _ in range(PAIRS)] if nt == 1 else None
    with cgutils.for_range(b, nb) as loop:
        pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, size))])
        u = _codes(kind, b, pw)
        w64 = b.bitcast(b.shuffle_vector(u, u, const_vec(I32, list(range(32)) * 2)), I32X16)
        dw = _splat(b, half_to_float(context, b, load(b, pw, I16, 0)), TILE)
        mw = _splat(b, half_to_float(context, b, load(b, pw, I16, 2)), TILE) if has_m else None
        for t in range(nt):
            pd = b.gep(pd0, [b.add(b.mul(loop.index, d_stride), b.mul(ir.Constant(I64, t), t_strides[2]))])
            dvec = b.fmul(dw, load(b, pd, f16x))  # fp16(d_w) * fp16(d_x), one product per activation
            if has_m:  # summs = fma(fp16(m_w), fp16(s_x), summs), every activation at once
                fma = call_intrinsic(b, f"llvm.fma.v{TILE}f32", f16x, [mw, load(b, pd, f16x, 4 * TILE), b.load(summs[t])])
                b.store(fma, summs[t])
            block_at = b.mul(loop.index, ir.Constant(I64, BLOCK_X))
            px = b.gep(px0, [b.add(block_at, b.mul(ir.Constant(I64, t), t_strides[0]))])
            pc = b.gep(pc0, [b.add(block_at, b.mul(ir.Constant(I64, t), t_strides[1]))])
            lanes = []

            def pair(p, t=t, px=px, pc=pc, dvec=dvec, lanes=lanes):  # activations 2p, 2p + 1: one vpdpbusd
                start = load(b, pc, I32X16, 64 * p) if offset else ir.Constant(I32X16, None)  # -offset * (x0+..+x3)
                q = call_intrinsic(b, "llvm.x86.avx512.vpdpbusd.512", I32X16, [start, w64, load(b, px, I32X16, 64 * p)])
                if whole:
                    if lanes_at is None:
                        lanes.append(q)
                    else:
                        b.store(q, lanes_at[p])
                    return
                dp = b.shuffle_vector(dvec, dvec, const_vec(I32, [2 * p] * 8 + [2 * p + 1] * 8))
                slot = paccs[t * PAIRS + p]
                acc = call_intrinsic(b, "llvm.fma.v16f32", vec(F32, 16), [dp, b.sitofp(q, vec(F32, 16)), b.load(slot)])
                b.store(acc, slot)

            for p in range(PAIRS):
                if nt == 1 and p:
                    with b.if_then(b.icmp_signed(">", m, ir.Constant(I64, 2 * p)), likely=True):
                        pair(p)
                else:
                    pair(p)
            if whole:  # ggml_gemm_q4_0_8x8_q8_0: acc = fma(float(isum), fp16(d_w) * fp16(d_x), acc)
                isum = _block_sums(b, lanes if lanes_at is None else [b.load(v) for v in lanes_at])
                fma = call_intrinsic(b, f"llvm.fma.v{TILE}f32", f16x, [b.sitofp(isum, f16x), dvec, b.load(waccs[t])])
                b.store(fma, waccs[t])
    for t in range(nt):
        s_all = b.load(summs[t])
        wacc = b.load(waccs[t])
        for a in range(TILE):
            with b.if_then(b.icmp_signed(">", m, ir.Constant(I64, t * TILE + a)), likely=True):
                if whole:
                    total = b.extract_element(wacc, ir.Constant(I32, a))
                else:
                    pair = b.load(paccs[t * PAIRS + a // 2])
                    total = _hsum8(b, shuffle(b, pair, list(range(8 * (a % 2), 8 * (a % 2) + 8))))
                if has_m:
                    total = b.fadd(total, b.extract_element(s_all, ir.Constant(I32, a)))
                dst = b.gep(po, [b.mul(ir.Constant(I64, t * TILE + a), o_stride)])
                b.store(total, b.bitcast(dst, F32.as_pointer()), align=4)


def _tile_intrinsic(kind: int, nt: int):
    def typer(typingctx, w, wo, nb, x, xo, c, co, m, out, oo, os, sc, so, ss, xs, cs, ts):
        def codegen(context, builder, signature, args):
            w_, wo_, nb_, x_, xo_, c_, co_, m_, out_, oo_, os_, sc_, so_, ss_, xs_, cs_, ts_ = args
            pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
            px = byte_ptr(context, builder, signature.args[3], x_, xo_)
            pc = byte_ptr(context, builder, signature.args[5], c_, co_)
            po = byte_ptr(context, builder, signature.args[8], out_, oo_)
            pd = byte_ptr(context, builder, signature.args[11], sc_, so_)
            _row_tile(kind, nt, context, builder, pw, _i64(builder, nb_), px, pc, _i64(builder, m_), po,
                      _i64(builder, os_), pd, _i64(builder, ss_), [_i64(builder, v) for v in (xs_, cs_, ts_)])
            return context.get_dummy_value()

        return types.void(w, wo, nb, x, xo, c, co, m, out, oo, os, sc, so, ss, xs, cs, ts), codegen

    name = "q4_0_x8" if kind == Q4_0_X8 else GGMLType(kind).name.lower()
    typer.__name__ = f"vnni_tile{nt}_{name}"
    return intrinsic(typer)


_Q4_0, _Q4_1, _Q5_0, _Q5_1, _Q8_0, _Q4_0_X8 = KINDS
KIND = _Q4_0  # a constant in each compiled copy of _gemm_int_vnni (GEMM_INT_VNNI)


_tile = _short = None  # each copy's full-tile and short-tile intrinsics of its KIND (GEMM_INT_VNNI)


@njit(cache=True, error_model="numpy")  # serial: a parallel loop costs seconds of compile for little
def _pack(xq, nb, act, offset):
    """Per (tile, block): the activations' quants as TILE rows of 32 bytes and each lane's correction
    -offset * (sum of its four quants) as TILE rows of 8 int32; zero past the last activation. (Their scales
    are legacy_gemm._scales', in the same tiles.)"""
    m = xq.shape[0]
    tiles = -(-m // TILE)
    xp = np.zeros((tiles, nb, TILE, 32), np.uint8)
    cp = np.zeros((tiles, nb, TILE, 8), np.int32)
    for a in range(m):
        t, i = a // TILE, a % TILE
        for blk in range(nb):
            o = blk * act + act - 32
            for lane in range(8):
                s = 0
                for e in range(4):
                    v = xq[a, o + 4 * lane + e]
                    xp[t, blk, i, 4 * lane + e] = v
                    s += (np.int32(v) ^ 128) - 128
                cp[t, blk, i, lane] = -offset * s
    return xp, cp


def _gemm_int_vnni(blocks, xq, out):
    """out[a, r] = ggml_vec_dot of row r of the raw blocks with activation a, for weights of type KIND."""
    size = 18 if KIND == _Q4_0 or KIND == _Q4_0_X8 else 20 if KIND == _Q4_1 else 22 if KIND == _Q5_0 else 24 if KIND == _Q5_1 else 34
    act = 36 if KIND == _Q4_1 or KIND == _Q5_1 else 34
    offset = 8 if KIND == _Q4_0 or KIND == _Q4_0_X8 else 16 if KIND == _Q5_0 else 128 if KIND == _Q8_0 else 0
    nb = blocks.shape[1] // size
    xp, cp = _pack(xq, nb, act, offset)
    sc = _scales(xq, nb, act)
    rs, os = u64(blocks.strides[0]), u64(out.strides[0])
    ts, bs = u64(sc.strides[0]), u64(sc.strides[1])
    xs, cs = u64(xp.strides[0]), u64(cp.strides[0])
    n, m = blocks.shape[0], xq.shape[0]
    full = m // (NT * TILE) * NT  # tiles run NT at a time; the rest one by one, skipping dead pairs
    for task in prange((n + _ROWS - 1) // _ROWS):
        for t in range(0, xp.shape[0], NT):
            a0 = t * TILE
            k = min(NT * TILE, m - a0)
            xo, co, so = u64(t) * xs, u64(t) * cs, u64(t) * ts
            for r in range(task * _ROWS, min(n, (task + 1) * _ROWS)):
                at, wo = u64(a0) * os + u64(4 * r), u64(r) * rs
                if t < full:
                    _tile(blocks, wo, nb, xp, xo, cp, co, k, out, at, os, sc, so, bs, xs, cs, ts)
                else:
                    _short(blocks, wo, nb, xp, xo, cp, co, min(k, TILE), out, at, os, sc, so, bs, xs, cs, ts)
                    if k > TILE:
                        _short(blocks, wo, nb, xp, xo + xs, cp, co + cs, k - TILE, out, at + u64(TILE) * os, os,
                               sc, so + ts, bs, xs, cs, ts)
    return out


@per_kind(KINDS)
def GEMM_INT_VNNI(kind: int):  # noqa: N802 - a table, read as GEMM_INT_VNNI[kind]
    """The compiled batch kernel of one type: _gemm_int_vnni with KIND and its two tile intrinsics fixed."""
    name = "q4_0_x8" if kind == Q4_0_X8 else GGMLType(kind).name.lower()
    scope = {"KIND": kind, "_tile": _tile_intrinsic(kind, NT), "_short": _tile_intrinsic(kind, 1)}
    return specialise(_gemm_int_vnni, name, scope, cache=True, parallel=True, error_model="numpy")


def gemm_int_vnni(kind, blocks, xq, out):
    """GEMM_INT_VNNI[kind](blocks, xq, out): out[a, r] = ggml_vec_dot of row r of the raw blocks with activation a."""
    return GEMM_INT_VNNI[kind](blocks, xq, out)
