"""MXFP4 and IQ4_NL rows in eights as llama.cpp's mxfp4_8x8 / iq4_nl_8x8 repack paths sum them (ggml-cpu/arch/x86/
repack.cpp, gemv_q4_b32_8x8_q8_0_lut_avx and gemm_...): per 32-value block one exact integer sum per row and
activation, then acc = fma(float(sumi), d_w * d_x, acc). Any way to the integer gives the same floats, so:

  rows8_*(w, wo, rs, nb, x, xo, out, oo)          a decode step: eight weight rows against one activation, their
                                                   sums gathered by a transposing reduction, one <8 x float> fma
  tile_*_x8(w, wo, nb, x, xo, xs, m, out, oo, os)  a batch: one row against m <= 16 activations, each block decoded
                                                   once for all of them
  tile8_*(..., sx, dx, so, ss)                     a batch on AVX512-VNNI: eight activations a step, unconditionally

On AVX512-VNNI the block's values are looked up offset to unsigned bytes (12 for MXFP4, 127 for IQ4_NL) and meet the
activation in vpdpbusd; the offset times the activation block's sum (exact in int32) is taken off after the
reduction. A decode step's eight rows go two to a 256-bit vector, their low nibbles against the activation's first 16
bytes and their high nibbles against its last 16 (no reordering of the weights), and three vphaddd gather the eight
sums (`_rows8_sums_vnni`); on AVX2 the same layout with vpmaddubsw / vpmaddwd (`_rows8_sums_avx2`). Elsewhere each
block meets the activation by vpmaddubsw of |w| and x with w's signs.
Q4_0 rows in eights (llama.cpp's q4_0_8x8 gemv: the same per-block integer and fma) are the same kernel with the
table nibble - 8 (`rows8_q4_0_x8`, which engine.kernels.legacy.gemv_int runs on AVX512-VNNI).
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.iquant.simd import (
    IQ4_NL,
    MXFP4,
    V32,
    _block_lanes_nl,
    _i64,
    _signed_pairs,
    _Nibbles,
    _split,
    _tile_intrinsic,
    _weights32,
)
from engine.kernels.kquant import dot as kquant_dot
from engine.kernels.kquant.repack import _row_sums
from engine.kernels.simd import (
    F32,
    I8,
    I16,
    I32,
    I64,
    Ops,
    byte_ptr,
    call_intrinsic,
    half_to_float,
    has_feature,
    has_vnni,
    load,
    prefetch,
    vec,
)


def _tile_nl_x8(context, b, pw0, nb, px0, xs, m, po, os, fmt: _Nibbles = IQ4_NL):
    """One IQ4_NL (or MXFP4) row against m <= 16 Q8_0 rows (px0 + a * xs) as the 8x8 kernels sum it, each block's
    weights decoded once for the m rows; result a at po + a * os.

    Per block and activation the 8x8 kernels take the block's exact integer sum, then acc = fma(float(sumi),
    d_w * d_x, acc). Here eight activations' <8 x i32> lanes are summed at once by a transposing reduction
    (lane a: activation a's sum) and their float steps run lane by lane on <8 x float>: the same values, without a
    horizontal sum per activation and block. An absent activation's lanes and scale stay zero."""
    ops = Ops(context, b)
    f8, i8x = vec(F32, 8), vec(I32, 8)
    accs = [cgutils.alloca_once_value(b, ir.Constant(f8, None)) for _ in range(2)]
    lanes = [cgutils.alloca_once_value(b, ir.Constant(i8x, None)) for _ in range(16)]
    dxs = [cgutils.alloca_once_value(b, ir.Constant(f8, None)) for _ in range(2)]
    live = [b.icmp_signed(">", m, ir.Constant(I64, a)) for a in range(16)]
    ones = ir.Constant(vec(I16, 16), [ir.Constant(I16, 1)] * 16)
    with cgutils.for_range(b, nb) as loop:
        pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, fmt.size))])
        plus, minus = _split(b, _weights32(ops, b, b.gep(pw, [ir.Constant(I64, fmt.qs)]), fmt.values))
        dw = fmt.scale_w(context, b, pw)
        px_i = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, 34))])
        for g in range(2):
            with b.if_then(live[8 * g], likely=True):
                for j in range(8):
                    a = 8 * g + j
                    with b.if_then(live[a], likely=True):
                        px = b.gep(px_i, [b.mul(ir.Constant(I64, a), xs)])
                        x = load(b, px, V32, 2)
                        b.store(ops.madd(b.sub(ops.maddubs(plus, x), ops.maddubs(minus, x)), ones), lanes[a])
                        dx = b.insert_element(b.load(dxs[g]), half_to_float(context, b, load(b, px, I16)),
                                              ir.Constant(I32, j))
                        b.store(dx, dxs[g])
                sumi = _row_sums(b, [b.load(lanes[8 * g + j]) for j in range(8)])
                d = b.fmul(kquant_dot._splat(b, dw, 8), b.load(dxs[g]))  # d_w * d_x, each rounded once
                acc = call_intrinsic(b, "llvm.fma.v8f32", f8, [b.sitofp(sumi, f8), d, b.load(accs[g])])
                b.store(acc, accs[g])
    for a in range(16):
        with b.if_then(live[a], likely=True):
            dst = b.bitcast(b.gep(po, [b.mul(ir.Constant(I64, a), os)]), F32.as_pointer())
            b.store(b.extract_element(b.load(accs[a // 8]), ir.Constant(I32, a % 8)), dst, align=4)


def _offset(fmt: _Nibbles) -> int:
    """What makes every value of the format's table a byte vpdpbusd takes unsigned (127 for IQ4_NL, 12 for MXFP4)."""
    return -min(fmt.values)


def _dpbusd8(b, acc, u, x):
    """vpdpbusd on 256 bits: acc lane k + the sum of u[4k + i] (unsigned bytes) * x[4k + i] (signed bytes)."""
    i8x = vec(I32, 8)
    return call_intrinsic(b, "llvm.x86.avx512.vpdpbusd.256", i8x, [acc, b.bitcast(u, i8x), b.bitcast(x, i8x)])


def _rows8_pairs(b, pws, x, fmt: _Nibbles, table: list[int], combine):
    """<8 x i32>: lane r = combine's sum for row r (pws[r]), the layout both rows-in-eights sums share.

    Rows r and r + 4 share a 256-bit vector of their 16 code bytes each, looked up in `table` (the format's values,
    or those plus an offset) by one vpshufb per nibble half (the table in both 128-bit lanes; a table that is the
    nibble itself needs none); the low nibbles (values 0-15) meet x's first 16 bytes and the high ones x's last 16,
    each half of x broadcast to both lanes: no byte reordering of the weights. combine((w_lo, w_hi), (x_lo, x_hi))
    gives the pair's <8 x i32> lanes ([row k | row k + 4]); three vphaddd then leave the eight rows' sums in order:
    ([r0 | r4], [r1 | r5]) -> ..., -> [r0 r1 r2 r3 | r4 r5 r6 r7]."""
    lut = ir.Constant(V32, [ir.Constant(I8, v - 256 if v > 127 else v) for v in table + table])
    i8x = vec(I32, 8)
    halves = [b.shuffle_vector(x, x, ir.Constant(vec(I32, 32), [ir.Constant(I32, 16 * h + k % 16) for k in range(32)]))
              for h in range(2)]
    low = ir.Constant(V32, [ir.Constant(I8, 15)] * 32)
    four = ir.Constant(V32, [ir.Constant(I8, 4)] * 32)
    sums = []
    for k in range(4):
        pair = [load(b, b.gep(pws[r], [ir.Constant(I64, fmt.qs)]), vec(I8, 16)) for r in (k, k + 4)]
        q = b.shuffle_vector(pair[0], pair[1], ir.Constant(vec(I32, 32), [ir.Constant(I32, j) for j in range(32)]))
        ws = [idx if table == list(range(16)) else call_intrinsic(b, "llvm.x86.avx2.pshuf.b", V32, [lut, idx])
              for idx in (b.and_(q, low), b.lshr(q, four))]
        sums.append(combine(ws, halves))
    hadd = lambda u, v: call_intrinsic(b, "llvm.x86.avx2.phadd.d", i8x, [u, v])  # noqa: E731
    return hadd(hadd(sums[0], sums[1]), hadd(sums[2], sums[3]))


def _rows8_sums_vnni(b, pws, x, fmt: _Nibbles):
    """<8 x i32>: lane r = the sum over one block of row r (pws[r]) of (value + offset) * x, exact (AVX512-VNNI):
    _rows8_pairs with the offset values (all unsigned bytes) and two vpdpbusd a pair."""
    off = _offset(fmt)
    zero = ir.Constant(vec(I32, 8), None)
    return _rows8_pairs(b, pws, x, fmt, [v + off for v in fmt.values],
                        lambda ws, xs: _dpbusd8(b, _dpbusd8(b, zero, ws[0], xs[0]), ws[1], xs[1]))


def _rows8_sums_avx2(ops: Ops, b, pws, x, fmt: _Nibbles):
    """<8 x i32>: lane r = the exact sum over one block of row r (pws[r]) of value * x, on AVX2 (no VNNI).

    _rows8_pairs with vpmaddubsw / vpmaddwd for vpdpbusd. A table whose offset values stay below 64 (Q4_0's nibble,
    MXFP4's value + 12) adds both halves' pair sums in int16 (at most 4 * 63 * 128 < 32768) and takes offset * sum(x)
    off at the end; IQ4_NL's wide values take ggml's |w| against sign(x, w) per half (at most 2 * 127 * 127), each
    half widened to int32 on its own."""
    off = _offset(fmt)
    ones = ir.Constant(vec(I16, 16), [ir.Constant(I16, 1)] * 16)
    if max(fmt.values) + off >= 64:
        return _rows8_pairs(b, pws, x, fmt, list(fmt.values), lambda ws, xs: b.add(
            *[ops.madd(_signed_pairs(ops, b, w, h), ones) for w, h in zip(ws, xs)]))
    sumi = _rows8_pairs(b, pws, x, fmt, [v + off for v in fmt.values], lambda ws, xs: ops.madd(
        b.add(ops.maddubs(ws[0], xs[0]), ops.maddubs(ws[1], xs[1])), ones))
    sx = call_intrinsic(b, "llvm.vector.reduce.add.v8i32", I32,
                        [ops.madd(ops.maddubs(ir.Constant(V32, [ir.Constant(I8, off)] * 32), x), ones)])
    return b.sub(sumi, _splat_i32(b, sx))


def _splat_i32(b, v):
    """<8 x i32>: v in every lane."""
    u = b.insert_element(ir.Constant(vec(I32, 8), None), v, ir.Constant(I32, 0))
    return b.shuffle_vector(u, u, ir.Constant(vec(I32, 8), [ir.Constant(I32, 0)] * 8))


def _scales8(context, b, pws, fmt: _Nibbles):
    """<8 x float>: the scale d_w of the block at each of the eight pointers, as fmt.scale_w reads one, on vectors:
    MXFP4's E8M0 byte 2^(e - 128) (subnormal patterns below e = 2), IQ4_NL's fp16 d."""
    if not fmt.e8m0:
        v = ir.Constant(vec(I16, 8), None)
        for r, pw in enumerate(pws):
            v = b.insert_element(v, load(b, pw, I16), ir.Constant(I32, r))
        if has_feature(context, "f16c"):
            return b.fpext(b.bitcast(v, vec(ir.HalfType(), 8)), vec(F32, 8))
        return _lanes8(b, [half_to_float(context, b, b.extract_element(v, ir.Constant(I32, r))) for r in range(8)])
    i8x = vec(I32, 8)
    e = ir.Constant(i8x, None)
    for r, pw in enumerate(pws):
        e = b.insert_element(e, b.zext(load(b, pw, I8), I32), ir.Constant(I32, r))
    splat = lambda v: ir.Constant(i8x, [ir.Constant(I32, v)] * 8)  # noqa: E731
    small = b.shl(splat(0x00200000), e)
    normal = b.shl(b.sub(e, splat(1)), splat(23))
    return b.bitcast(b.select(b.icmp_unsigned("<", e, splat(2)), small, normal), vec(F32, 8))


def _lanes8(b, values):
    v = ir.Constant(vec(F32, 8), None)
    for r, x in enumerate(values):
        v = b.insert_element(v, x, ir.Constant(I32, r))
    return v


def _rows8_nl_x8(context, b, pw0, rs, nb, px0, po, fmt: _Nibbles):
    """Eight IQ4_NL (or MXFP4) rows (row r at pw0 + r * rs) against one Q8_0 row, as the 8x8 kernels sum them: per
    block the eight rows' <8 x i32> lanes gathered by a transposing reduction (lane r: row r's exact sum), then one
    acc = fma(float(sumi), d_w * d_x, acc) on <8 x float>, a lane per row: each row's value as the one-row x8 dot
    makes it, without a horizontal sum and a scalar fma chain per row and block. The eight results go to po."""
    ops = Ops(context, b)
    f8 = vec(F32, 8)
    acc = cgutils.alloca_once_value(b, ir.Constant(f8, None))
    size = ir.Constant(I64, fmt.size)
    vnni = has_vnni(context)
    with cgutils.for_range(b, nb) as loop:
        px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, 34))])
        at = b.mul(loop.index, size)
        x = load(b, px, V32, 2)
        pws = [b.gep(pw0, [b.add(b.mul(ir.Constant(I64, r), rs), at)]) for r in range(8)]
        for pw in pws:
            prefetch(b, b.gep(pw, [b.mul(rs, ir.Constant(I64, 8))]))
        if vnni:
            sumi = _rows8_sums_vnni(b, pws, x, fmt)
        elif ops.avx2:
            sumi = _rows8_sums_avx2(ops, b, pws, x, fmt)
        else:
            sumi = _row_sums(b, [_block_lanes_nl(ops, b, pw, px, fmt) for pw in pws])
        dw = _scales8(context, b, pws, fmt)
        if vnni:  # each row's sum carried offset * sum(x): taken off once for the eight rows, exact in int32
            off = ir.Constant(vec(I8, 32), [ir.Constant(I8, _offset(fmt))] * 32)
            sx = call_intrinsic(b, "llvm.vector.reduce.add.v8i32", I32, [_dpbusd8(b, ir.Constant(vec(I32, 8), None),
                                                                                   off, x)])
            sumi = b.sub(sumi, _splat_i32(b, sx))
        d = b.fmul(dw, kquant_dot._splat(b, half_to_float(context, b, load(b, px, I16)), 8))  # d_w * d_x
        b.store(call_intrinsic(b, "llvm.fma.v8f32", f8, [b.sitofp(sumi, f8), d, b.load(acc)]), acc)
    b.store(b.load(acc), b.bitcast(po, f8.as_pointer()), align=4)


