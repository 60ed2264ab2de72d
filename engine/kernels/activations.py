"""Activation quantizers as ggml-cpu runs them: float32 rows to the bytes of a weight's vec_dot_type.

Before a product, ggml-cpu converts the activation row with the `from_float` of the weight type's
`vec_dot_type` (type_traits_cpu in ggml-cpu.c): Q8_0 for Q4_0/Q5_0/Q8_0, Q8_1 for Q4_1/Q5_1, F16
for F16, BF16 for BF16, F32 for F32. The functions here make those bytes exactly as the x86 build
(AVX2/AVX-512, F16C) of ggml-cpu does, for one row (n,) -> (nbytes,) or a batch (m, n) -> (m, nbytes):

  block_q8_0 | d:2 (fp16) | qs:32 (int8) |             quantize_row_q8_0, ggml-cpu/arch/x86/quants.c
  block_q8_1 | d:2 (fp16) | s:2 (fp16) | qs:32 (int8) | quantize_row_q8_1, s = fp16(d * sum(qs))

The x86 quantizer differs from quantize_row_q8_0_ref: it rounds half to even (_mm256_round_ps),
scales by `127/amax` instead of `1/d`, takes amax with maxps (a NaN is dropped or kept depending on
its lane), saturates through packs (a NaN becomes -128) and converts fp16 with F16C (vcvtps2ph keeps
a NaN's payload). Each quantizer has a NumPy twin (`*_ref`) making the same bytes, used when numba
is missing and by the tests.

This module also holds the numba building blocks the kernels share: fp16/bf16 conversions through
LLVM (vcvtph2ps / vcvtps2ph on F16C), a fused multiply-add (ggml's _mm256_fmadd_ps), and
`KERNEL_LOCK`. numba's default threading layer (workqueue) aborts when two Python threads run
parallel kernels at once, so a caller that may run kernels from more than one thread holds
`KERNEL_LOCK` around each call (the engine's decode and prefill loops do; one lock, never nested).
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from engine.quant.floats import f32_to_bf16_bits, f32_to_f16_bits
from engine.kernels.types import ACT_BLOCK, VEC_DOT_TYPE
from engine.quant.types import GGMLType

try:  # numba is optional: without it every kernel has a NumPy twin that makes the same numbers
    import numba
    from llvmlite import ir as _ir
    from numba.core import types as _nbt
    from numba.extending import intrinsic as _intrinsic
except ImportError:  # pragma: no cover - exercised only where numba is absent
    numba = None

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
QK = 32
Q8_0_BYTES = ACT_BLOCK[GGMLType.Q8_0][1]  # 34
Q8_1_BYTES = ACT_BLOCK[GGMLType.Q8_1][1]  # 36, sizeof(block_q8_1): the GGUF table's 40 is gguf-py's historical float d, s

HAVE_NUMBA = numba is not None
KERNEL_LOCK = threading.Lock()


if HAVE_NUMBA:
    from engine.kernels import cache_stamp

    cache_stamp.install()  # before any kernel is decorated: a cached kernel is stale when any compiled source changed
    njit = numba.njit
    prange = numba.prange

    @_intrinsic
    def fma32(typingctx, a, b, c):
        """float32 a*b + c rounded once (llvm.fma: vfmadd on FMA hardware), as _mm256_fmadd_ps."""
        sig = _nbt.float32(_nbt.float32, _nbt.float32, _nbt.float32)
        return sig, lambda context, builder, signature, args: builder.fma(*args)

    from engine.kernels.simd import float_to_half, half_to_float

    @_intrinsic
    def f16_to_f32(typingctx, h):
        """fp16 bits (uint16) to float32, exact (vcvtph2ps; integer arithmetic without F16C), as
        GGML_CPU_FP16_TO_FP32."""
        def codegen(context, builder, signature, args):
            return half_to_float(context, builder, args[0])
        return _nbt.float32(_nbt.uint16), codegen

    @_intrinsic
    def f32_to_f16(typingctx, x):
        """float32 to fp16 bits, round to nearest even (vcvtps2ph; integer arithmetic without F16C, where LLVM
        would call a helper numba's JIT lacks), as GGML_CPU_FP32_TO_FP16."""
        def codegen(context, builder, signature, args):
            return float_to_half(context, builder, args[0])
        return _nbt.uint16(_nbt.float32), codegen

    @_intrinsic
    def f32_bits(typingctx, x):
        """The bit pattern of a float32 as uint32."""
        return _nbt.uint32(_nbt.float32), lambda context, builder, signature, args: builder.bitcast(
            args[0], _ir.IntType(32))

    @_intrinsic
    def bits_f32(typingctx, u):
        """The float32 whose bit pattern is the uint32 `u`."""
        return _nbt.float32(_nbt.uint32), lambda context, builder, signature, args: builder.bitcast(
            args[0], _ir.FloatType())

    @_intrinsic
    def bits_f64(typingctx, u):
        """The float64 whose bit pattern is the uint64 `u`."""
        return _nbt.float64(_nbt.uint64), lambda context, builder, signature, args: builder.bitcast(
            args[0], _ir.DoubleType())

    # numba widens integer arithmetic to int64, which LLVM then vectorises as 64-bit lanes; these
    # keep byte work in bytes (vpand / vpsrlw on 64 lanes, vpmovzxbd + vcvtdq2ps to float)
    @_intrinsic
    def u8_and(typingctx, q, mask):
        """q & mask on uint8, staying 8-bit."""
        return _nbt.uint8(_nbt.uint8, _nbt.uint8), lambda context, builder, signature, args: builder.and_(*args)

    @_intrinsic
    def u8_shr(typingctx, q, n):
        """q >> n on uint8 (logical), staying 8-bit."""
        return _nbt.uint8(_nbt.uint8, _nbt.uint8), lambda context, builder, signature, args: builder.lshr(*args)

    @_intrinsic
    def u8_to_f32(typingctx, q):
        """A byte as an unsigned integer, to float32 (exact)."""
        return _nbt.float32(_nbt.uint8), lambda context, builder, signature, args: builder.uitofp(
            args[0], _ir.FloatType())

    @_intrinsic
    def i8_to_f32(typingctx, q):
        """A byte as a two's-complement int8, to float32 (exact)."""
        return _nbt.float32(_nbt.uint8), lambda context, builder, signature, args: builder.sitofp(
            args[0], _ir.FloatType())

    @_intrinsic
    def prefer_512(typingctx):
        """Let LLVM vectorise the calling function with 512-bit registers where the CPU has them.

        LLVM's tuning for AVX-512 CPUs prefers 256-bit vectors unless a function says otherwise (clang's
        -mprefer-vector-width=512); on CPUs without AVX-512 the attribute changes nothing. llvmlite only
        knows a fixed list of attributes, so the string attribute is added to the set directly; if that
        ever fails the kernels still compile, with 256-bit vectors.
        """
        def codegen(context, builder, signature, args):
            with contextlib.suppress(Exception):  # an optimisation hint, never an error
                set.add(builder.function.attributes, '"prefer-vector-width"="512"')
            return context.get_dummy_value()
        return _nbt.void(), codegen
else:  # pragma: no cover
    def njit(*args, **kwargs):
        """Stand-in for numba.njit: the kernels are never called without numba."""
        if args and callable(args[0]):
            return args[0]
        return lambda fn: fn

    prange = range
    fma32 = f16_to_f32 = f32_to_f16 = f32_bits = bits_f32 = None
    u8_and = u8_shr = u8_to_f32 = i8_to_f32 = prefer_512 = None


# ---- numba kernels


@njit(cache=True, forceinline=True)
def _nb_max(a, b):
    """maxps / maxss: `a > b ? a : b`, so a NaN in either operand returns b (unlike max())."""
    return a if a > b else b  # noqa: FURB136


@njit(cache=True, forceinline=True)
def _nb_lane_absmax(x, o, j):
    """Lane j of the running maxps over the four 8-float vectors of the block at x[o]."""
    m = abs(x[o + j])
    m = _nb_max(m, abs(x[o + 8 + j]))
    m = _nb_max(m, abs(x[o + 16 + j]))
    return _nb_max(m, abs(x[o + 24 + j]))


@njit(cache=True, forceinline=True)
def _nb_absmax_x86(x, o):
    """amax of x[o:o+32] in quantize_row_q8_0's order: 8 lanes over 4 vectors, then the 8 -> 1 tree."""
    # _mm_max_ps(high half, low half); lanes as np.int64, not literals, so that one specialisation serves them all
    m0 = _nb_max(_nb_lane_absmax(x, o, np.int64(4)), _nb_lane_absmax(x, o, np.int64(0)))
    m1 = _nb_max(_nb_lane_absmax(x, o, np.int64(5)), _nb_lane_absmax(x, o, np.int64(1)))
    m2 = _nb_max(_nb_lane_absmax(x, o, np.int64(6)), _nb_lane_absmax(x, o, np.int64(2)))
    m3 = _nb_max(_nb_lane_absmax(x, o, np.int64(7)), _nb_lane_absmax(x, o, np.int64(3)))
    n0 = _nb_max(m0, m2)  # _mm_max_ps(max4, movehl(max4, max4))
    n1 = _nb_max(m1, m3)
    return _nb_max(n0, n1)  # _mm_max_ss(max4, movehdup(max4))


@njit(cache=True, forceinline=True)
def _nb_cvtps_epi32(v):
    """_mm256_cvtps_epi32 of an already rounded float: NaN and out-of-range give INT_MIN."""
    if v >= np.float32(-2147483648.0) and v < np.float32(2147483648.0):
        return np.int64(v)
    return np.int64(-2147483648)


@njit(cache=True)
def _nb_quantize_q8(x, out, with_sum):
    """Rows of x (m, n) to block_q8_0 (with_sum False) or block_q8_1 bytes in out (m, nbytes)."""
    m, n = x.shape
    size = Q8_1_BYTES if with_sum else Q8_0_BYTES
    head = 4 if with_sum else 2
    for i in range(m):
        xi = x[i]
        oi = out[i]
        for b in range(n // QK):
            o = b * QK
            ob = b * size
            amax = _nb_absmax_x86(xi, o)
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != np.float32(0.0) else np.float32(0.0)
            hd = f32_to_f16(d)
            oi[ob] = np.uint8(hd & 0xFF)
            oi[ob + 1] = np.uint8(hd >> 8)
            total = np.int64(0)
            for j in range(QK):
                q = _nb_cvtps_epi32(np.rint(xi[o + j] * inv))
                total += q
                q8 = min(max(q, -128), 127)  # packs_epi32 then packs_epi16 saturate
                oi[ob + head + j] = np.uint8(q8 & 0xFF)
            if with_sum:
                total = ((total + 2147483648) & 0xFFFFFFFF) - 2147483648  # int32 lanes wrap
                hs = f32_to_f16(d * np.float32(total))
                oi[ob + 2] = np.uint8(hs & 0xFF)
                oi[ob + 3] = np.uint8(hs >> 8)


@njit(cache=True)
def _nb_quantize_f16(x, out):
    """float32 (m, n) to fp16 bits (m, n), as ggml_cpu_fp32_to_fp16 (vcvtps2ph, nearest even)."""
    m, n = x.shape
    for i in range(m):
        for j in range(n):
            out[i, j] = f32_to_f16(x[i, j])


@njit(cache=True)
def _nb_quantize_bf16(x, out):
    """float32 (m, n) to bf16 bits (m, n), as ggml_compute_fp32_to_bf16 (nearest even, NaN quieted)."""
    m, n = x.shape
    for i in range(m):
        for j in range(n):
            u = f32_bits(x[i, j])
            if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
                out[i, j] = np.uint16((u >> np.uint32(16)) | np.uint32(64))
            else:
                out[i, j] = np.uint16((u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))))
                                      >> np.uint32(16))


