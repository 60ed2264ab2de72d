"""I-quant rows as SIMD code: the same numbers as iquant_rows.py (ggml's vec_dot), many times faster.

The four-bit types look their weights up in kvalues_iq4nl, a 16-entry table, which is what `pshufb` does to 16
bytes at once (ggml's AVX2 code uses it the same way). The signed weights are split into their positive and
negative parts so that `maddubs` (unsigned x signed byte pairs) gives the exact pair sums, and `madd` with the
sub-block scale the eight int32 lanes of ggml's code: lane L sums the weights e with (e % 32) // 4 == L.
The float steps are ggml's: IQ4_XS through kquant_dot's super-block loop (acc = fma(d, float(lanes), acc),
hsum_float_8 at the end); IQ4_NL blocks in pairs into two accumulators, their sum's hsum, then a last odd block
as a scalar fma; IQ4_NL rows repacked by llama.cpp (iq4_nl_8x8) one scalar fma per block.

  tile_iq4_xs(w, wo, nb, x, xo, xs, m, out, oo, os)   one row of nb super-blocks at byte wo of w with m <= 16 Q8_K
                                      rows, each block decoded once (one row with one: iq4_xs_gemv)
  dot_iq4_nl(w, wo, nb, x, xo)        ggml_vec_dot_iq4_nl_q8_0 of nb blocks with Q8_0 blocks
  dot_iq4_nl_x8(w, wo, nb, x, xo)     the iq4_nl_8x8 gemv's value for the same row
  dot_mxfp4 / dot_mxfp4_x8           the same two for MXFP4 (17-byte blocks: an E8M0 exponent read as
                                      GGML_E8M0_TO_FP32_HALF, 16 bytes of codes looked up in kvalues_mxfp4)
  (eights.py: both types' rows and batches in eights, as the 8x8 repack paths, on these blocks)
  dot_iq2_xxs / iq2_xs / iq2_s / iq3_xxs / iq3_s(w, wo, nb, x, xo)   vec_dot before its last constant (0.125 for
                                      IQ2_*, 0.25 for IQ3_XXS), which the caller multiplies in as ggml does

The grid types read their grid points (8 weights in an i64 for IQ2, 4 in an i32 for IQ3) and ksigns_iq2xs from
constant tables in the compiled module and apply the sign bits with a compare and select. IQ1_S / IQ1_M (delta
terms in their own accumulators) stay scalar.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.quant.iquant_grids import grid_bytes, ksigns, kvalues_iq4nl

from engine.kernels.kquant import dot as kquant_dot
from engine.kernels.kquant.lanes import Block, Chunk
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
    load,
    shuffle,
    vec,
)

V16, V32 = vec(I8, 16), vec(I8, 32)
_KV = [int(v) for v in kvalues_iq4nl().astype("int8")]


def _lut16(ops: Ops, b, idx, values: list[int] = _KV):
    """<16 x i8> values[idx] (kvalues_iq4nl, or kvalues_mxfp4) for idx in 0..15: pshufb where the CPU has SSSE3,
    lane by lane otherwise."""
    table = ir.Constant(V16, [ir.Constant(I8, v) for v in values])
    if ops.avx2:
        return call_intrinsic(b, "llvm.x86.ssse3.pshuf.b.128", V16, [table, idx])
    out = ir.Constant(V16, None)
    for k in range(16):
        j = b.extract_element(idx, ir.Constant(I32, k))
        out = b.insert_element(out, b.extract_element(table, j), ir.Constant(I32, k))
    return out


def _weights32(ops: Ops, b, pq, values: list[int] = _KV):
    """The 32 signed weights of 16 nibble bytes at pq: low nibbles first, then high (dequantize_row_iq4_*,
    dequantize_row_mxfp4)."""
    q = load(b, pq, V16)
    mask = ir.Constant(V16, [ir.Constant(I8, 15)] * 16)
    lo = _lut16(ops, b, b.and_(q, mask), values)
    hi = _lut16(ops, b, b.and_(b.lshr(q, ir.Constant(V16, [ir.Constant(I8, 4)] * 16)), mask), values)
    return b.shuffle_vector(lo, hi, ir.Constant(vec(I32, 32), [ir.Constant(I32, k) for k in range(32)]))


def _split(b, w):
    """(plus, minus): w = plus - minus with both in 0..127, so maddubs(plus, x) - maddubs(minus, x) is exact."""
    zero = ir.Constant(w.type, None)
    plus = b.select(b.icmp_signed(">", w, zero), w, zero)
    minus = b.select(b.icmp_signed("<", w, zero), b.sub(zero, w), zero)
    return plus, minus


def _abs(b, w):
    """|w| of signed bytes (no table value is -128, so it fits 0..127)."""
    return b.select(b.icmp_signed("<", w, ir.Constant(w.type, None)), b.sub(ir.Constant(w.type, None), w), w)


def _signed_pairs(ops: Ops, b, w, x):
    """<16 x i16> pair sums of w * x, exact: maddubs(|w|, sign(x, w)) where the target has AVX2 (ggml's
    mul_add_epi8: |w| <= 127 and |x| <= 127, so no pair saturates), else maddubs(plus) - maddubs(minus)."""
    if ops.avx2:
        return ops.maddubs(_abs(b, w), ops.sign(x, w))
    plus, minus = _split(b, w)
    return b.sub(ops.maddubs(plus, x), ops.maddubs(minus, x))


def _iq4_xs_scales(b, pw):
    """<8 x i32>: the eight 6-bit scales minus 32 of a block_iq4_xs, computed side by side: sub-block ib's low four
    bits are nibble ib % 2 of scales_l[ib // 2], its high two bits bits 2 ib, 2 ib + 1 of scales_h."""
    i32x8 = vec(I32, 8)

    def const(values):
        return ir.Constant(i32x8, [ir.Constant(I32, v) for v in values])

    low = b.zext(b.shuffle_vector(load(b, pw, vec(I8, 4), 4), ir.Constant(vec(I8, 4), None),
                                  ir.Constant(vec(I32, 8), [ir.Constant(I32, k // 2) for k in range(8)])), i32x8)
    low = b.and_(b.lshr(low, const([4 * (k % 2) for k in range(8)])), const([15] * 8))
    sh = b.zext(load(b, pw, I16, 2), I32)
    one = b.insert_element(ir.Constant(i32x8, None), sh, ir.Constant(I32, 0))
    high = b.shuffle_vector(one, ir.Constant(i32x8, None), const([0] * 8))
    high = b.shl(b.and_(b.lshr(high, const([2 * k for k in range(8)])), const([3] * 8)), const([4] * 8))
    return b.sub(b.or_(low, high), const([32] * 8))


def decode_iq4_xs(ops: Ops, b, pw) -> Block:
    """block_iq4_xs: | d:2 | scales_h:2 | scales_l:4 | qs:128 |, a 6-bit scale (minus 32) per 32 weights."""
    scales = _iq4_xs_scales(b, pw)
    chunks = []
    for ib in range(8):
        ls = b.extract_element(scales, ir.Constant(I32, ib))
        chunks.append(_chunk(b, ib, _weights32(ops, b, b.gep(pw, [ir.Constant(I64, 8 + 16 * ib)])), ls, ls, ops))
    return Block(chunks, "")


IQ4_XS = kquant_dot._Type(136, 0, None, decode_iq4_xs, "")


# ---- the grid types: 8 (IQ2) or 4 (IQ3) weights per grid point, read from the table as one i64 / i32


def _table(b, name: str):
    """The lookup table `name` (a grid, or ksigns_iq2xs) as a constant array in the module, made once per module."""
    glob = b.module.globals.get(f"gguf_lens_{name}")
    if glob is None:
        if name == "ksigns":
            t, data = I8, ksigns().astype(np.uint8).tolist()
        else:
            rows = grid_bytes(name)
            t = ir.IntType(8 * rows.shape[1])
            data = rows.copy().view(f"<u{rows.shape[1]}").reshape(-1).tolist()
        glob = ir.GlobalVariable(b.module, ir.ArrayType(t, len(data)), f"gguf_lens_{name}")
        glob.linkage, glob.global_constant = "internal", True
        glob.initializer = ir.Constant(ir.ArrayType(t, len(data)), [ir.Constant(t, int(v)) for v in data])
    return glob


def _entry(b, name: str, idx):
    """Entry idx (an i32) of table `name`: a grid point as <8 x i8> / <4 x i8>, a ksigns byte as i8."""
    glob = _table(b, name)
    value = b.load(b.gep(glob, [ir.Constant(I32, 0), idx]))
    return value if value.type == I8 else b.bitcast(value, vec(I8, value.type.width // 8))


def _signed(b, v, signs):
    """v with weight k negated where bit k of the i8 `signs` is set."""
    n = v.type.count
    bits = ir.Constant(vec(I8, n), [ir.Constant(I8, (1 << k) - (256 if k == 7 else 0)) for k in range(n)])
    u = b.insert_element(ir.Constant(vec(I8, n), None), signs, ir.Constant(I32, 0))
    neg = b.icmp_unsigned("!=", b.and_(shuffle(b, u, [0] * n), bits), ir.Constant(vec(I8, n), None))
    return b.select(neg, b.sub(ir.Constant(v.type, None), v), v)


def _cat(b, parts):
    """Concatenate equal byte vectors into one (4 x 8 or 8 x 4 -> 32)."""
    while len(parts) > 1:
        n = parts[0].type.count
        mask = ir.Constant(vec(I32, 2 * n), [ir.Constant(I32, k) for k in range(2 * n)])
        parts = [b.shuffle_vector(parts[k], parts[k + 1], mask) for k in range(0, len(parts), 2)]
    return parts[0]


def _c(v: int):
    return ir.Constant(I32, v)


def _u8(b, pw, at):
    return b.zext(load(b, pw, I8, at), I32)


def _scales(b, lo, hi):
    """<16 x i16>: the scale lo for the first 16 weights of a chunk, hi for the last 16 (i32 values)."""
    v = ir.Constant(vec(I16, 16), None)
    for k in range(16):
        v = b.insert_element(v, b.trunc(lo if k < 8 else hi, I16), _c(k))
    return v


def _chunk(b, ib, weights, lo, hi, ops: Ops | None = None):
    """Chunk ib of signed weights: |w| against x with w's signs (AVX2 and up, `ops` given), else plus and minus."""
    if ops is not None and ops.avx2:
        return Chunk(4 + 32 * ib, _abs(b, weights), _scales(b, lo, hi), signs=weights)
    plus, minus = _split(b, weights)
    return Chunk(4 + 32 * ib, plus, _scales(b, lo, hi), minus)


def _odd_scale(b, v):
    return b.add(b.mul(v, _c(2)), _c(1))


def decode_iq2_xxs(ops: Ops, b, pw) -> Block:
    chunks = []
    for ib in range(8):
        aux = load(b, pw, I32, 2 + 8 * ib + 4)
        ls = _odd_scale(b, b.lshr(aux, _c(28)))
        parts = [_signed(b, _entry(b, "iq2xxs_grid", _u8(b, pw, 2 + 8 * ib + g)),
                         _entry(b, "ksigns", b.and_(b.lshr(aux, _c(7 * g)), _c(127)))) for g in range(4)]
        chunks.append(_chunk(b, ib, _cat(b, parts), ls, ls))
    return Block(chunks, "")


def decode_iq2_xs(ops: Ops, b, pw) -> Block:
    chunks = []
    for ib in range(8):
        sc = _u8(b, pw, 66 + ib)
        parts = []
        for g in range(4):
            q = b.zext(load(b, pw, I16, 2 + 2 * (4 * ib + g)), I32)
            parts.append(_signed(b, _entry(b, "iq2xs_grid", b.and_(q, _c(511))), _entry(b, "ksigns", b.lshr(q, _c(9)))))
        chunks.append(_chunk(b, ib, _cat(b, parts), _odd_scale(b, b.and_(sc, _c(15))), _odd_scale(b, b.lshr(sc, _c(4)))))
    return Block(chunks, "")


def decode_iq2_s(ops: Ops, b, pw) -> Block:
    chunks = []
    for ib in range(8):
        sc, qh = _u8(b, pw, 74 + ib), _u8(b, pw, 66 + ib)
        parts = []
        for g in range(4):
            gi = b.or_(_u8(b, pw, 2 + 4 * ib + g), b.shl(b.and_(b.lshr(qh, _c(2 * g)), _c(3)), _c(8)))
            parts.append(_signed(b, _entry(b, "iq2s_grid", gi), load(b, pw, I8, 34 + 4 * ib + g)))
        chunks.append(_chunk(b, ib, _cat(b, parts), _odd_scale(b, b.and_(sc, _c(15))), _odd_scale(b, b.lshr(sc, _c(4)))))
    return Block(chunks, "")


def decode_iq3_xxs(ops: Ops, b, pw) -> Block:
    chunks = []
    for ib in range(8):
        aux = load(b, pw, I32, 66 + 4 * ib)
        ls = _odd_scale(b, b.lshr(aux, _c(28)))
        parts = []
        for j in range(8):
            signs = _entry(b, "ksigns", b.and_(b.lshr(aux, _c(7 * (j >> 1))), _c(127)))
            signs = b.lshr(signs, ir.Constant(I8, 4 * (j & 1)))
            parts.append(_signed(b, _entry(b, "iq3xxs_grid", _u8(b, pw, 2 + 8 * ib + j)), signs))
        chunks.append(_chunk(b, ib, _cat(b, parts), ls, ls))
    return Block(chunks, "")


def decode_iq3_s(ops: Ops, b, pw) -> Block:
    chunks = []
    for ib in range(8):
        qh = _u8(b, pw, 66 + ib)
        ls = _odd_scale(b, b.and_(b.lshr(_u8(b, pw, 106 + ib // 2), _c(4 * (ib % 2))), _c(15)))
        parts = []
        for j in range(8):
            gi = b.or_(_u8(b, pw, 2 + 8 * ib + j), b.shl(b.and_(b.lshr(qh, _c(j)), _c(1)), _c(8)))
            signs = b.lshr(load(b, pw, I8, 74 + 4 * ib + (j >> 1)), ir.Constant(I8, 4 * (j & 1)))
            parts.append(_signed(b, _entry(b, "iq3s_grid", gi), signs))
        chunks.append(_chunk(b, ib, _cat(b, parts), ls, ls))
    return Block(chunks, "")


GRID_TYPES = {"iq2_xxs": kquant_dot._Type(66, 0, None, decode_iq2_xxs, ""),
              "iq2_xs": kquant_dot._Type(74, 0, None, decode_iq2_xs, ""),
              "iq2_s": kquant_dot._Type(82, 0, None, decode_iq2_s, ""),
              "iq3_xxs": kquant_dot._Type(98, 0, None, decode_iq3_xxs, ""),
              "iq3_s": kquant_dot._Type(110, 0, None, decode_iq3_s, "")}


class _Nibbles:
    """A 32-weight block of 4-bit codes looked up in a table, with one scale: IQ4_NL (fp16 d, kvalues_iq4nl) or
    MXFP4 (an E8M0 exponent byte read as GGML_E8M0_TO_FP32_HALF, kvalues_mxfp4)."""

    def __init__(self, size: int, qs: int, values: list[int], e8m0: bool):
        self.size, self.qs, self.values, self.e8m0 = size, qs, values, e8m0

    def scale_w(self, context, b, pw):
        if not self.e8m0:
            return half_to_float(context, b, load(b, pw, I16))
        e = b.zext(load(b, pw, I8), I32)  # 2^(e - 128): subnormal patterns below e = 2, else exponent bits e - 1
        small = b.shl(ir.Constant(I32, 0x00200000), e)
        normal = b.shl(b.sub(e, ir.Constant(I32, 1)), ir.Constant(I32, 23))
        return b.bitcast(b.select(b.icmp_unsigned("<", e, ir.Constant(I32, 2)), small, normal), F32)


IQ4_NL = _Nibbles(18, 2, _KV, False)
MXFP4 = _Nibbles(17, 1, [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], True)


def _block_lanes_nl(ops: Ops, b, pw, px, fmt: _Nibbles = IQ4_NL):
    """<8 x i32> lanes of one 4-bit block (fmt.size bytes at pw) with one Q8_0 block (34 bytes at px)."""
    w = _weights32(ops, b, b.gep(pw, [ir.Constant(I64, fmt.qs)]), fmt.values)
    p = _signed_pairs(ops, b, w, load(b, px, V32, 2))
    return ops.madd(p, ir.Constant(vec(I16, 16), [ir.Constant(I16, 1)] * 16))


def _scale(context, b, pw, px, fmt: _Nibbles = IQ4_NL):
    """d_x * d_w (fp16 d_x; d_w as the format stores it), rounded once."""
    return b.fmul(half_to_float(context, b, load(b, px, I16)), fmt.scale_w(context, b, pw))


def _row_nl(context, b, pw0, nb, px0, x8: bool, fmt: _Nibbles = IQ4_NL):
    ops = Ops(context, b)
    size = ir.Constant(I64, fmt.size)
    if x8:  # iq4_nl_8x8 / mxfp4_8x8: acc = fma(float(sumi), d_w * d_x, acc) per block
        acc = cgutils.alloca_once_value(b, ir.Constant(F32, 0.0))
        with cgutils.for_range(b, nb) as loop:
            pw = b.gep(pw0, [b.mul(loop.index, size)])
            px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, 34))])
            sumi = call_intrinsic(b, "llvm.vector.reduce.add.v8i32", I32, [_block_lanes_nl(ops, b, pw, px, fmt)])
            b.store(b.fma(b.sitofp(sumi, F32), _scale(context, b, pw, px, fmt), b.load(acc)), acc)
        return b.load(acc)
    acc1 = cgutils.alloca_once_value(b, ir.Constant(vec(F32, 8), None))
    acc2 = cgutils.alloca_once_value(b, ir.Constant(vec(F32, 8), None))
    pairs = b.udiv(nb, ir.Constant(I64, 2))
    with cgutils.for_range(b, pairs) as loop:
        ib = b.mul(loop.index, ir.Constant(I64, 2))
        for k, acc in ((0, acc1), (1, acc2)):
            j = b.add(ib, ir.Constant(I64, k))
            pw = b.gep(pw0, [b.mul(j, size)])
            px = b.gep(px0, [b.mul(j, ir.Constant(I64, 34))])
            b.store(kquant_dot._fma(b, _scale(context, b, pw, px, fmt), _block_lanes_nl(ops, b, pw, px, fmt),
                                    b.load(acc)), acc)
    total = cgutils.alloca_once_value(b, kquant_dot._hsum8(b, b.fadd(b.load(acc1), b.load(acc2))))
    odd = b.icmp_unsigned("!=", b.urem(nb, ir.Constant(I64, 2)), ir.Constant(I64, 0))
    with b.if_then(odd):  # the scalar tail: sumf += d * (sumi1 + sumi2), contracted to an fma
        last = b.sub(nb, ir.Constant(I64, 1))
        pw = b.gep(pw0, [b.mul(last, size)])
        px = b.gep(px0, [b.mul(last, ir.Constant(I64, 34))])
        sumi = call_intrinsic(b, "llvm.vector.reduce.add.v8i32", I32, [_block_lanes_nl(ops, b, pw, px, fmt)])
        b.store(b.fma(_scale(context, b, pw, px, fmt), b.sitofp(sumi, F32), b.load(total)), total)
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


dot_iq4_nl = _row_intrinsic("dot_iq4_nl", lambda c, b, pw, nb, px: _row_nl(c, b, pw, nb, px, False))
dot_iq4_nl_x8 = _row_intrinsic("dot_iq4_nl_x8", lambda c, b, pw, nb, px: _row_nl(c, b, pw, nb, px, True))
dot_mxfp4 = _row_intrinsic("dot_mxfp4", lambda c, b, pw, nb, px: _row_nl(c, b, pw, nb, px, False, MXFP4))
dot_mxfp4_x8 = _row_intrinsic("dot_mxfp4_x8", lambda c, b, pw, nb, px: _row_nl(c, b, pw, nb, px, True, MXFP4))


def _grid_row(name: str):
    spec = GRID_TYPES[name]
    return _row_intrinsic(f"dot_{name}", lambda c, b, pw, nb, px: kquant_dot._row_dot(spec, c, b, pw, nb, px))


# without the type's constant (0.125 for IQ2_*, 0.25 for IQ3_XXS): the caller multiplies, as ggml's last line
dot_iq2_xxs, dot_iq2_xs, dot_iq2_s = _grid_row("iq2_xxs"), _grid_row("iq2_xs"), _grid_row("iq2_s")
dot_iq3_xxs, dot_iq3_s = _grid_row("iq3_xxs"), _grid_row("iq3_s")


def _tile_intrinsic(name: str, tile):
    """An intrinsic (w, wo, nb, x, xo, xs, m, out, oo, os): the row at byte wo of w with m <= 16 activation rows from
    byte xo of x, xs bytes apart, each block decoded once; result a at byte oo + a * os of out (float32)."""
    def typer(typingctx, w, wo, nb, x, xo, xs, m, out, oo, os):
        ok = isinstance(out, types.Array) and out.dtype == types.float32
        if not (ok and kquant_dot._valid((w, x), (wo, nb, xo, xs, m, oo, os))):
            return None

        def codegen(context, builder, signature, args):
            w_, wo_, nb_, x_, xo_, xs_, m_, out_, oo_, os_ = args
            pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
            px = byte_ptr(context, builder, signature.args[3], x_, xo_)
            po = byte_ptr(context, builder, signature.args[7], out_, oo_)
            tile(context, builder, pw, _i64(builder, nb_), px, _i64(builder, xs_), _i64(builder, m_), po,
                 _i64(builder, os_))
            return context.get_dummy_value()

        return types.void(w, wo, nb, x, xo, xs, m, out, oo, os), codegen

    typer.__name__ = name
    return intrinsic(typer)


# IQ4_XS in vec_dot's order (kquant_dot's tile loop)
tile_iq4_xs = _tile_intrinsic("tile_iq4_xs", lambda c, b, *a: kquant_dot._row_tile(IQ4_XS, c, b, *a))
