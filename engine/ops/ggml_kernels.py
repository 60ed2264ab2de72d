"""Compiled twins of the two hot loops of engine.ops.ggml: ggml_v_expf in softmax and in SiLU.

The NumPy versions in ggml_ops / ggml_math are the reference and make the same bits; they emulate each
float32 fused multiply-add in float64 (exact but some 50 ns per element), which for a 512-token prefill
is a second per layer in softmax alone. These run the same operations with the hardware's fma
(llvm.fma, `engine.kernels.activations.fma32`) and the scalef step as an exact multiplication by 2^n in double.
Used when the compiled kernels are (engine.kernels.dispatch.compiled()); tests hold both to the taps.
"""
from __future__ import annotations

import math

import numpy as np

from engine.kernels.activations import bits_f32, bits_f64, f32_bits, f32_to_f16, fma32, njit, prange
from engine.kernels.variants import by_lane_order, lane_variants, serial_until_late

_R = np.float32(float.fromhex("0x1.8p23"))
_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))
_LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
_P0 = np.float32(float.fromhex("0x1.0e4020p-7"))
_P1 = np.float32(float.fromhex("0x1.573e2ep-5"))
_P2 = np.float32(float.fromhex("0x1.555e66p-3"))
_P3 = np.float32(float.fromhex("0x1.fffdb6p-2"))
_P4 = np.float32(float.fromhex("0x1.ffffecp-1"))
_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)
_INF = np.float32(np.inf)
_R_BITS = np.int64(0x4B400000)  # the bits of _R: z's bits minus these are n while |n| < 2^22


@njit(cache=True, forceinline=True)
def v_expf1(x):
    """One lane of ggml_v_expf (AVX-512): see engine.ops.ggml_math.v_expf. The scalef step is an exact
    multiplication by 2^n in double, 2^n built from n's bits (z holds n in its low mantissa bits), and the range
    checks are selects: no table, no branch, so a loop of lanes compiles to vector code."""
    z = fma32(x, _LOG2E, _R)
    n = z - _R
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    u = b * b
    j = fma32(fma32(fma32(_P0, b, _P1), u, fma32(_P2, b, _P3)), u, fma32(_P4, b, _ONE))
    k = min(max(np.int64(f32_bits(z)) - _R_BITS, np.int64(-193)), np.int64(193))  # n, for |n| <= 192
    r = np.float32(np.float64(j) * bits_f64(np.uint64(k + 1023) << np.uint64(52)))  # rounded once (as VSCALEFPS)
    r = (_ZERO if n <= 0 else _INF) if abs(n) > 192 else r
    return j if n != n else r  # NaN in, NaN out


_MASK32 = np.uint64(0xFFFFFFFF)


@njit(cache=True, forceinline=True)
def _u32(v):
    """The low 32 bits of an integer (numba widens integer arithmetic; a 32-bit lane wraps)."""
    return np.uint32(np.uint64(v) & _MASK32)


@njit(cache=True, forceinline=True)
def v_expf8_1(x):
    """One lane of the AVX2 ggml_v_expf: see engine.ops.ggml_math.v_expf8."""
    z = fma32(x, _LOG2E, _R)
    n = z - _R
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    e = _u32(np.uint64(f32_bits(z)) << np.uint64(23))
    u = b * b
    j = fma32(fma32(fma32(_P0, b, _P1), u, fma32(_P2, b, _P3)), u, _P4 * b)
    if not abs(n) > 126:  # NaN too: the compare is ordered
        k = bits_f32(_u32(np.uint64(e) + np.uint64(0x3F800000)))
        return fma32(j, k, k)
    g = np.uint64(0x82000000) if n <= 0 else np.uint64(0)
    s1 = bits_f32(_u32(g + np.uint64(0x7F000000)))
    if abs(n) > 192:
        return s1 * s1
    s2 = bits_f32(_u32(np.uint64(e) - g))
    return fma32(s2, j, s2) * s1


v_expf_lane = by_lane_order(v_expf8_1, v_expf1)
v_expf_lane.__doc__ = """v_expf_lane(x, w8): one lane of ggml_v_expf of the AVX2 build (w8) or the AVX-512 one."""


@njit(cache=True, forceinline=True)
def silu_lane(x, w8):
    """One lane of ggml_v_silu: x / (1 + v_expf(0 - x)), the AVX2 build's v_expf with w8."""
    return x / (_ONE + v_expf_lane(_ZERO - x, w8))


@njit(cache=True, forceinline=True)
def rms_scale(x, o, n, eps):
    """ggml_rms_norm's 1.0f / sqrtf(mean + eps) for x[o:o + n]: the float32 squares summed in double one after
    another, the mean rounded to float."""
    total = 0.0
    for i in range(o, o + n):
        v = x[i] * x[i]
        total += np.float64(v)
    return _ONE / np.sqrt(np.float32(total / n) + eps)


