"""Vector building blocks for the compiled kernels: LLVM IR emitted inside numba intrinsics.

Plain numba loops over a block's 16- and 32-byte pieces do not become ggml's byte products:
numba runs LLVM's SLP vectoriser off by default, short loops are unrolled before the loop
vectoriser sees them, small-integer arithmetic is widened to int64, and each slice of an array
costs a reference count. The best loop layout measured 48-60 ns per Q4_K super-block against
llama.cpp's 16-18 ns. So the k-quant kernels emit explicit LLVM vector code, the instruction
sequence of ggml's AVX2 kernels: `maddubs` (u8 x i8 pairs -> i16, vpmaddubsw) and `madd`
(i16 x i16 pairs -> i32, vpmaddwd), then fused multiply-adds on <8 x float>.

Where numba's target machine has AVX2 the x86 intrinsics are emitted; elsewhere (ARM, old
x86, NUMBA_CPU_NAME=generic) the same arithmetic as plain vector IR, which LLVM lowers for
any target. Both are exact: no product pair in these kernels comes near the i16 saturation
of vpmaddubsw (at most 2 * 63 * 128). fp16 scales convert with vcvtph2ps where the target has
F16C, by integer arithmetic otherwise (exact either way).

Everything here takes and returns llvmlite values and runs inside an intrinsic's codegen.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

from llvmlite import ir

I8 = ir.IntType(8)
I16 = ir.IntType(16)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()


def vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def const_vec(t: ir.IntType, values: Sequence[int]) -> ir.Constant:
    return ir.Constant(vec(t, len(values)), [ir.Constant(t, v) for v in values])


def splat_const(t: ir.IntType, value: int, n: int) -> ir.Constant:
    return const_vec(t, [value] * n)


def target_features(context) -> str:
    """The feature string of numba's target machine ('+avx2,+fma,...'), '' when unknown."""
    codegen = context.codegen()
    feats = getattr(codegen, "_tm_features", None)  # what numba's JIT target machine was built with
    if feats is None and hasattr(codegen, "_get_host_cpu_features"):
        feats = codegen._get_host_cpu_features()
    return feats or ""  # unknown: the portable path


@functools.cache
def host_has(name: str) -> bool:
    """Whether this machine's CPU has feature `name` ('avx512f', ...), as LLVM reads it; False when unknown."""
    try:
        from llvmlite import binding  # noqa: PLC0415

        return bool(binding.get_host_cpu_features().get(name, False))
    except Exception:  # noqa: BLE001 - an unreadable feature list means: not there
        return False


def has_feature(context, name: str) -> bool:
    return f"+{name}" in target_features(context).split(",")


def has_vnni(context) -> bool:
    """AVX512-VNNI with the byte operations its kernels use on 256- and 512-bit vectors (vpdpbusd)."""
    return all(has_feature(context, f) for f in ("avx512vnni", "avx512vl", "avx512bw"))


# ---- memory


def byte_ptr(context, builder, aryty, ary, offset) -> ir.Value:
    """i8 pointer to byte `offset` (an integer value) of an array's data, whatever its dtype or shape."""
    data = context.make_array(aryty)(context, builder, ary).data
    data = builder.bitcast(data, I8.as_pointer())
    if offset.type != I64:
        offset = builder.zext(offset, I64) if offset.type.width < 64 else offset
    return builder.gep(data, [offset])


def at(builder, ptr, offset: int) -> ir.Value:
    return builder.gep(ptr, [ir.Constant(I64, offset)]) if offset else ptr


def load(builder, ptr, t: ir.Type, offset: int = 0) -> ir.Value:
    """Unaligned load of a value of type `t` at byte `offset` from the i8 pointer `ptr`."""
    return builder.load(builder.bitcast(at(builder, ptr, offset), t.as_pointer()), align=1)


def prefetch(builder, ptr) -> None:
    """A read prefetch of the cache line at the i8 pointer `ptr` into all cache levels (llvm.prefetch: a hint, never
    a fault, whatever the address)."""
    i32 = ir.IntType(32)
    fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]))
    builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])


