"""IQ4_XS and IQ4_NL rows as SIMD code: the same numbers as iquant_rows.py (ggml's vec_dot), many times faster.

The four-bit types look their weights up in kvalues_iq4nl, a 16-entry table, which is what `pshufb` does to 16
bytes at once (ggml's AVX2 code uses it the same way). The signed weights are split into their positive and
negative parts so that `maddubs` (unsigned x signed byte pairs) gives the exact pair sums, and `madd` with the
sub-block scale the eight int32 lanes of ggml's code: lane L sums the weights e with (e % 32) // 4 == L.
The float steps are ggml's: IQ4_XS through kquant_dot's super-block loop (acc = fma(d, float(lanes), acc),
hsum_float_8 at the end); IQ4_NL blocks in pairs into two accumulators, their sum's hsum, then a last odd block
as a scalar fma; IQ4_NL rows repacked by llama.cpp (iq4_nl_8x8) one scalar fma per block.

  dot_iq4_xs(w, wo, nb, x, xo)        one row of nb super-blocks at byte wo of w with the Q8_K row at byte xo
  tile_iq4_xs(w, wo, nb, x, xo, xs, m, out, oo, os)   the same for m <= 16 Q8_K rows, each block decoded once
  dot_iq4_nl(w, wo, nb, x, xo)        ggml_vec_dot_iq4_nl_q8_0 of nb blocks with Q8_0 blocks
  dot_iq4_nl_x8(w, wo, nb, x, xo)     the iq4_nl_8x8 gemv's value for the same row
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.quant.iquant_grids import kvalues_iq4nl

from . import kquant_dot
from .kquant_lanes import Block, Chunk
from .simd import (
    F32,
    I8,
    I16,
    I32,
    I64,
    Ops,
    byte_ptr,
    call_intrinsic,
    half_to_float,
    load,
    shuffle,
    vec,
)

V16, V32 = vec(I8, 16), vec(I8, 32)
_KV = [int(v) for v in kvalues_iq4nl().astype("int8")]


def _lut16(ops: Ops, b, idx):
    """<16 x i8> kvalues_iq4nl[idx] for idx in 0..15: pshufb where the CPU has SSSE3, lane by lane otherwise."""
    table = ir.Constant(V16, [ir.Constant(I8, v) for v in _KV])
    if ops.avx2:
        return call_intrinsic(b, "llvm.x86.ssse3.pshuf.b.128", V16, [table, idx])
    out = ir.Constant(V16, None)
    for k in range(16):
        j = b.extract_element(idx, ir.Constant(I32, k))
        out = b.insert_element(out, b.extract_element(table, j), ir.Constant(I32, k))
    return out


def _weights32(ops: Ops, b, pq):
    """The 32 signed weights of 16 nibble bytes at pq: low nibbles first, then high (dequantize_row_iq4_*)."""
    q = load(b, pq, V16)
    mask = ir.Constant(V16, [ir.Constant(I8, 15)] * 16)
    lo = _lut16(ops, b, b.and_(q, mask))
    hi = _lut16(ops, b, b.and_(b.lshr(q, ir.Constant(V16, [ir.Constant(I8, 4)] * 16)), mask))
    return b.shuffle_vector(lo, hi, ir.Constant(vec(I32, 32), [ir.Constant(I32, k) for k in range(32)]))


def _split(b, w):
    """(plus, minus): w = plus - minus with both in 0..127, so maddubs(plus, x) - maddubs(minus, x) is exact."""
    zero = ir.Constant(w.type, None)
    plus = b.select(b.icmp_signed(">", w, zero), w, zero)
    minus = b.select(b.icmp_signed("<", w, zero), b.sub(zero, w), zero)
    return plus, minus


def _splat16(b, v):
    u = b.insert_element(ir.Constant(vec(I16, 16), None), v, ir.Constant(I32, 0))
    return shuffle(b, u, [0] * 16)


def decode_iq4_xs(ops: Ops, b, pw) -> Block:
    """block_iq4_xs: | d:2 | scales_h:2 | scales_l:4 | qs:128 |, a 6-bit scale (minus 32) per 32 weights."""
    sh = b.zext(load(b, pw, I16, 2), I32)
    chunks = []
    for ib in range(8):
        lo = b.zext(load(b, pw, I8, 4 + ib // 2), I32)
        ls = b.or_(b.and_(b.lshr(lo, ir.Constant(I32, 4 * (ib % 2))), ir.Constant(I32, 15)),
                   b.shl(b.and_(b.lshr(sh, ir.Constant(I32, 2 * ib)), ir.Constant(I32, 3)), ir.Constant(I32, 4)))
        ls = b.trunc(b.sub(ls, ir.Constant(I32, 32)), I16)
        plus, minus = _split(b, _weights32(ops, b, b.gep(pw, [ir.Constant(I64, 8 + 16 * ib)])))
        chunks.append(Chunk(4 + 32 * ib, plus, _splat16(b, ls), minus))
    return Block(chunks, "")


IQ4_XS = kquant_dot._Type(136, 0, None, decode_iq4_xs, "")


def _block_lanes_nl(ops: Ops, b, pw, px):
    """<8 x i32> lanes of one IQ4_NL block (18 bytes at pw) with one Q8_0 block (34 bytes at px)."""
    plus, minus = _split(b, _weights32(ops, b, b.gep(pw, [ir.Constant(I64, 2)])))
    x = load(b, px, V32, 2)
    p = b.sub(ops.maddubs(plus, x), ops.maddubs(minus, x))
    return ops.madd(p, ir.Constant(vec(I16, 16), [ir.Constant(I16, 1)] * 16))


def _scale(context, b, pw, px):
    """fp16(d_x) * fp16(d_w), rounded once."""
    return b.fmul(half_to_float(context, b, load(b, px, I16)), half_to_float(context, b, load(b, pw, I16)))


def _row_nl(context, b, pw0, nb, px0, x8: bool):
    ops = Ops(context, b)
    if x8:  # iq4_nl_8x8: acc = fma(float(sumi), d_w * d_x, acc) per block
        acc = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))
        with cgutils.for_range(b, nb) as loop:
            pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, 18))])
            px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, 34))])
            sumi = call_intrinsic(b, "llvm.vector.reduce.add.v8i32", I32, [_block_lanes_nl(ops, b, pw, px)])
            d = b.fmul(half_to_float(context, b, load(b, pw, I16)), half_to_float(context, b, load(b, px, I16)))
            b.store(b.fma(b.sitofp(sumi, F32), d, b.load(acc)), acc)
        return b.load(acc)
    acc1 = cgutils.alloca_once_value(b, ir.Constant(vec(F32, 8), None))
    acc2 = cgutils.alloca_once_value(b, ir.Constant(vec(F32, 8), None))
    pairs = b.udiv(nb, ir.Constant(I64, 2))
    with cgutils.for_range(b, pairs) as loop:
        ib = b.mul(loop.index, ir.Constant(I64, 2))
        for k, acc in ((0, acc1), (1, acc2)):
            j = b.add(ib, ir.Constant(I64, k))
            pw = b.gep(pw0, [b.mul(j, ir.Constant(I64, 18))])
            px = b.gep(px0, [b.mul(j, ir.Constant(I64, 34))])
            b.store(kquant_dot._fma(b, _scale(context, b, pw, px), _block_lanes_nl(ops, b, pw, px), b.load(acc)), acc)
    total = cgutils.alloca_once_value(b, kquant_dot._hsum8(b, b.fadd(b.load(acc1), b.load(acc2))))
    odd = b.icmp_unsigned("!=", b.urem(nb, ir.Constant(I64, 2)), ir.Constant(I64, 0))
    with b.if_then(odd):  # the scalar tail: sumf += d * (sumi1 + sumi2), contracted to an fma
        last = b.sub(nb, ir.Constant(I64, 1))
        pw = b.gep(pw0, [b.mul(last, ir.Constant(I64, 18))])
        px = b.gep(px0, [b.mul(last, ir.Constant(I64, 34))])
        sumi = call_intrinsic(b, "llvm.vector.reduce.add.v8i32", I32, [_block_lanes_nl(ops, b, pw, px)])
        b.store(b.fma(_scale(context, b, pw, px), b.sitofp(sumi, F32), b.load(total)), total)
    return b.load(total)


def _i64(b, v):
    return v if v.type == I64 else b.sext(v, I64)


def _row_intrinsic(name: str, row):
    def typer(typingctx, w, wo, nb, x, xo):
        if not kquant_dot._valid((w, x), (wo, nb, xo)):
            return None

        def codegen(context, builder, signature, args):
            pw = byte_ptr(context, builder, signature.args[0], args[0], args[1])
            px = byte_ptr(context, builder, signature.args[3], args[3], args[4])
            return row(context, builder, pw, _i64(builder, args[2]), px)

        return types.float32(w, wo, nb, x, xo), codegen

    typer.__name__ = name
    return intrinsic(typer)


dot_iq4_xs = _row_intrinsic("dot_iq4_xs", lambda c, b, pw, nb, px: kquant_dot._row_dot(IQ4_XS, c, b, pw, nb, px))
dot_iq4_nl = _row_intrinsic("dot_iq4_nl", lambda c, b, pw, nb, px: _row_nl(c, b, pw, nb, px, False))
dot_iq4_nl_x8 = _row_intrinsic("dot_iq4_nl_x8", lambda c, b, pw, nb, px: _row_nl(c, b, pw, nb, px, True))


@intrinsic
def tile_iq4_xs(typingctx, w, wo, nb, x, xo, xs, m, out, oo, os):
    ok = isinstance(out, types.Array) and out.dtype == types.float32
    if not (ok and kquant_dot._valid((w, x), (wo, nb, xo, xs, m, oo, os))):
        return None

    def codegen(context, builder, signature, args):
        w_, wo_, nb_, x_, xo_, xs_, m_, out_, oo_, os_ = args
        pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
        px = byte_ptr(context, builder, signature.args[3], x_, xo_)
        po = byte_ptr(context, builder, signature.args[7], out_, oo_)
        kquant_dot._row_tile(IQ4_XS, context, builder, pw, _i64(builder, nb_), px, _i64(builder, xs_),
                             _i64(builder, m_), po, _i64(builder, os_))
        return context.get_dummy_value()

    return types.void(w, wo, nb, x, xo, xs, m, out, oo, os), codegen