# ---- NumPy twins: the same bytes, vectorised over blocks


def f16_bits_hw(x: npt.ArrayLike) -> npt.NDArray[np.uint16]:
    """fp16 bits as F16C's vcvtps2ph makes them: nearest even, and a NaN keeps its top payload bits."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    with np.errstate(invalid="ignore"):  # the NaN lanes are replaced below
        bits = f32_to_f16_bits(x)
    nan = ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7E00) | ((u >> np.uint32(13)) & np.uint32(0x3FF))
    return np.where(np.isnan(x), nan.astype(np.uint16), bits)


def _absmax_x86_ref(blocks: F32) -> F32:
    """(nb, 32) -> (nb,) amax in maxps order (see _nb_absmax_x86)."""
    a = np.abs(blocks).reshape(-1, 4, 8)
    m = a[:, 0]
    for v in range(1, 4):
        m = np.where(m > a[:, v], m, a[:, v])
    m4 = np.where(m[:, 4:] > m[:, :4], m[:, 4:], m[:, :4])
    n2 = np.where(m4[:, :2] > m4[:, 2:], m4[:, :2], m4[:, 2:])
    return np.where(n2[:, 0] > n2[:, 1], n2[:, 0], n2[:, 1])


def _quantize_q8_ref(x: F32, with_sum: bool) -> U8:
    """Rows (m, n) to (m, n/32 * size) block_q8_0 / block_q8_1 bytes, as _nb_quantize_q8."""
    m = x.shape[0]
    blocks = x.reshape(-1, QK)
    with np.errstate(all="ignore"):  # x86 does not trap on inf*0 or 127/0; the lanes are handled below
        amax = _absmax_x86_ref(blocks)
        d = (amax / np.float32(127.0)).astype(np.float32)
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
        v = np.rint(blocks * inv[:, None])
        in_range = (v >= np.float32(-2147483648.0)) & (v < np.float32(2147483648.0))
        q = np.where(in_range, v, np.float32(-2147483648.0)).astype(np.int64)
    head = [f16_bits_hw(d).astype("<u2").view(np.uint8).reshape(-1, 2)]
    if with_sum:
        total = q.sum(axis=1)
        total = ((total + 2**31) & 0xFFFFFFFF) - 2**31
        with np.errstate(all="ignore"):
            s = (d * total.astype(np.float32)).astype(np.float32)
        head.append(f16_bits_hw(s).astype("<u2").view(np.uint8).reshape(-1, 2))
    qs = (np.clip(q, -128, 127) & 0xFF).astype(np.uint8)
    return np.concatenate([*head, qs], axis=1).reshape(m, -1)


def quantize_q8_0_ref(x: F32) -> U8:
    """NumPy twin of quantize_q8_0 (same bytes)."""
    return _rows(x, lambda x2: _quantize_q8_ref(x2, False))


def quantize_q8_1_ref(x: F32) -> U8:
    """NumPy twin of quantize_q8_1 (same bytes)."""
    return _rows(x, lambda x2: _quantize_q8_ref(x2, True))


def quantize_f16_ref(x: F32) -> U8:
    """NumPy twin of quantize_f16 (same bytes)."""
    return _rows(x, lambda x2: f16_bits_hw(x2).astype("<u2").view(np.uint8))


def quantize_bf16_ref(x: F32) -> U8:
    """NumPy twin of quantize_bf16 (same bytes)."""
    return _rows(x, lambda x2: f32_to_bf16_bits(x2).astype("<u2").view(np.uint8))


# ---- public quantizers


def _rows(x: npt.ArrayLike, kernel: Callable[[F32], U8]) -> U8:
    """Apply a (m, n) -> (m, nbytes) kernel to a row (n,) or a batch (m, n) of float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim not in (1, 2):
        raise ValueError(f"activations must be a row (n,) or a batch (m, n), got shape {x.shape}")
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    out = kernel(x2)
    return out.reshape(-1) if x.ndim == 1 else out


