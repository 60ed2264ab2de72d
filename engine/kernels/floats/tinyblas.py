"""llamafile's tinyBLAS order for float products, the kernels llama.cpp's CPU backend runs for a batch.

For a batch of two rows or more (and a row length in sixteens) ggml-cpu hands F32 x F32 and F16 x F16 products
(F16 weights meet activations rounded to fp16, their vec_dot_type) to llamafile_sgemm, which on AVX-512 keeps
one 16-lane accumulator per output and walks the shared dimension sixteen values at a time,

  acc = fma(a[l : l + 16], b[l : l + 16], acc)        l = 0, 16, ...      (fp16 loaded with vcvtph2ps)
  c = _mm512_reduce_add_ps(acc)                      halves added: 16 -> 8 -> 4 -> 2 -> 1

A single row goes to vec_dot instead (legacy_floats). The same order serves the prompt's attention products
(engine.ops.attention_prefill). numba leaves such 16-lane loops scalar (LLVM unrolls them first), so the dot
products here are explicit 512-bit vector code.

  dot16(a, ao, b, bo, n)          one output: rows at byte offsets ao of a and bo of b (fp16 bits or float32)
  axpy16(v, vo, w, acc, ao, n)    acc[c] = fma(fp16 v[c], w, acc[c]) (V*w's lanes in the prompt attention)
  steps16(a, ao, b, bo, n_steps)  ggml_vec_dot_f32 / _f16's four accumulators and their reduction, n_steps steps of
                                  64 (steps8: 32, the AVX2 build's): the body of engine.kernels.floats.vec_dot's rows
  gemm(w, x, out, w8)             out (m, r) = tinyBLAS of weight rows w (r, n) with rows x (m, n), same dtype

The AVX2 build runs tinyBLAS<8, __m256>: the same walk eight values at a time, reduced by its hsum (the 128-bit
halves added, then movehl / movehdup); dot8, axpy8 and gemm(..., w8=True) follow it (engine.kernels.isa).

BF16 x BF16 with AVX512_BF16 (tinyBLAS<32, __m512, __m512bh>): one 16-lane accumulator per output, 32 values a
step through VDPBF16PS itself (lane l: the products of elements 2l + 1 and 2l, denormals read as zero and
flushed, round to nearest even), then the same reduction.

  gemm_bf16(w, x, out)            as gemm for bf16 bits (uint16) on both sides, n % 32 == 0; bf16_available()

The AVX2 build has no VDPBF16PS: its BF16 batches are tinyBLAS<8, __m256, __m256, ggml_bf16_t>, the bf16 values
widened to float exactly and walked as the F32 ones (gemm_bf16_8).
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.simd import F32, I16, I32, I64, byte_ptr, call_intrinsic, load, shuffle, vec
from engine.kernels.variants import specialise

LANES = 16
_F16X = vec(F32, LANES)


def _lanes(b, p, i, half: bool, n_lanes: int = LANES, bf16: bool = False):
    """Element n_lanes * i of the data at p as <n_lanes x float>: fp16 bits (vcvtph2ps), bf16 bits (widened by a
    shift, exact) or float32."""
    if half and bf16:
        raw = load(b, b.gep(p, [b.mul(i, ir.Constant(I64, 2 * n_lanes))]), vec(I16, n_lanes))
        wide = b.shl(b.zext(raw, vec(I32, n_lanes)), ir.Constant(vec(I32, n_lanes), [ir.Constant(I32, 16)] * n_lanes))
        return b.bitcast(wide, vec(F32, n_lanes))
    if half:
        raw = load(b, b.gep(p, [b.mul(i, ir.Constant(I64, 2 * n_lanes))]), vec(I16, n_lanes))
        return b.fpext(b.bitcast(raw, vec(ir.HalfType(), n_lanes)), vec(F32, n_lanes))
    return load(b, b.gep(p, [b.mul(i, ir.Constant(I64, 4 * n_lanes))]), vec(F32, n_lanes))


def _is_half(aryty) -> bool:
    return aryty.dtype == types.uint16


def _reduce16(b, a):
    """_mm512_reduce_add_ps in GCC's order: (a[k] + a[k + 8]), then + 4 apart, then (u0 + u2) + (u1 + u3)."""
    t = b.fadd(shuffle(b, a, range(8)), shuffle(b, a, range(8, 16)))
    return _reduce8(b, t)