@njit(cache=True)
def tanhf_flat(x, out):
    """out = tanhf(x) elementwise on float32 (1-D): the C library's tanhf, which ggml_vec_tanh_f32 calls
    (NumPy's own float32 tanh differs from it in the last bit for about a third of the values)."""
    for i in range(x.shape[0]):
        out[i] = np.tanh(x[i])


@njit(cache=True)
def expf_flat(x, out):
    """out = expf(x) elementwise on float32 (1-D): the C library's expf, which ggml's scalar code calls (numba's
    float32 exp is that call; engine.ops.ggml_math.expf is its NumPy twin)."""
    for i in range(x.shape[0]):
        out[i] = np.exp(x[i])


@njit(cache=True)
def swiglu_oai_flat(g, u, alpha, limit, out):
    """ggml_compute_forward_swiglu_oai_f32 on float32 (1-D): x = std::min(g, limit), y = std::clamp(u, -limit,
    limit), x / (1 + expf(alpha * -x)) * (y + 1), with the C library's expf (numba's float32 exp calls it)."""
    for i in range(g.shape[0]):
        x = g[i]
        x = limit if limit < x else x
        y = u[i]
        y = -limit if y < -limit else (limit if limit < y else y)
        out[i] = (x / (_ONE + np.exp(alpha * -x))) * (y + _ONE)


@njit(cache=True, forceinline=True)
def reduce16(a, o):
    """_mm512_reduce_add_ps of a[o:o + 16] in GCC's order: halves added, 8 -> 4 -> 2 -> 1."""
    t0, t1, t2, t3 = a[o] + a[o + 8], a[o + 1] + a[o + 9], a[o + 2] + a[o + 10], a[o + 3] + a[o + 11]
    t4, t5, t6, t7 = a[o + 4] + a[o + 12], a[o + 5] + a[o + 13], a[o + 6] + a[o + 14], a[o + 7] + a[o + 15]
    u0, u1, u2, u3 = t0 + t4, t1 + t5, t2 + t6, t3 + t7
    return (u0 + u2) + (u1 + u3)


@njit(cache=True, forceinline=True)
def hsum8(a, o):
    """The AVX2 build's horizontal sum of a[o:o + 8] (tinyBLAS's hsum, soft_max's chunk sum): the two 128-bit halves
    added, then movehl and movehdup: (t0 + t2) + (t1 + t3) with t_k = a[k] + a[k + 4]."""
    t0, t1, t2, t3 = a[o] + a[o + 4], a[o + 1] + a[o + 5], a[o + 2] + a[o + 6], a[o + 3] + a[o + 7]
    return (t0 + t2) + (t1 + t3)


reduce_lanes = by_lane_order(hsum8, reduce16)
reduce_lanes.__doc__ = """reduce_lanes(a, o, w8): one register's horizontal sum at a[o]: hsum8 (AVX2 build, w8) or
reduce16 (AVX-512)."""


@njit(cache=True, forceinline=True)
def hsum8_columns(a, dst):
    """dst[c] = hsum8's order over a[0:8, c] for every column c; a is overwritten."""
    d = a.shape[1]
    for k in range(4):
        for c in range(d):
            a[k, c] = a[k, c] + a[k + 4, c]
    for c in range(d):
        dst[c] = (a[0, c] + a[2, c]) + (a[1, c] + a[3, c])


@njit(cache=True, forceinline=True)
def reduce16_columns(a, dst):
    """dst[c] = _mm512_reduce_add_ps of a[0:16, c] for every column c (GCC's order, as reduce16), all columns at
    once; a is overwritten. The V*w products keep one 16-lane accumulator per output in a column of a."""
    d = a.shape[1]
    for k in range(8):
        for c in range(d):
            a[k, c] = a[k, c] + a[k + 8, c]
    for k in range(4):
        for c in range(d):
            a[k, c] = a[k, c] + a[k + 4, c]
    for c in range(d):
        dst[c] = (a[0, c] + a[2, c]) + (a[1, c] + a[3, c])


reduce_columns = by_lane_order(hsum8_columns, reduce16_columns)
reduce_columns.__doc__ = """reduce_columns(a, dst, w8): dst[c] = one register's horizontal sum of a[0:lanes, c] for
every column (hsum8_columns with w8, else reduce16_columns); a is overwritten."""


W8 = False  # the AVX2 build's order: True in the [True] variants below (lane_variants)


