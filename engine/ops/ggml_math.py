"""Elementary functions with the exact bits ggml-cpu gets from them on x86-64 Linux (AVX-512 build, glibc).

ggml's non-matrix ops call two kinds of elementary functions:

- its own SIMD exponential, ggml_v_expf (vec.h): a degree-5 polynomial on the reduced argument built from
  fused multiply-adds, used for 16-float chunks in SiLU and softmax (AVX-512 build: scaled with
  _mm512_scalef_ps) or 8-float ones (AVX2 build: scaled through the exponent bits, `v_expf8`);
- the C library's float functions: expf for leftover elements, cosf/sinf for the RoPE table, tanhf
  for the GELU table, logf in softplus (the DeltaNet layers' decay gate). glibc (2.28 and later, the ARM optimized-routines algorithms, selected at run
  time in their FMA-compiled variants on CPUs with FMA) does not round these correctly: measured on
  glibc 2.36, cosf and sinf differ from the correctly rounded value on about 1.3% of RoPE angles,
  expf on about 0.01% of arguments. So `cosf`, `sinf`, `expf` and `logf` below follow glibc's algorithms step
  by step in double precision, fused multiply-adds included (`fma64`, exact), and agree with the
  library on every input tested (6.8 million angles, 5 million exponents; see
  tests/engine/models/test_ggml_ops.py). tanhf is only read through the fp16 GELU table, where the
  correctly rounded tanh gives the same table as glibc's (every one of the 65,536 entries).

Everything is whole-array NumPy on float32 / float64; no function here is hot (RoPE tables are per
position, the rest is per activation element).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.kernels.legacy.ref import fma32_ref

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

__all__ = ["cosf", "expf", "fma32", "fma64", "logf", "sinf", "v_expf", "v_expf8"]

fma32 = fma32_ref  # float32 a * b + c rounded once (as _mm512_fmadd_ps / vfmadd231ss)


# ---- exact float64 fused multiply-add


def _split(a: F64) -> tuple[F64, F64]:
    """Veltkamp's split of a into two 26-bit halves, a == hi + lo exactly."""
    c = a * 134217729.0  # 2^27 + 1
    hi = c - (c - a)
    return hi, a - hi


def _two_sum(a: F64, b: F64) -> tuple[F64, F64]:
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fma64(a: npt.ArrayLike, b: npt.ArrayLike, c: npt.ArrayLike) -> F64:
    """float64 a * b + c rounded once (vfmadd on doubles), for finite operands away from overflow/underflow.

    Boldo and Melquiond's emulation: a * b split exactly into uh + ul (Dekker), c + uh exactly into
    th + tl (TwoSum), the tail tl + ul rounded to odd, then th + tail rounded to nearest.
    """
    a, b, c = (np.asarray(v, np.float64) for v in (a, b, c))
    with np.errstate(invalid="ignore", over="ignore"):
        uh = a * b
        ah, al = _split(a)
        bh, bl = _split(b)
        ul = ((ah * bh - uh) + ah * bl + al * bh) + al * bl
        th, tl = _two_sum(c, uh)
        v, err = _two_sum(tl, ul)
        bits = np.atleast_1d(v).view(np.int64).copy()
        odd = (np.atleast_1d(err) != 0) & ((bits & 1) == 0) & np.isfinite(np.atleast_1d(v))
        bits += np.where(odd, np.where(np.signbit(np.atleast_1d(err)) == np.signbit(np.atleast_1d(v)), 1, -1), 0)
        return (th + bits.view(np.float64).reshape(np.shape(v))).astype(np.float64)


# ---- ggml_v_expf (vec.h): the AVX-512 variant, and the AVX2 one

_R = np.float32(float.fromhex("0x1.8p23"))
_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
_P = [np.float32(float.fromhex(h)) for h in ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2",
                                              "0x1.ffffecp-1")]