def _check_blocks(x: F32) -> None:
    if x.shape[-1] % QK:
        raise ValueError(f"row size {x.shape[-1]} is not a multiple of the Q8 block size {QK}")


def _q8(x: npt.ArrayLike, with_sum: bool) -> U8:
    size = Q8_1_BYTES if with_sum else Q8_0_BYTES

    def kernel(x2: F32) -> U8:
        _check_blocks(x2)
        if not HAVE_NUMBA:
            return _quantize_q8_ref(x2, with_sum)
        out = np.empty((x2.shape[0], x2.shape[1] // QK * size), dtype=np.uint8)
        _nb_quantize_q8(x2, out, with_sum)
        return out

    return _rows(x, kernel)


def quantize_q8_0(x: npt.ArrayLike) -> U8:
    """float32 row(s) to block_q8_0 bytes, as ggml-cpu's x86 quantize_row_q8_0."""
    return _q8(x, False)


def quantize_q8_1(x: npt.ArrayLike) -> U8:
    """float32 row(s) to block_q8_1 bytes, as ggml-cpu's x86 quantize_row_q8_1."""
    return _q8(x, True)


def quantize_f16(x: npt.ArrayLike) -> U8:
    """float32 row(s) to fp16 bytes, as ggml_cpu_fp32_to_fp16 (F16C)."""
    def kernel(x2: F32) -> U8:
        if not HAVE_NUMBA:
            return quantize_f16_ref(x2)
        out = np.empty(x2.shape, dtype=np.uint16)
        _nb_quantize_f16(x2, out)
        return out.view(np.uint8)

    return _rows(x, kernel)


def quantize_bf16(x: npt.ArrayLike) -> U8:
    """float32 row(s) to bf16 bytes, as ggml_cpu_fp32_to_bf16."""
    def kernel(x2: F32) -> U8:
        if not HAVE_NUMBA:
            return quantize_bf16_ref(x2)
        out = np.empty(x2.shape, dtype=np.uint16)
        _nb_quantize_bf16(x2, out)
        return out.view(np.uint8)

    return _rows(x, kernel)


def quantize_f32(x: npt.ArrayLike) -> U8:
    """float32 row(s) as their own bytes (F32's from_float is a copy)."""
    return _rows(x, lambda x2: x2.view(np.uint8).copy())


QUANTIZERS: dict[GGMLType, Callable[[npt.ArrayLike], U8]] = {
    GGMLType.Q8_0: quantize_q8_0,
    GGMLType.Q8_1: quantize_q8_1,
    GGMLType.F16: quantize_f16,
    GGMLType.BF16: quantize_bf16,
    GGMLType.F32: quantize_f32,
}


def quantize_activation(weight_type: GGMLType | int, x: npt.ArrayLike) -> U8:
    """x quantized to the vec_dot_type of `weight_type`, the bytes ggml-cpu's products read."""
    qtype = GGMLType(int(weight_type))
    if VEC_DOT_TYPE.get(qtype) not in QUANTIZERS:
        raise ValueError(f"no activation quantizer for {qtype.name} weights here")
    return QUANTIZERS[VEC_DOT_TYPE[qtype]](x)