def _reduce8(b, a):
    """tinyBLAS's hsum(__m256) (and the tail of _reduce16): the 128-bit halves added, then (u0 + u2) + (u1 + u3)."""
    u = b.fadd(shuffle(b, a, range(4)), shuffle(b, a, range(4, 8)))
    lane = [b.extract_element(u, ir.Constant(I32, n)) for n in range(4)]
    return b.fadd(b.fadd(lane[0], lane[2]), b.fadd(lane[1], lane[3]))


def _dot(n_lanes: int, bf16: bool = False):
    """An intrinsic dot<n_lanes>(a, ao, b, bo, n): tinyBLAS<n_lanes>'s value of one output, a's row at byte ao and b's
    at byte bo, n values (n % n_lanes == 0): one accumulator of n_lanes floats, then its horizontal sum. bf16: uint16
    rows are bf16 bits (tinyBLAS<8, __m256, __m256, ggml_bf16_t>, the AVX2 build's BF16), else fp16."""
    vt, fma = vec(F32, n_lanes), f"llvm.fma.v{n_lanes}f32"
    reduce = _reduce16 if n_lanes == 16 else _reduce8

    def dot(typingctx, a, ao, bb, bo, n):
        def codegen(context, b, signature, args):
            a_, ao_, b_, bo_, n_ = args
            pa = byte_ptr(context, b, signature.args[0], a_, ao_)
            pb = byte_ptr(context, b, signature.args[2], b_, bo_)
            half_a, half_b = _is_half(signature.args[0]), _is_half(signature.args[2])
            acc = cgutils.alloca_once_value(b, ir.Constant(vt, None))
            with cgutils.for_range(b, b.sdiv(n_, ir.Constant(n_.type, n_lanes))) as loop:
                av = _lanes(b, pa, loop.index, half_a, n_lanes, bf16)
                bv = _lanes(b, pb, loop.index, half_b, n_lanes, bf16)
                b.store(call_intrinsic(b, fma, vt, [av, bv, b.load(acc)]), acc)
            return reduce(b, b.load(acc))

        return types.float32(a, ao, bb, bo, n), codegen

    dot.__name__ = dot.__qualname__ = f"dot{n_lanes}{'bf' if bf16 else ''}"
    return intrinsic(dot)


def _axpy(n_lanes: int):
    """An intrinsic axpy<n_lanes>(v, vo, w, acc, ao, n): acc[c] = fma(fp16 v[c], w, acc[c]) for the n values of v's
    row at byte vo and acc's at byte ao, n_lanes at a time (the V*w lanes of the prompt attention)."""
    vt, fma = vec(F32, n_lanes), f"llvm.fma.v{n_lanes}f32"

    def axpy(typingctx, v, vo, w, acc, ao, n):
        def codegen(context, b, signature, args):
            v_, vo_, w_, acc_, ao_, n_ = args
            pv = byte_ptr(context, b, signature.args[0], v_, vo_)
            pa = byte_ptr(context, b, signature.args[3], acc_, ao_)
            wv = shuffle(b, b.insert_element(ir.Constant(vt, None), w_, ir.Constant(I32, 0)), [0] * n_lanes)
            with cgutils.for_range(b, b.sdiv(n_, ir.Constant(n_.type, n_lanes))) as loop:
                pc = b.bitcast(b.gep(pa, [b.mul(loop.index, ir.Constant(I64, 4 * n_lanes))]), vt.as_pointer())
                vv = _lanes(b, pv, loop.index, True, n_lanes)
                b.store(call_intrinsic(b, fma, vt, [vv, wv, b.load(pc, align=4)]), pc, align=4)
            return context.get_dummy_value()

        return types.void(v, vo, w, acc, ao, n), codegen

    axpy.__name__ = axpy.__qualname__ = f"axpy{n_lanes}"
    return intrinsic(axpy)


dot16, dot8, dot8bf = _dot(16), _dot(8), _dot(8, bf16=True)
axpy16, axpy8 = _axpy(16), _axpy(8)


def _hadd8(b, a):
    """GGML_F32x8_REDUCE's tail: the 128-bit halves added, then two hadds: (t0 + t1) + (t2 + t3)."""
    t = b.fadd(shuffle(b, a, range(4)), shuffle(b, a, range(4, 8)))
    lane = [b.extract_element(t, ir.Constant(I32, n)) for n in range(4)]
    return b.fadd(b.fadd(lane[0], lane[1]), b.fadd(lane[2], lane[3]))