def _rows8_intrinsic(name: str, fmt: _Nibbles):
    """An intrinsic (w, wo, rs, nb, x, xo, out, oo): rows at byte wo, wo + rs, ... wo + 7 rs of w against the Q8_0 row
    at byte xo of x; the eight results at byte oo of out (float32)."""
    def typer(typingctx, w, wo, rs, nb, x, xo, out, oo):
        ok = isinstance(out, types.Array) and out.dtype == types.float32
        if not (ok and kquant_dot._valid((w, x), (wo, rs, nb, xo, oo))):
            return None

        def codegen(context, builder, signature, args):
            w_, wo_, rs_, nb_, x_, xo_, out_, oo_ = args
            pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
            px = byte_ptr(context, builder, signature.args[4], x_, xo_)
            po = byte_ptr(context, builder, signature.args[6], out_, oo_)
            _rows8_nl_x8(context, builder, pw, _i64(builder, rs_), _i64(builder, nb_), px, po, fmt)
            return context.get_dummy_value()

        return types.void(w, wo, rs, nb, x, xo, out, oo), codegen

    typer.__name__ = name
    return intrinsic(typer)


Q4_0_VALUES = _Nibbles(18, 2, list(range(-8, 8)), False)  # block_q4_0 (d, 16 bytes of nibbles) as a table of nibble - 8
rows8_iq4_nl_x8 = _rows8_intrinsic("rows8_iq4_nl_x8", IQ4_NL)
rows8_q4_0_x8 = _rows8_intrinsic("rows8_q4_0_x8", Q4_0_VALUES)  # llama.cpp's q4_0_8x8 gemv sums a block the same way
rows8_mxfp4_x8 = _rows8_intrinsic("rows8_mxfp4_x8", MXFP4)


