"""The integer core of one k-quant super-block times one Q8_K block, as ggml's AVX2 code computes it.

In two steps, both emitting LLVM IR inside an intrinsic's codegen:

  decode_<type>(ops, b, pw) unpacks the super-block at the i8 pointer `pw` into eight 32-byte
  quant vectors with their sub-block scales (and the mins), once per block however many
  activations it meets;
  lanes(ops, b, block, px) multiplies them with the block_q8_K at `px` into the int32 lanes that
  ggml_vec_dot_q*_K_q8_K (ggml-cpu/arch/x86/quants.c, `__AVX2__` branch) converts to float:

  an <8 x i32> of the quants: lane L holds the scaled products of the weights e with
  (e % 32) // 4 == L, because `_mm256_maddubs_epi16` pairs neighbouring bytes and
  `_mm256_madd_epi16` neighbouring int16, so each int32 lane sums four consecutive bytes of
  every 32-byte piece;
  and the minimum term where ggml has one, from the activation's bsums: Q2_K an <8 x i32>,
  Q4_K an <4 x i32> (acc_m), Q5_K one i32; None for Q3_K and Q6_K (whose -32 offset is
  taken off the quant lanes through bsums).

The float part (fp16 scales, fused multiply-adds, the final horizontal sum) is in
kquant_dot.py; the NumPy statement of the same arithmetic is kquant_ref.py.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llvmlite import ir

from engine.kernels.simd import I8, I16, I32, Ops, const_vec, load, splat_const, vec

V32 = vec(I8, 32)
_QS = 4  # block_q8_K: d (4 bytes), qs (256), bsums (16 x int16)
_BSUMS = 260
Lanes = tuple[ir.Value, ir.Value | None]


@dataclass
class Chunk:
    """32 weights: lanes += madd(scales, maddubs(plus, x) [- maddubs(minus, x)]), x the q8 at byte x_at (times the
    signs of `signs` where given)."""

    x_at: int
    plus: ir.Value  # <32 x u8>
    scales: ir.Value  # <16 x i16>: one scale per int16 pair of the maddubs result
    minus: ir.Value | None = None
    signs: ir.Value | None = None  # <32 x i8>: x takes their signs first (plus = |signs|: ggml's mul_add_epi8)


@dataclass
class Block:
    """A decoded super-block: its eight chunks and how its min / offset term is made from bsums."""

    chunks: list[Chunk]
    mins: str  # "" none, "q2" (8 lanes), "k4" (4 lanes), "k4_sum" (one integer), "q6_offset" (off the lanes)
    min_weights: ir.Value | None = None  # <16 x i16> (q2, q6_offset) or <8 x i16> (k4)


Decoder = Callable[[Ops, ir.IRBuilder, ir.Value], Block]


def _byte_vec(value: int, n: int = 32) -> ir.Constant:
    return splat_const(I8, value - 256 if value > 127 else value, n)


def _words(builder, ptr, offset: int, n: int) -> list[ir.Value]:
    return [load(builder, ptr, I32, offset + 4 * k) for k in range(n)]


def bytes_of_words(builder, words: list[ir.Value]) -> ir.Value:
    """Four i32 -> <16 x i8> in memory order (little-endian), as _mm_set_epi32(w3, w2, w1, w0)."""
    v = ir.Constant(vec(I32, 4), None)
    for k, w in enumerate(words):
        v = builder.insert_element(v, w, ir.Constant(I32, k))
    return builder.bitcast(v, vec(I8, 16))


def _k(v: int) -> ir.Constant:
    return ir.Constant(I32, v)


# ---- Q2_K: | scales:16 | qs:64 | d:2 | dmin:2 |


def decode_q2_k(ops: Ops, b, pw) -> Block:
    """Q2_K: 2-bit quants, 4-bit scales and mins per 16 weights."""
    sc8 = load(b, pw, vec(I8, 16), 0)
    scales = ops.lane_scales(b.zext(b.and_(sc8, _byte_vec(15, 16)), vec(I16, 16)))
    chunks = []
    for j in range(2):
        bits = load(b, pw, V32, 16 + 32 * j)
        for s in range(4):
            c = 4 * j + s  # sub-blocks 2c, 2c + 1 of 16 weights
            q = b.and_(b.lshr(bits, _byte_vec(2 * s)), _byte_vec(3))
            chunks.append(Chunk(_QS + 32 * c, q, ops.pair_scales(scales, 2 * c, 2 * c + 1)))
    return Block(chunks, "q2", b.zext(b.lshr(sc8, _byte_vec(4, 16)), vec(I16, 16)))


# ---- Q3_K: | hmask:32 | qs:64 | scales:12 | d:2 |


def q3_k_scales_ir(b, pw) -> ir.Value:
    """<16 x i8> six-bit scales minus 32, the kmask shuffle of ggml_vec_dot_q3_K_q8_K."""
    a0, a1, a2 = _words(b, pw, 96, 3)
    m2, m4 = _k(0x03030303), _k(0x0F0F0F0F)

    def part(lo, hi_shift):
        return b.or_(lo, b.shl(b.and_(b.lshr(a2, _k(hi_shift)), m2), _k(4)))

    words = [part(b.and_(a0, m4), 0), part(b.and_(a1, m4), 2),
             part(b.and_(b.lshr(a0, _k(4)), m4), 4), part(b.and_(b.lshr(a1, _k(4)), m4), 6)]
    return b.sub(bytes_of_words(b, words), _byte_vec(32, 16))


def decode_q3_k(ops: Ops, b, pw) -> Block:
    """Q3_K: low 2 bits, minus 4 where the hmask bit is clear (a second maddubs), scale - 32."""
    scales = b.sext(q3_k_scales_ir(b, pw), vec(I16, 16))
    not_h = b.xor(load(b, pw, V32, 0), _byte_vec(255))
    chunks = []
    for j in range(2):
        bits = load(b, pw, V32, 32 + 32 * j)
        for s in range(4):
            c = 4 * j + s
            q_lo = b.and_(b.lshr(bits, _byte_vec(2 * s)), _byte_vec(3))
            q_hi = b.shl(b.lshr(b.and_(not_h, _byte_vec(1 << c)), _byte_vec(c)), _byte_vec(2))
            chunks.append(Chunk(_QS + 32 * c, q_lo, ops.scales16(scales, 2 * c, 2 * c + 1), q_hi))
    return Block(chunks, "")


# ---- Q4_K / Q5_K: | d:2 | dmin:2 | scales:12 | (qh:32 |) qs:128 |


def k4_scales_mins_ir(b, pw) -> tuple[ir.Value, ir.Value]:
    """The utmp shuffle of ggml_vec_dot_q4_K_q8_K: (<8 x i16> scales, <8 x i16> mins)."""
    u0, u1, u2 = _words(b, pw, 4, 3)
    m1, m2, m3 = _k(0x3F3F3F3F), _k(0x0F0F0F0F), _k(0x03030303)
    u3 = b.or_(b.and_(b.lshr(u2, _k(4)), m2), b.shl(b.and_(b.lshr(u1, _k(6)), m3), _k(4)))
    aux = b.and_(u1, m1)
    u1 = b.or_(b.and_(u2, m2), b.shl(b.and_(b.lshr(u0, _k(6)), m3), _k(4)))
    u0 = b.and_(u0, m1)
    both = b.zext(bytes_of_words(b, [u0, u1, aux, u3]), vec(I16, 16))
    lo = b.shuffle_vector(both, both, const_vec(I32, list(range(8))))
    hi = b.shuffle_vector(both, both, const_vec(I32, list(range(8, 16))))
    return lo, hi


def decode_q4_k(ops: Ops, b, pw) -> Block:
    """Q4_K: nibbles, a 6-bit scale and min per 32 weights (sub-block 2j low nibbles, 2j + 1 high)."""
    scales, mins = k4_scales_mins_ir(b, pw)
    chunks = []
    for j in range(4):
        bits = load(b, pw, V32, 16 + 32 * j)
        chunks.append(Chunk(_QS + 64 * j, b.and_(bits, _byte_vec(15)), ops.scales16(scales, 2 * j, 2 * j)))
        chunks.append(Chunk(_QS + 64 * j + 32, b.lshr(bits, _byte_vec(4)), ops.scales16(scales, 2 * j + 1, 2 * j + 1)))
    return Block(chunks, "k4", mins)


def decode_q5_k(ops: Ops, b, pw) -> Block:
    """Q5_K: Q4_K plus bit s of qh as the fifth bit of sub-block s."""
    scales, mins = k4_scales_mins_ir(b, pw)
    hbits = load(b, pw, V32, 16)
    chunks = []
    for j in range(4):
        bits = load(b, pw, V32, 48 + 32 * j)
        for h, low in enumerate((b.and_(bits, _byte_vec(15)), b.lshr(bits, _byte_vec(4)))):
            s = 2 * j + h
            high = b.shl(b.lshr(b.and_(hbits, _byte_vec(1 << s)), _byte_vec(s)), _byte_vec(4))
            chunks.append(Chunk(_QS + 32 * s, b.add(low, high), ops.scales16(scales, s, s)))
    return Block(chunks, "k4_sum", mins)


# ---- Q6_K: | ql:128 | qh:64 | scales:16 (int8) | d:2 |


def decode_q6_k(ops: Ops, b, pw) -> Block:
    """Q6_K: unsigned 6-bit quants (the -32 comes off through bsums), int8 scales per 16 weights."""
    scales = b.sext(load(b, pw, vec(I8, 16), 192), vec(I16, 16))
    chunks = []
    for j in range(2):
        b1 = load(b, pw, V32, 64 * j)
        b2 = load(b, pw, V32, 64 * j + 32)
        h = load(b, pw, V32, 128 + 32 * j)
        m15 = _byte_vec(15)
        quants = [
            b.or_(b.and_(b1, m15), b.shl(b.and_(h, _byte_vec(3)), _byte_vec(4))),
            b.or_(b.and_(b2, m15), b.shl(b.and_(h, _byte_vec(12)), _byte_vec(2))),
            b.or_(b.lshr(b1, _byte_vec(4)), b.and_(h, _byte_vec(48))),
            b.or_(b.lshr(b2, _byte_vec(4)), b.lshr(b.and_(h, _byte_vec(192)), _byte_vec(2))),
        ]
        for k, q in enumerate(quants):
            c = 4 * j + k
            chunks.append(Chunk(_QS + 32 * c, q, ops.scales16(scales, 2 * c, 2 * c + 1)))
    return Block(chunks, "q6_offset", scales)


# ---- one decoded block times one block_q8_K


def lanes(ops: Ops, b, block: Block, px) -> Lanes:
    """(quant lanes <8 x i32>, min term or None) of a decoded super-block with the block_q8_K at px."""
    acc = None
    for chunk in block.chunks:
        x = load(b, px, V32, chunk.x_at)
        if chunk.signs is not None:
            x = ops.sign(x, chunk.signs)
        p = ops.maddubs(chunk.plus, x)
        if chunk.minus is not None:
            p = b.sub(p, ops.maddubs(chunk.minus, x))
        t = ops.madd(chunk.scales, p)
        acc = t if acc is None else b.add(acc, t)
    if not block.mins:
        return acc, None
    bsums = load(b, px, vec(I16, 16), _BSUMS)
    if block.mins == "q2":  # _mm256_madd_epi16(mins, bsums)
        return acc, ops.madd(block.min_weights, bsums)
    if block.mins == "q6_offset":  # sumi - (_mm256_madd_epi16(bsums, scales) << 5)
        return b.sub(acc, b.shl(ops.madd(bsums, block.min_weights), splat_const(I32, 5, 8))), None
    # _mm_madd_epi16(mins, _mm_hadd_epi16(bsums[0:8], bsums[8:16]))
    m4 = ops.madd(block.min_weights, ops.pair_add(bsums))
    return acc, (ops.hsum(m4) if block.mins == "k4_sum" else m4)