def _vec_steps(n_lanes: int):
    """An intrinsic steps<n_lanes>(a, ao, b, bo, n_steps): the body of ggml_vec_dot_f32 / _f16 (vec.cpp) over
    n_steps steps of 4 * n_lanes values, a's row at byte ao (fp16 bits or float32), b's at bo: four accumulators,
    element e of a step into accumulator e // n_lanes with one fma, then GGML_F32x16_REDUCE (n_lanes 16: (s0 + s2)
    + (s1 + s3), then _mm512_reduce_add_ps) or GGML_F32x8_REDUCE (8: the same pairs, then two hadds)."""
    vt, fma = vec(F32, n_lanes), f"llvm.fma.v{n_lanes}f32"
    reduce = _reduce16 if n_lanes == 16 else _hadd8

    def steps(typingctx, a, ao, bb, bo, n_steps):
        def codegen(context, b, signature, args):
            a_, ao_, b_, bo_, n_ = args
            pa = byte_ptr(context, b, signature.args[0], a_, ao_)
            pb = byte_ptr(context, b, signature.args[2], b_, bo_)
            half_a, half_b = _is_half(signature.args[0]), _is_half(signature.args[2])
            accs = [cgutils.alloca_once_value(b, ir.Constant(vt, None)) for _ in range(4)]
            with cgutils.for_range(b, n_) as loop:
                for k, acc in enumerate(accs):
                    i = b.add(b.mul(loop.index, ir.Constant(I64, 4)), ir.Constant(I64, k))
                    av, bv = _lanes(b, pa, i, half_a, n_lanes), _lanes(b, pb, i, half_b, n_lanes)
                    b.store(call_intrinsic(b, fma, vt, [av, bv, b.load(acc)]), acc)
            s = [b.load(acc) for acc in accs]
            return reduce(b, b.fadd(b.fadd(s[0], s[2]), b.fadd(s[1], s[3])))

        return types.float32(a, ao, bb, bo, n_steps), codegen

    steps.__name__ = steps.__qualname__ = f"steps{n_lanes}"
    return intrinsic(steps)


steps16, steps8 = _vec_steps(16), _vec_steps(8)


class _BFloat(ir.types._BaseFloatType):
    """LLVM's bfloat, which llvmlite's ir does not name (VDPBF16PS's operands are <32 x bfloat>)."""

    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"

    def format_constant(self, value) -> str:
        return f"0xR{int(value):04X}"


_BFloat._create_instance()
_BF32 = vec(_BFloat(), 32)


@intrinsic
def dot32bf(typingctx, a, ao, bb, bo, n):
    """tinyBLAS<32, __m512, __m512bh>'s value of one output: bf16 rows of a at byte ao and b at byte bo, n values
    (n % 32 == 0), VDPBF16PS per 32 values into one accumulator, then _mm512_reduce_add_ps."""
    def codegen(context, b, signature, args):
        a_, ao_, b_, bo_, n_ = args
        pa = byte_ptr(context, b, signature.args[0], a_, ao_)
        pb = byte_ptr(context, b, signature.args[2], b_, bo_)
        acc = cgutils.alloca_once_value(b, ir.Constant(_F16X, None))
        with cgutils.for_range(b, b.sdiv(n_, ir.Constant(n_.type, 2 * LANES))) as loop:
            at = b.mul(loop.index, ir.Constant(I64, 4 * LANES))
            av = b.bitcast(load(b, b.gep(pa, [at]), vec(I32, LANES)), _BF32)
            bv = b.bitcast(load(b, b.gep(pb, [at]), vec(I32, LANES)), _BF32)
            b.store(call_intrinsic(b, "llvm.x86.avx512bf16.dpbf16ps.512", _F16X, [b.load(acc), av, bv]), acc)
        return _reduce16(b, b.load(acc))

    return types.float32(a, ao, bb, bo, n), codegen