def _soft_max_chunks(d, e, sums, body):
    """e[:, :body] = v_expf(d[:, :body]); sums[r] = the double sum of each 16-float chunk's
    _mm512_reduce_add_ps, chunk after chunk (ggml_vec_soft_max_f32 without its scalar tail); with W8 the AVX2
    build's: 8-float chunks, its v_expf and hsum8."""
    lanes = 8 if W8 else 16
    for r in prange(d.shape[0]):
        total = 0.0
        for c in range(0, body, lanes):
            for k in range(lanes):
                e[r, c + k] = v_expf_lane(d[r, c + k], W8)
            total += np.float64(reduce_lanes(e[r], c, W8))
        sums[r] = total


def _swiglu_chunks(g, u, out, body):
    """out[:, :body] = x / (1 + v_expf(0 - x)) * up: ggml_v_silu then the multiply, lane by lane (the AVX2
    build's v_expf with W8)."""
    for r in prange(g.shape[0]):
        for i in range(body):
            out[r, i] = silu_lane(g[r, i], W8) * u[r, i]


def _silu_chunks(g, out, body):
    """out[:, :body] = x / (1 + v_expf(0 - x)): ggml_v_silu lane by lane (ggml_silu on a tensor's rows)."""
    for r in prange(g.shape[0]):
        for i in range(body):
            out[r, i] = silu_lane(g[r, i], W8)


# {w8: kernel} in each build's order, on numba's threads and (for the few rows of a decode step, where starting
# threads costs more than the work) on the calling one
soft_max_chunks = lane_variants(_soft_max_chunks, cache=True, parallel=True)
# error_model="numpy": IEEE division (no zero check), which lets LLVM turn a row of lanes into vector code
swiglu_chunks = lane_variants(_swiglu_chunks, cache=True, parallel=True, error_model="numpy")
soft_max_chunks_serial = lane_variants(_soft_max_chunks, "serial", cache=True)
swiglu_chunks_serial = lane_variants(_swiglu_chunks, "serial", cache=True, error_model="numpy")
silu_chunks = lane_variants(_silu_chunks, cache=True, parallel=True, error_model="numpy")
silu_chunks_serial = lane_variants(_silu_chunks, "serial", cache=True, error_model="numpy")
SERIAL_ELEMENTS = 1 << 15  # below this many elements a call runs serially


def load_parallel(w8: bool) -> None:
    """Load the parallel chunk kernels of one build's order (from numba's cache, else compile them) on a few floats.
    A short warm-up prompt runs the serial ones; without this a chat's first long prompt would load these and so
    bring LLVM's pages back (engine.kernels.pages.release_libraries: ~50 MiB resident again). The caller holds
    KERNEL_LOCK."""
    a = np.zeros((1, 16), np.float32)
    swiglu_chunks[w8](a, a, np.empty_like(a), 16)
    silu_chunks[w8](a, np.empty_like(a), 16)
    soft_max_chunks[w8](a, np.empty_like(a), np.empty(1, np.float64), 16)


@njit(cache=True)
def rope_rows(x, cos, sin, neox, out):
    """ggml's rotate_pairs on x (R, T, d) in place of out (a copy of x): fma(x0, c, -(x1 s)), fma(x0, s, x1 c)."""
    n = cos.shape[1]
    for r in range(x.shape[0]):
        for t in range(x.shape[1]):
            for i in range(n):
                a, b = (i, i + n) if neox else (2 * i, 2 * i + 1)
                x0, x1 = x[r, t, a], x[r, t, b]
                c, s = cos[t, i], sin[t, i]
                out[r, t, a] = fma32(x0, c, -(x1 * s))
                out[r, t, b] = fma32(x0, s, x1 * c)


@njit(cache=True, parallel=True)
def rms_norm_rows(x, w, eps, out):
    """out = ggml_rms_norm(x) * w for rows x (R, n): squares summed in double one after another, mean rounded to
    float, 1.0f / sqrtf(mean + eps), then (x * scale) * w; w empty for no multiply."""
    n = x.shape[1]
    for r in prange(x.shape[0]):
        s = rms_scale(x[r], 0, n, eps)
        if w.shape[0]:
            for i in range(n):
                out[r, i] = (x[r, i] * s) * w[i]
        else:
            for i in range(n):
                out[r, i] = x[r, i] * s


@njit(cache=True, parallel=True)
def geglu_rows(g, u, table, out):
    """ggml_vec_geglu_f32 with the fp16 GELU table: 0 at gate <= -10, gate * up at >= 10, else table * up."""
    for r in prange(g.shape[0]):
        for i in range(g.shape[1]):
            x = g[r, i]
            if x <= np.float32(-10.0):
                out[r, i] = _ZERO
            elif x >= np.float32(10.0):
                out[r, i] = x * u[r, i]
            else:
                out[r, i] = table[f32_to_f16(x)] * u[r, i]


# serial copies before the late kernels (engine.kernels.precompile): the parallel loop is most of their compile
rms_norm_rows_early = serial_until_late(rms_norm_rows)
geglu_rows_early = serial_until_late(geglu_rows)