def v_expf(x: npt.ArrayLike, lanes: int = 16) -> F32:
    """exp(x) per element as ggml_v_expf computes each lane (lanes are independent): the AVX-512 variant for
    lanes=16, the AVX2 one (v_expf8) for lanes=8.

    n = round(x / ln2) by the 1.5 * 2^23 trick, b = x - n ln2 in two fused steps, a polynomial in b and
    b^2 from fused multiply-adds, then scalef by 2^n (exact in float64, rounded once to float32, as
    VSCALEFPS rounds, subnormals included). |n| > 192 gives 0 (x < 0) or +inf.
    """
    if lanes == 8:
        return v_expf8(x)
    x = np.asarray(x, np.float32)
    one = np.float32(1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        z = fma32(x, _LOG2E, _R)
        n = (z - _R).astype(np.float32)
        b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
        u = (b * b).astype(np.float32)
        j = fma32(fma32(fma32(_P[0], b, _P[1]), u, fma32(_P[2], b, _P[3])), u, fma32(_P[4], b, one))
        res = (j.astype(np.float64) * np.exp2(np.where(np.abs(n) <= 192, n, 0).astype(np.float64))).astype(np.float32)
        out = np.where(np.abs(n) > 192, np.where(n <= 0, np.float32(0.0), np.float32(np.inf)), res)
    return out.astype(np.float32).reshape(np.shape(x))


def v_expf8(x: npt.ArrayLike) -> F32:
    """exp(x) per element as the AVX2 ggml_v_expf computes each lane of an 8-float chunk.

    The same n and b as the AVX-512 variant, but the polynomial ends in a rounded product p4 * b instead of
    fma(p4, b, 1), and 2^n is built in the exponent bits (k = (bits(z) << 23) + bits(1.0f)), the result being
    fma(j, k, k). Where |n| > 126 the scale is split in two factors s1 * (s2 + s2 j), and |n| > 192 gives s1 * s1
    (0 or +inf). All integer steps wrap as 32-bit lanes do.
    """
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        z = np.asarray(fma32(x, _LOG2E, _R), np.float32)
        n = (z - _R).astype(np.float32)
        b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
        e = np.atleast_1d(z).view(np.uint32) << np.uint32(23)
        k = (e + np.uint32(0x3F800000)).view(np.float32).reshape(np.shape(n))
        u = (b * b).astype(np.float32)
        j = fma32(fma32(fma32(_P[0], b, _P[1]), u, fma32(_P[2], b, _P[3])), u, (_P[4] * b).astype(np.float32))
        fast = fma32(j, k, k)
        g = np.where(np.atleast_1d(n) <= 0, np.uint32(0x82000000), np.uint32(0)).astype(np.uint32)
        s1 = (g + np.uint32(0x7F000000)).view(np.float32).reshape(np.shape(n))
        s2 = (e - g).view(np.float32).reshape(np.shape(n))
        slow = np.where(np.abs(n) > 192, (s1 * s1).astype(np.float32), (fma32(s2, j, s2) * s1).astype(np.float32))
        out = np.where(np.abs(n) > 126, slow, fast)
    return np.asarray(out, np.float32).reshape(np.shape(x))


# ---- glibc expf (sysdeps/ieee754/flt-32/e_expf.c, EXP2F_TABLE_BITS = 5), FMA variant

_EXP2F_TAB = np.array([
    0x3FF0000000000000, 0x3FEFD9B0D3158574, 0x3FEFB5586CF9890F, 0x3FEF9301D0125B51,
    0x3FEF72B83C7D517B, 0x3FEF54873168B9AA, 0x3FEF387A6E756238, 0x3FEF1E9DF51FDEE1,
    0x3FEF06FE0A31B715, 0x3FEEF1A7373AA9CB, 0x3FEEDEA64C123422, 0x3FEECE086061892D,
    0x3FEEBFDAD5362A27, 0x3FEEB42B569D4F82, 0x3FEEAB07DD485429, 0x3FEEA47EB03A5585,
    0x3FEEA09E667F3BCD, 0x3FEE9F75E8EC5F74, 0x3FEEA11473EB0187, 0x3FEEA589994CCE13,
    0x3FEEACE5422AA0DB, 0x3FEEB737B0CDC5E5, 0x3FEEC49182A3F090, 0x3FEED503B23E255D,
    0x3FEEE89F995AD3AD, 0x3FEEFF76F2FB5E47, 0x3FEF199BDD85529C, 0x3FEF3720DCEF9069,
    0x3FEF5818DCFBA487, 0x3FEF7C97337B9B5F, 0x3FEFA4AFA2A490DA, 0x3FEFD0765B6E4540,
], dtype=np.uint64)  # bits of 2^(i/32) less i << 47
_EXP_SHIFT = float.fromhex("0x1.8p+52")
_EXP_INVLN2N = float.fromhex("0x1.71547652b82fep+0") * 32
_EXP_C = (float.fromhex("0x1.c6af84b912394p-5") / 32**3, float.fromhex("0x1.ebfce50fac4f3p-3") / 32**2,
          float.fromhex("0x1.62e42ff0c52d6p-1") / 32)


def expf(x: npt.ArrayLike) -> F32:
    """glibc's expf per element: exp(x) = 2^(k/32) * p(r) in double, rounded once to float."""
    x = np.asarray(x, np.float32)
    xd = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        kd = fma64(_EXP_INVLN2N, xd, _EXP_SHIFT)  # GCC fuses z = InvLn2N * x into both of its uses
        ki = np.where(np.isfinite(kd), kd, 0).view(np.uint64)
        kd = kd - _EXP_SHIFT
        r = fma64(_EXP_INVLN2N, xd, -kd)
        s = (_EXP2F_TAB[ki % np.uint64(32)] + (ki << np.uint64(47))).view(np.float64)
        y = fma64(fma64(_EXP_C[0], r, _EXP_C[1]), r * r, fma64(_EXP_C[2], r, 1.0)) * s
        out = y.astype(np.float32)
    big = ((x.view(np.uint32) >> 20) & 0x7FF) >= 0x42B  # |x| >= 88, inf or NaN: the special cases
    if big.any():
        xb = x[big]
        special = np.where(xb > np.float32(float.fromhex("0x1.62e42ep6")), np.float32(np.inf),
                           np.where(xb < np.float32(-float.fromhex("0x1.9fe368p6")), np.float32(0.0), out[big]))
        out[big] = np.where(np.isnan(xb), xb, special)
    return out.reshape(np.shape(x))


# ---- glibc cosf / sinf (s_cosf.c, s_sinf.c, s_sincosf.h, sincosf_poly.h), FMA variant

_SC_HPI_INV = float.fromhex("0x1.45F306DC9C883p+23")  # 2/pi * 2^24
_SC_HPI = float.fromhex("0x1.921FB54442D18p0")
_SC_C = tuple(float.fromhex(h) for h in ("0x1p0", "-0x1.ffffffd0c621cp-2", "0x1.55553e1068f19p-5",
                                          "-0x1.6c087e89a359dp-10", "0x1.99343027bf8c3p-16"))
_SC_S = tuple(float.fromhex(h) for h in ("-0x1.555545995a603p-3", "0x1.1107605230bc4p-7", "-0x1.994eb3774cf24p-13"))
_SC_SIGN = np.array([1.0, -1.0, -1.0, 1.0])
_SC_PI63 = float.fromhex("0x1.921FB54442D18p-62")
_INV_PIO4 = np.array([
    0xA2, 0xA2F9, 0xA2F983, 0xA2F9836E, 0xF9836E4E, 0x836E4E44, 0x6E4E4415, 0x4E441529,
    0x441529FC, 0x1529FC27, 0x29FC2757, 0xFC2757D1, 0x2757D1F5, 0x57D1F534, 0xD1F534DD, 0xF534DDC0,
    0x34DDC0DB, 0xDDC0DB62, 0xC0DB6295, 0xDB629599, 0x6295993C, 0x95993C43, 0x993C4390, 0x3C439041,
], dtype=np.uint64)  # 4/pi, 8 new bits per entry


def _sc_poly(x: F64, x2: F64, negate_cos: npt.NDArray[np.bool_], use_cos: npt.NDArray[np.bool_]) -> F64:
    """sinf_poly: the sine polynomial, or the cosine one (negated in glibc's second table) where use_cos."""
    s1 = fma64(x2, _SC_S[2], _SC_S[1])
    x3 = x * x2
    sine = fma64(x3 * x2, s1, fma64(x3, _SC_S[0], x))
    sg = np.where(negate_cos, -1.0, 1.0)
    x4 = x2 * x2
    c2 = fma64(x2, sg * _SC_C[4], sg * _SC_C[3])
    c = fma64(x4, sg * _SC_C[2], fma64(x2, sg * _SC_C[1], sg * _SC_C[0]))
    cosine = fma64(x4 * x2, c2, c)
    return np.where(use_cos, cosine, sine)


def _reduce_large(xi: npt.NDArray[np.uint32]) -> tuple[F64, npt.NDArray[np.int64]]:
    """reduce_large: |x| >= 120 reduced modulo pi/2 with 4/pi to 192 bits, in integers (32 x 96 -> 128 bits)."""
    xi = xi.astype(np.uint64)
    idx = (xi >> np.uint64(26)) & np.uint64(15)
    m = ((xi & np.uint64(0xFFFFFF)) | np.uint64(0x800000)) << ((xi >> np.uint64(23)) & np.uint64(7))
    res0 = (m * _INV_PIO4[idx]) & np.uint64(0xFFFFFFFF)  # a 32-bit product in C
    res1 = m * _INV_PIO4[idx + 4]
    res2 = m * _INV_PIO4[idx + 8]
    res0 = ((res2 >> np.uint64(32)) | (res0 << np.uint64(32))) + res1
    n = (res0 + np.uint64(1 << 61)) >> np.uint64(62)
    res0 = res0 - (n << np.uint64(62))
    return res0.view(np.int64).astype(np.float64) * _SC_PI63, n.astype(np.int64)


def _sincosf(y: npt.ArrayLike, cosine: bool) -> F32:
    y = np.ascontiguousarray(y, np.float32)
    shape = y.shape
    y = y.reshape(-1)
    yi = y.view(np.uint32)
    top = (yi >> 20) & 0x7FF
    x = y.astype(np.float64)
    out = np.full(y.shape, np.nan, np.float64)
    small = top < 0x3F4  # |y| < 0.75 (abstop12 of pi/4 as a float)
    fast = ~small & (top < 0x42F)  # |y| < 120
    large = ~small & ~fast & (top < 0x7F8)  # finite
    with np.errstate(invalid="ignore", over="ignore"):
        if small.any():
            xs = x[small]
            out[small] = _sc_poly(xs, xs * xs, np.zeros(xs.shape, bool), np.full(xs.shape, cosine))
        if fast.any():
            xf = x[fast]
            n = ((xf * _SC_HPI_INV).astype(np.int32) + np.int32(0x800000)) >> 24  # scaled round to nearest
            n = n.astype(np.int64)
            r = fma64(-n.astype(np.float64), _SC_HPI, xf)
            quad = (n ^ 1) if cosine else n
            out[fast] = _sc_poly(r * _SC_SIGN[n & 3], r * r, (n & 2) != 0, (quad & 1) != 0)
        if large.any():
            r, n = _reduce_large(yi[large])
            q = n + (yi[large] >> 31).astype(np.int64)
            quad = (n ^ 1) if cosine else n
            out[large] = _sc_poly(r * _SC_SIGN[q & 3], r * r, (q & 2) != 0, (quad & 1) != 0)
    res = out.astype(np.float32)
    tiny = top < 0x398  # |y| < 2^-12: cos = 1, sin = y
    res[tiny] = np.float32(1.0) if cosine else y[tiny]
    return res.reshape(shape)


def cosf(x: npt.ArrayLike) -> F32:
    """glibc's cosf per element (not always correctly rounded; this reproduces its rounding)."""
    return _sincosf(x, True)


def sinf(x: npt.ArrayLike) -> F32:
    """glibc's sinf per element."""
    return _sincosf(x, False)


# ---- glibc logf (e_logf.c, e_logf_data.c: ARM optimized-routines), FMA variant; ULP error up to 0.82

_LOGF_TAB = np.array([float.fromhex(h) for h in (
    "0x1.661ec79f8f3bep+0", "-0x1.57bf7808caadep-2", "0x1.571ed4aaf883dp+0", "-0x1.2bef0a7c06ddbp-2",
    "0x1.49539f0f010bp+0", "-0x1.01eae7f513a67p-2", "0x1.3c995b0b80385p+0", "-0x1.b31d8a68224e9p-3",
    "0x1.30d190c8864a5p+0", "-0x1.6574f0ac07758p-3", "0x1.25e227b0b8eap+0", "-0x1.1aa2bc79c81p-3",
    "0x1.1bb4a4a1a343fp+0", "-0x1.a4e76ce8c0e5ep-4", "0x1.12358f08ae5bap+0", "-0x1.1973c5a611cccp-4",
    "0x1.0953f419900a7p+0", "-0x1.252f438e10c1ep-5", "0x1p+0", "0x0p+0",
    "0x1.e608cfd9a47acp-1", "0x1.aa5aa5df25984p-5", "0x1.ca4b31f026aap-1", "0x1.c5e53aa362eb4p-4",
    "0x1.b2036576afce6p-1", "0x1.526e57720db08p-3", "0x1.9c2d163a1aa2dp-1", "0x1.bc2860d22477p-3",
    "0x1.886e6037841edp-1", "0x1.1058bc8a07ee1p-2", "0x1.767dcf5534862p-1", "0x1.4043057b6ee09p-2")]).reshape(16, 2)
_LOGF_LN2 = float.fromhex("0x1.62e42fefa39efp-1")
_LOGF_A = tuple(float.fromhex(h) for h in ("-0x1.00ea348b88334p-2", "0x1.5575b0be00b6ap-2", "-0x1.ffffef20a4123p-2"))


def logf(x: npt.ArrayLike) -> F32:
    """glibc's logf per element: x = 2^k z, log(x) = log1p(z / c - 1) + log(c) + k ln2 with c from a 16-entry
    table, the polynomial in double with GCC's fused multiply-adds, rounded once to float."""
    x = np.asarray(x, np.float32)
    ix = np.atleast_1d(x).view(np.uint32).astype(np.int64)
    sub = (ix > 0) & (ix < 0x00800000)  # subnormals: scaled by 2^23, the exponent taken back
    if sub.any():
        with np.errstate(over="ignore"):
            scaled = (np.atleast_1d(x) * np.float32(2.0**23)).view(np.uint32).astype(np.int64)
        ix = np.where(sub, scaled - (23 << 23), ix)
    tmp = (ix - 0x3F330000) & 0xFFFFFFFF
    i = (tmp >> 19) % 16
    k = np.where(tmp >= 1 << 31, tmp - (1 << 32), tmp) >> 23  # the arithmetic shift of a signed 32-bit value
    iz = (ix - (tmp & 0xFF800000)) & 0xFFFFFFFF
    z = iz.astype(np.uint32).view(np.float32).astype(np.float64)
    invc, logc = _LOGF_TAB[i, 0], _LOGF_TAB[i, 1]
    with np.errstate(invalid="ignore", over="ignore"):
        r = fma64(z, invc, -1.0)
        y0 = fma64(k.astype(np.float64), _LOGF_LN2, logc)
        r2 = r * r
        y = fma64(_LOGF_A[1], r, _LOGF_A[2])
        y = fma64(_LOGF_A[0], r2, y)
        y = fma64(y, r2, y0 + r)
        out = y.astype(np.float32)
    xf = np.atleast_1d(x)
    out = np.where(xf == np.float32(1.0), np.float32(0.0), out)
    out = np.where(xf == 0, np.float32(-np.inf), out)
    out = np.where(np.isposinf(xf), xf, out)
    out = np.where((xf < 0) | np.isnan(xf), np.float32(np.nan), out)
    return out.astype(np.float32).reshape(np.shape(x))