@intrinsic
def dot64bf_acc(typingctx, a, ao, bb, n, acc):
    """ggml_vec_dot_bf16's AVX512_BF16 loop for one row: bf16 values of a from byte ao against b, n % 64 == 0,
    VDPBF16PS per 64 values into two accumulators (the first 32 values and the last 32); both stored to acc (32,)
    for the caller's reduction (engine.kernels.floats.vec_dot's order: each reduced, added in double)."""
    def codegen(context, b, signature, args):
        a_, ao_, b_, n_, acc_ = args
        pa = byte_ptr(context, b, signature.args[0], a_, ao_)
        pb = byte_ptr(context, b, signature.args[2], b_, ir.Constant(I64, 0))
        po = byte_ptr(context, b, signature.args[4], acc_, ir.Constant(I64, 0))
        accs = [cgutils.alloca_once_value(b, ir.Constant(_F16X, None)) for _ in range(2)]
        with cgutils.for_range(b, b.sdiv(n_, ir.Constant(n_.type, 4 * LANES))) as loop:
            at = b.mul(loop.index, ir.Constant(I64, 8 * LANES))
            for k, acc in enumerate(accs):
                av = b.bitcast(load(b, b.gep(pa, [at]), vec(I32, LANES), 4 * LANES * k), _BF32)
                bv = b.bitcast(load(b, b.gep(pb, [at]), vec(I32, LANES), 4 * LANES * k), _BF32)
                b.store(call_intrinsic(b, "llvm.x86.avx512bf16.dpbf16ps.512", _F16X, [b.load(acc), av, bv]), acc)
        for k, acc in enumerate(accs):
            b.store(b.load(acc), b.bitcast(b.gep(po, [ir.Constant(I64, 4 * LANES * k)]), _F16X.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(a, ao, bb, n, acc), codegen


def _gemm_bf16_rows(w, x, out):
    """out[t, r] = DOT_BF16 of bf16 weight row r with bf16 activation row t, both uint16 bits, C-contiguous rows of
    n values, sixteen weight rows a task: the loop of both builds' BF16 batches, each copy with its own DOT_BF16."""
    r_n, n = w.shape
    m = x.shape[0]
    for task in prange((r_n + 15) // 16):
        for t in range(m):
            for r in range(task * 16, min(r_n, task * 16 + 16)):
                out[t, r] = DOT_BF16(w, r * w.strides[0], x, t * x.strides[0], n)


DOT_BF16 = dot32bf  # the global each copy of _gemm_bf16_rows fixes (engine.kernels.variants.specialise)
# tinyBLAS<32, __m512, __m512bh> (AVX512_BF16: VDPBF16PS), n % 32 == 0; compiles only where bf16_available()
gemm_bf16 = specialise(_gemm_bf16_rows, "avx512bf16", {"DOT_BF16": dot32bf}, cache=True, parallel=True)
# tinyBLAS<8, __m256, __m256, ggml_bf16_t> (the AVX2 build's BF16 batches: widened exactly, one fma per value into an
# 8-float accumulator, hsum), n % 8 == 0
gemm_bf16_8 = specialise(_gemm_bf16_rows, "avx2", {"DOT_BF16": dot8bf}, cache=True, parallel=True)


_BF16_OK: list[bool] = []


def bf16_available() -> bool:
    """Whether numba's target has AVX512_BF16 (gemm_bf16 compiles and runs)."""
    if not _BF16_OK:
        try:
            import numpy as np  # noqa: PLC0415

            from engine.kernels.isa import target_has  # noqa: PLC0415

            ok = target_has("avx512bf16")
            if ok:
                one = np.full((1, 32), 0x3F80, np.uint16)  # 1.0
                out = np.zeros((2, 1), np.float32)
                gemm_bf16(one, np.repeat(one, 2, axis=0), out)
                ok = bool((out == 32.0).all())
            _BF16_OK.append(ok)
        except Exception:  # noqa: BLE001 - any compile failure: no BF16 batches here
            _BF16_OK.append(False)
    return _BF16_OK[0]


@njit(cache=True, parallel=True)
def gemm(w, x, out, w8):
    """out[t, r] = tinyBLAS of weight row r with activation row t: both fp16 bits (uint16) or both float32,
    C-contiguous, rows of n values with n % 16 == 0 (AVX-512 build), or n % 8 == 0 with w8 (AVX2 build, 8 lanes)."""
    r_n, n = w.shape
    m = x.shape[0]
    for task in prange((r_n + 15) // 16):
        for t in range(m):
            for r in range(task * 16, min(r_n, task * 16 + 16)):
                if w8:
                    out[t, r] = dot8(w, r * w.strides[0], x, t * x.strides[0], n)
                else:
                    out[t, r] = dot16(w, r * w.strides[0], x, t * x.strides[0], n)