def _tile8_vnni(context, b, pw0, nb, px0, xs, po, os, m, psx, pdx, ss, fmt: _Nibbles):
    """One row against eight Q8_0 rows (px0 + a * xs; rows past m are zero padding) on AVX512-VNNI, every activation
    unconditionally: per block the offset values decoded once, one vpdpbusd per activation, the eight sums gathered
    by the transposing reduction, less offset * sum(x) (int32 at psx + j * ss), times d_w * d_x (d_x float32 at
    pdx + j * ss), one fma on <8 x float>: the 8x8 kernels' values. Results a < m go to po + a * os. Without
    AVX512-VNNI it compiles to nothing (the drivers never call it there: vnni_target)."""
    if not has_vnni(context):
        return
    ops = Ops(context, b)
    f8, i8x = vec(F32, 8), vec(I32, 8)
    acc = cgutils.alloca_once_value(b, ir.Constant(f8, None))
    off = _offset(fmt)
    table = [(v + off) - 256 if v + off > 127 else v + off for v in fmt.values]
    with cgutils.for_range(b, nb) as loop:
        pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, fmt.size))])
        wu = _weights32(ops, b, b.gep(pw, [ir.Constant(I64, fmt.qs)]), table)
        px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, 34))])
        lanes = [_dpbusd8(b, ir.Constant(i8x, None), wu, load(b, b.gep(px, [b.mul(ir.Constant(I64, a), xs)]), V32, 2))
                 for a in range(8)]
        at = b.mul(loop.index, ss)
        sumi = b.sub(_row_sums(b, lanes), load(b, b.gep(psx, [at]), i8x))
        d = b.fmul(kquant_dot._splat(b, fmt.scale_w(context, b, pw), 8), load(b, b.gep(pdx, [at]), f8))
        b.store(call_intrinsic(b, "llvm.fma.v8f32", f8, [b.sitofp(sumi, f8), d, b.load(acc)]), acc)
    total = b.load(acc)
    for a in range(8):
        with b.if_then(b.icmp_signed(">", m, ir.Constant(I64, a)), likely=True):
            dst = b.bitcast(b.gep(po, [b.mul(ir.Constant(I64, a), os)]), F32.as_pointer())
            b.store(b.extract_element(total, ir.Constant(I32, a)), dst, align=4)


