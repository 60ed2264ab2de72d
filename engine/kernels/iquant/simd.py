"""I-quant rows as SIMD code: the same numbers as iquant_rows.py (ggml's vec_dot), many times faster.

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
  dot_mxfp4 / dot_mxfp4_x8 / tile_mxfp4_x8   the same three for MXFP4 (17-byte blocks: an E8M0 exponent read as
                                      GGML_E8M0_TO_FP32_HALF, 16 bytes of codes looked up in kvalues_mxfp4)
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
    has_vnni,
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


def decode_iq4_xs(ops: Ops, b, pw) -> Block:
    """block_iq4_xs: | d:2 | scales_h:2 | scales_l:4 | qs:128 |, a 6-bit scale (minus 32) per 32 weights."""
    sh = b.zext(load(b, pw, I16, 2), I32)
    chunks = []
    for ib in range(8):
        lo = b.zext(load(b, pw, I8, 4 + ib // 2), I32)
        ls = b.or_(b.and_(b.lshr(lo, ir.Constant(I32, 4 * (ib % 2))), ir.Constant(I32, 15)),
                   b.shl(b.and_(b.lshr(sh, ir.Constant(I32, 2 * ib)), ir.Constant(I32, 3)), ir.Constant(I32, 4)))
        ls = b.sub(ls, ir.Constant(I32, 32))
        chunks.append(_chunk(b, ib, _weights32(ops, b, b.gep(pw, [ir.Constant(I64, 8 + 16 * ib)])), ls, ls))
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


def _chunk(b, ib, weights, lo, hi):
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
    plus, minus = _split(b, _weights32(ops, b, b.gep(pw, [ir.Constant(I64, fmt.qs)]), fmt.values))
    x = load(b, px, V32, 2)
    p = b.sub(ops.maddubs(plus, x), ops.maddubs(minus, x))
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


dot_iq4_xs = _row_intrinsic("dot_iq4_xs", lambda c, b, pw, nb, px: kquant_dot._row_dot(IQ4_XS, c, b, pw, nb, px))
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


def _block_lanes_vnni(ops: Ops, b, pw, x, fmt: _Nibbles):
    """<8 x i32> lanes of one 4-bit block against the activation bytes x (<32 x i8>) with its values offset to
    unsigned bytes (one vpdpbusd): each lane's exact sum plus the offset times its four activations' sum, which the
    caller takes off once per block (AVX512-VNNI)."""
    off = _offset(fmt)
    table = [(v + off) - 256 if v + off > 127 else v + off for v in fmt.values]  # the same bytes, as i8
    w = _weights32(ops, b, b.gep(pw, [ir.Constant(I64, fmt.qs)]), table)
    return _dpbusd8(b, ir.Constant(vec(I32, 8), None), w, x)


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
        lanes, dw = [], ir.Constant(f8, None)
        for r in range(8):
            pw = b.gep(pw0, [b.add(b.mul(ir.Constant(I64, r), rs), at)])
            lanes.append(_block_lanes_vnni(ops, b, pw, x, fmt) if vnni else _block_lanes_nl(ops, b, pw, px, fmt))
            dw = b.insert_element(dw, fmt.scale_w(context, b, pw), ir.Constant(I32, r))
        sumi = _row_sums(b, lanes)
        if vnni:  # each row's sum carried offset * sum(x): taken off once for the eight rows, exact in int32
            off = ir.Constant(vec(I8, 32), [ir.Constant(I8, _offset(fmt))] * 32)
            sx = call_intrinsic(b, "llvm.vector.reduce.add.v8i32", I32, [_dpbusd8(b, ir.Constant(vec(I32, 8), None),
                                                                                   off, x)])
            u = b.insert_element(ir.Constant(vec(I32, 8), None), sx, ir.Constant(I32, 0))
            sumi = b.sub(sumi, b.shuffle_vector(u, u, ir.Constant(vec(I32, 8), [ir.Constant(I32, 0)] * 8)))
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


rows8_iq4_nl_x8 = _rows8_intrinsic("rows8_iq4_nl_x8", IQ4_NL)
rows8_mxfp4_x8 = _rows8_intrinsic("rows8_mxfp4_x8", MXFP4)


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


OFFSET_IQ4_NL, OFFSET_MXFP4 = _offset(IQ4_NL), _offset(MXFP4)


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


# IQ4_XS in vec_dot's order (kquant_dot's tile loop), IQ4_NL rows as the iq4_nl_8x8 kernels sum them
tile_iq4_xs = _tile_intrinsic("tile_iq4_xs", lambda c, b, *a: kquant_dot._row_tile(IQ4_XS, c, b, *a))
tile_iq4_nl_x8 = _tile_intrinsic("tile_iq4_nl_x8", _tile_nl_x8)
tile_mxfp4_x8 = _tile_intrinsic("tile_mxfp4_x8", lambda c, b, *a: _tile_nl_x8(c, b, *a, fmt=MXFP4))