def opaque(context, builder, v) -> ir.Value:
    """v through an empty inline asm where one vector register holds it (256 bits with AVX, 512 with AVX-512F): the
    shuffles after it cannot be folded by LLVM into the ones before. LLVM merges a widening and per-use picks into
    one cross-lane permutation each use, slower than one widening and an in-lane shuffle each. Elsewhere v itself."""
    bits = v.type.count * v.type.element.width if isinstance(v.type, ir.VectorType) else 0
    if not (bits == 512 and has_feature(context, "avx512f") or 0 < bits <= 256 and has_feature(context, "avx")):
        return v
    return builder.call(ir.InlineAsm(ir.FunctionType(v.type, [v.type]), "", "=x,0"), [v])


# ---- integer vector ops


def shuffle(builder, v, mask: Sequence[int]) -> ir.Value:
    return builder.shuffle_vector(v, v, const_vec(I32, mask))


def call_intrinsic(builder, name: str, ret: ir.Type, args: Sequence[ir.Value]) -> ir.Value:
    """Call the LLVM intrinsic `name` (declared on first use) with `args`."""
    fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(ret, [a.type for a in args]))
    return builder.call(fn, args)


def _pairs(builder, a, b, n: int, wide: ir.Type, ext_a, ext_b) -> ir.Value:
    """sum of adjacent products a[2k] b[2k] + a[2k+1] b[2k+1], widened to `wide`."""
    even, odd = list(range(0, n, 2)), list(range(1, n, 2))
    t = vec(wide, n // 2)
    lo = builder.mul(ext_a(shuffle(builder, a, even), t), ext_b(shuffle(builder, b, even), t))
    hi = builder.mul(ext_a(shuffle(builder, a, odd), t), ext_b(shuffle(builder, b, odd), t))
    return builder.add(lo, hi)


class Ops:
    """maddubs / madd for one target: x86 AVX2 intrinsics when available, plain IR otherwise."""

    def __init__(self, context, builder):
        self.b = builder
        self.context = context
        self.avx2 = has_feature(context, "avx2")

    def maddubs(self, a, b) -> ir.Value:
        """<32 x u8> a, <32 x i8> b -> <16 x i16> pair sums, as _mm256_maddubs_epi16."""
        if self.avx2:
            return call_intrinsic(self.b, "llvm.x86.avx2.pmadd.ub.sw", vec(I16, 16), [a, b])
        return _pairs(self.b, a, b, 32, I16, self.b.zext, self.b.sext)

    def sign(self, a, b) -> ir.Value:
        """<32 x i8>: a where b > 0, -a (wrapping) where b < 0, 0 where b == 0, as _mm256_sign_epi8."""
        if self.avx2:
            return call_intrinsic(self.b, "llvm.x86.avx2.psign.b", a.type, [a, b])
        zero = ir.Constant(a.type, None)
        neg = self.b.icmp_signed("<", b, zero)
        return self.b.select(neg, self.b.sub(zero, a), self.b.select(self.b.icmp_signed("==", b, zero), zero, a))

    def madd(self, a, b) -> ir.Value:
        """<2n x i16> a, b -> <n x i32> pair sums, as _mm256_madd_epi16 / _mm_madd_epi16."""
        n = a.type.count
        if self.avx2 and n == 16:
            return call_intrinsic(self.b, "llvm.x86.avx2.pmadd.wd", vec(I32, 8), [a, b])
        if self.avx2 and n == 8:
            return call_intrinsic(self.b, "llvm.x86.sse2.pmadd.wd", vec(I32, 4), [a, b])
        return _pairs(self.b, a, b, n, I32, self.b.sext, self.b.sext)

    def scales16(self, scales, k0: int, k1: int) -> ir.Value:
        """<16 x i16> holding scales[k0] eight times then scales[k1] eight times (a 16-weight sub-block pair)."""
        return shuffle(self.b, scales, [k0] * 8 + [k1] * 8)

    def lane_scales(self, scales) -> list[ir.Value]:
        """Two <16 x i16> whose 128-bit lanes both hold scales 0-7, and both 8-15 (ggml's scales[2]), each made once
        and kept from LLVM's folding (`opaque`), so that a pair of scales is one in-lane shuffle (`pair_scales`)."""
        return [opaque(self.context, self.b, shuffle(self.b, scales, [8 * j + k % 8 for k in range(16)])) for j in range(2)]

    def pair_scales(self, lanes, k0: int, k1: int) -> ir.Value:
        """scales16(scales, k0, k1) from lane_scales' vectors, k0 and k1 in the same eight (an in-lane vpshufb)."""
        j = k0 // 8
        return shuffle(self.b, lanes[j], [k0 % 8] * 8 + [8 + k1 % 8] * 8)

    def pair_add(self, v) -> ir.Value:
        """<2n x i16> -> <n x i16> adjacent sums, as _mm_hadd_epi16 of the two halves."""
        n = v.type.count
        return self.b.add(shuffle(self.b, v, list(range(0, n, 2))), shuffle(self.b, v, list(range(1, n, 2))))

    def hsum(self, v) -> ir.Value:
        """Integer sum of all lanes (exact in any order)."""
        total = self.b.extract_element(v, ir.Constant(I32, 0))
        for i in range(1, v.type.count):
            total = self.b.add(total, self.b.extract_element(v, ir.Constant(I32, i)))
        return total


# ---- scalars


def float_to_half(context, builder, x: ir.Value) -> ir.Value:
    """float32 -> fp16 bits (i16), round to nearest even: vcvtps2ph with F16C, integer arithmetic otherwise
    (LLVM would call __truncsfhf2 there, which numba's JIT does not link). NaN keeps vcvtps2ph's quieted
    payload, overflow gives infinity."""
    if has_feature(context, "f16c"):
        return builder.bitcast(builder.fptrunc(x, ir.HalfType()), I16)
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    bits = builder.bitcast(x, I32)
    sign = builder.and_(builder.lshr(bits, c(16)), c(0x8000))
    mag = builder.and_(bits, c(0x7FFFFFFF))
    nan = builder.or_(c(0x7E00), builder.and_(builder.lshr(mag, c(13)), c(0x3FF)))
    big = builder.select(builder.icmp_unsigned(">", mag, c(0x7F800000)), nan, c(0x7C00))
    # subnormal or zero: adding 0.5 lines the fp16 subnormal's bits up in the float's mantissa, rounded by the add
    half = builder.bitcast(c(0x3F000000), F32)
    sub = builder.sub(builder.bitcast(builder.fadd(builder.bitcast(mag, F32), half), I32), c(0x3F000000))
    # normal: rebias the exponent, round the 13 dropped bits to nearest even (a carry may reach infinity)
    odd = builder.and_(builder.lshr(mag, c(13)), c(1))
    normal = builder.lshr(builder.add(builder.add(mag, c(((15 - 127) << 23) + 0xFFF)), odd), c(13))
    out = builder.select(builder.icmp_unsigned("<", mag, c(113 << 23)), sub, normal)
    out = builder.select(builder.icmp_unsigned(">=", mag, c((127 + 16) << 23)), big, out)
    return builder.trunc(builder.or_(out, sign), I16)


def half_to_float(context, builder, bits: ir.Value) -> ir.Value:
    """fp16 bits (i16) -> float32, exactly: vcvtph2ps with F16C, integer arithmetic otherwise."""
    if has_feature(context, "f16c"):
        return builder.fpext(builder.bitcast(bits, ir.HalfType()), F32)
    h = builder.zext(bits, I32)
    sign = builder.shl(builder.and_(h, ir.Constant(I32, 0x8000)), ir.Constant(I32, 16))
    exp = builder.and_(builder.lshr(h, ir.Constant(I32, 10)), ir.Constant(I32, 31))
    man = builder.and_(h, ir.Constant(I32, 1023))
    # normal: rebias the exponent by 112; inf / NaN: exponent 255; subnormal: man * 2^-24 (exact)
    normal = builder.or_(builder.shl(builder.add(exp, ir.Constant(I32, 112)), ir.Constant(I32, 23)),
                         builder.shl(man, ir.Constant(I32, 13)))
    special = builder.or_(ir.Constant(I32, 0x7F800000), builder.shl(man, ir.Constant(I32, 13)))
    quiet = builder.select(builder.icmp_unsigned("!=", man, ir.Constant(I32, 0)), ir.Constant(I32, 0x400000),
                           ir.Constant(I32, 0))
    special = builder.or_(special, quiet)  # vcvtph2ps quiets a signalling NaN
    sub = builder.bitcast(builder.fmul(builder.uitofp(man, F32), ir.Constant(F32, 2.0**-24)), I32)
    is_sub = builder.icmp_unsigned("==", exp, ir.Constant(I32, 0))
    is_special = builder.icmp_unsigned("==", exp, ir.Constant(I32, 31))
    mag = builder.select(is_sub, sub, builder.select(is_special, special, normal))
    return builder.bitcast(builder.or_(mag, sign), F32)
