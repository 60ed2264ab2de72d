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

from engine.kernels.activations import f32_to_f16, fma32, njit, prange

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
_POW2 = np.array([2.0**k for k in range(-192, 193)], np.float64)  # 2^n for the scalef step, |n| <= 192


@njit(cache=True, forceinline=True)
def v_expf1(x):
    """One lane of ggml_v_expf (AVX-512): see engine.ops.ggml_math.v_expf."""
    z = fma32(x, _LOG2E, _R)
    n = z - _R
    b = fma32(-n, _LN2_LO, fma32(-n, _LN2_HI, x))
    u = b * b
    j = fma32(fma32(fma32(_P0, b, _P1), u, fma32(_P2, b, _P3)), u, fma32(_P4, b, _ONE))
    if abs(n) > 192:
        return _ZERO if n <= 0 else _INF
    if math.isnan(n):  # NaN in, NaN out
        return j
    return np.float32(np.float64(j) * _POW2[int(n) + 192])  # exact in double, rounded once (as VSCALEFPS)


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


@njit(cache=True, parallel=True)
def soft_max_chunks(d, e, sums, body):
    """e[:, :body] = v_expf(d[:, :body]); sums[r] = the double sum of each 16-float chunk's
    _mm512_reduce_add_ps, chunk after chunk (ggml_vec_soft_max_f32 without its scalar tail)."""
    for r in prange(d.shape[0]):
        total = 0.0
        for c in range(0, body, 16):
            for k in range(16):
                e[r, c + k] = v_expf1(d[r, c + k])
            total += np.float64(reduce16(e[r], c))
        sums[r] = total


@njit(cache=True, parallel=True)
def swiglu_chunks(g, u, out, body):
    """out[:, :body] = x / (1 + v_expf(0 - x)) * up: ggml_v_silu then the multiply, lane by lane."""
    for r in prange(g.shape[0]):
        for i in range(body):
            x = g[r, i]
            out[r, i] = (x / (_ONE + v_expf1(_ZERO - x))) * u[r, i]


# the same loops on the calling thread, for the few rows of a decode step (thread start-up costs more than the work)
soft_max_chunks_serial = njit(cache=True)(soft_max_chunks.py_func)
swiglu_chunks_serial = njit(cache=True)(swiglu_chunks.py_func)
SERIAL_ELEMENTS = 1 << 15  # below this many elements a call runs serially


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
        total = 0.0
        for i in range(n):
            v = x[r, i] * x[r, i]
            total += np.float64(v)
        s = _ONE / np.sqrt(np.float32(total / n) + eps)
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