def _tile8_intrinsic(name: str, fmt: _Nibbles):
    """(w, wo, nb, x, xo, xs, out, oo, os, m, sx, dx, so, ss): _tile8_vnni for the row at byte wo of w and the eight
    activation rows from byte xo of x; sx (int32) and dx (float32) hold offset * sum(x) and d_x of activation a's
    block j at byte so + j * ss + 4 a of each (`block_sums`)."""
    def typer(typingctx, w, wo, nb, x, xo, xs, out, oo, os, m, sx, dx, so, ss):
        ok = (isinstance(out, types.Array) and out.dtype == types.float32 and isinstance(sx, types.Array)
              and sx.dtype == types.int32 and isinstance(dx, types.Array) and dx.dtype == types.float32)
        if not (ok and kquant_dot._valid((w, x), (wo, nb, xo, xs, oo, os, m, so, ss))):
            return None

        def codegen(context, builder, signature, args):
            w_, wo_, nb_, x_, xo_, xs_, out_, oo_, os_, m_, sx_, dx_, so_, ss_ = args
            i = lambda v: _i64(builder, v)
            pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
            px = byte_ptr(context, builder, signature.args[3], x_, xo_)
            po = byte_ptr(context, builder, signature.args[6], out_, oo_)
            psx = byte_ptr(context, builder, signature.args[10], sx_, so_)
            pdx = byte_ptr(context, builder, signature.args[11], dx_, so_)
            _tile8_vnni(context, builder, pw, i(nb_), px, i(xs_), po, i(os_), i(m_), psx, pdx, i(ss_), fmt)
            return context.get_dummy_value()

        return types.void(w, wo, nb, x, xo, xs, out, oo, os, m, sx, dx, so, ss), codegen

    typer.__name__ = name
    return intrinsic(typer)


def _vnni_typer(typingctx):
    def codegen(context, builder, signature, args):
        return ir.Constant(ir.IntType(1), int(has_vnni(context)))

    return types.boolean(), codegen


vnni_target = intrinsic(_vnni_typer)  # whether numba's target has AVX512-VNNI (a constant where compiled)
tile8_iq4_nl_x8 = _tile8_intrinsic("tile8_iq4_nl_x8", IQ4_NL)
tile8_mxfp4_x8 = _tile8_intrinsic("tile8_mxfp4_x8", MXFP4)
tile_iq4_nl_x8 = _tile_intrinsic("tile_iq4_nl_x8", _tile_nl_x8)
tile_mxfp4_x8 = _tile_intrinsic("tile_mxfp4_x8", lambda c, b, *a: _tile_nl_x8(c, b, *a, fmt=MXFP4))
OFFSET_IQ4_NL, OFFSET_MXFP4 = _offset(IQ4_NL), _offset(MXFP4)
