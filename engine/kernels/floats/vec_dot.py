"""Compiled products of F32, F16 and BF16 weights, in the summation order of ggml-cpu's AVX-512 build.

ggml_vec_dot_f32 and ggml_vec_dot_f16 (ggml-cpu/vec.cpp, GGML_F32_STEP = 64 on AVX-512) keep four
16-float accumulators: element e of each 64-element step goes to accumulator lane e % 64 with one
fused multiply-add. At the end the four are added as (s0 + s2) + (s1 + s3) and reduced by
_mm512_reduce_add_ps (halving: 16 -> 8 -> 4 -> 2 -> 1); the n % 64 leftover elements are added one
by one, in float for F32 (product rounded, then added: no fma) and in double for F16. F16 activations are
rounded to fp16 first (vec_dot_type F16); an fp16 x fp16 product is exact in float32.

ggml_vec_dot_bf16 on AVX512_BF16 runs _mm512_dpbf16_ps on 64 elements at a time into two
16-float accumulators (the first 32 and the last 32 elements): lane l takes elements 2l and
2l + 1, the odd one first, each as an fma with bf16 inputs that are denormal read as zero and
denormal results flushed to zero (VDPBF16PS: "DAZ in, FTZ out, RNE"). The two are reduced and
added in double, then the leftovers as double products.

These orders are what this project's fixtures were made with (tools/make_kernel_fixtures.py). The AVX2 build
(GGML_F32_STEP = 32) keeps four 8-float accumulators instead, adds them the same way and reduces the one left
with two hadds: ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)). The F32 and F16 products take that order
when their step is 32 (`step`, 4 * engine.kernels.isa.lanes(); the scratch `acc` of the row functions has the
step's length). Its BF16 product (no VDPBF16PS) is a plain __m256 loop, c + x * y into four 8-float accumulators
(`_dot_bf16_row_avx2`, dot_bf16's step 32); NEON adds in other orders again.
"""
from __future__ import annotations

import numpy as np

from engine.kernels.activations import bits_f32, f16_to_f32, fma32, njit, prange, prefer_512
from engine.kernels.floats.tinyblas import dot64bf_acc, steps8, steps16
from engine.kernels.variants import specialise

STEP = 64  # GGML_F32_STEP on AVX-512: four 16-lane accumulators (32 on AVX2: four 8-lane ones)
ROWS = 16  # rows per parallel task
_FLT_MIN = np.float32(1.17549435e-38)
_O = np.int64(0)


@njit(cache=True, forceinline=True)
def _reduce16(a, o):
    """_mm512_reduce_add_ps of a[o:o+16] (GCC's order: halves added, 8 -> 4 -> 2 -> 1)."""
    t0 = a[o] + a[o + 8]
    t1 = a[o + 1] + a[o + 9]
    t2 = a[o + 2] + a[o + 10]
    t3 = a[o + 3] + a[o + 11]
    t4 = a[o + 4] + a[o + 12]
    t5 = a[o + 5] + a[o + 13]
    t6 = a[o + 6] + a[o + 14]
    t7 = a[o + 7] + a[o + 15]
    u0, u1, u2, u3 = t0 + t4, t1 + t5, t2 + t6, t3 + t7
    return (u0 + u2) + (u1 + u3)


@njit(cache=True, forceinline=True)
def _reduce_steps8(acc):
    """GGML_F32x8_REDUCE over the four accumulators acc[0:32]: (s0 + s2) + (s1 + s3), then two hadds."""
    for lane in range(8):
        acc[lane] = (acc[lane] + acc[16 + lane]) + (acc[8 + lane] + acc[24 + lane])
    t0, t1, t2, t3 = acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]
    return (t0 + t1) + (t2 + t3)


@njit(cache=True, forceinline=True)
def _reduce_steps16(acc):
    """GGML_F32x16_REDUCE over the four accumulators acc[0:64]: (s0 + s2) + (s1 + s3), then reduce16."""
    for lane in range(16):
        acc[lane] = (acc[lane] + acc[32 + lane]) + (acc[16 + lane] + acc[48 + lane])
    return _reduce16(acc, np.int64(0))


@njit(cache=True, forceinline=True)
def _reduce_steps(acc):
    """_reduce_steps16 for an acc of 64, _reduce_steps8 for one of 32."""
    return _reduce_steps8(acc) if acc.shape[0] == 32 else _reduce_steps16(acc)


@njit(cache=True, forceinline=True)
def _vector_rows(w, y, step):
    """Whether tinyblas.steps16 / steps8 can run the steps of w and y: contiguous rows, a step of 64 or 32."""
    return w.strides[0] == w.itemsize and y.strides[0] == y.itemsize and (step == 64 or step == 32)


@njit(cache=True, forceinline=True)
def _steps(w, y, body, step):
    """The first `body` elements (a multiple of the step) of w (float32 or fp16 bits) times y (float32) as vector
    code: four accumulators, one fma per element, GGML_F32x16_REDUCE (a step of 64) or GGML_F32x8_REDUCE (32)."""
    if step == 64:
        return steps16(w, _O, y, _O, np.int64(body // step))
    return steps8(w, _O, y, _O, np.int64(body // step))


@njit(cache=True, forceinline=True)
def _steps8(w, y, body, step):
    """_steps with a step of 32."""
    return steps8(w, _O, y, _O, np.int64(body // step))


@njit(cache=True, forceinline=True)
def _steps16(w, y, body, step):
    """_steps with a step of 64."""
    return steps16(w, _O, y, _O, np.int64(body // step))


# the row functions' steps and reduction: either order, by acc's length; the serial products' copies (_copies) fix one
_fixed_steps, _fixed_reduce = _steps, _reduce_steps


@njit(cache=True)
def _dot_f32_row(w, y, acc):
    """ggml_vec_dot_f32 of float32 rows w and y (n,), acc a (64,) scratch (AVX-512 order) or (32,) (AVX2)."""
    prefer_512()
    n = w.shape[0]
    step = acc.shape[0]
    body = n - n % step
    if _vector_rows(w, y, step):
        s = _fixed_steps(w, y, body, step)
    else:  # the same fmas one element at a time
        acc[:] = 0.0
        for c in range(0, body, step):
            for lane in range(step):
                acc[lane] = fma32(w[c + lane], y[c + lane], acc[lane])
        s = _fixed_reduce(acc)
    for e in range(body, n):  # vec.cpp's `sumf += x[i]*y[i]`: this build rounds the product, then adds
        s = s + w[e] * y[e]
    return s


@njit(cache=True)
def _dot_f16_row(w, y, acc):
    """ggml_vec_dot_f16 of an fp16 row w (uint16 bits) with y (the fp16 activation widened to float32); acc as
    for _dot_f32_row."""
    prefer_512()
    n = w.shape[0]
    step = acc.shape[0]
    body = n - n % step
    if _vector_rows(w, y, step):
        s = np.float64(_fixed_steps(w, y, body, step))
    else:
        acc[:] = 0.0
        for c in range(0, body, step):
            for lane in range(step):
                acc[lane] = fma32(f16_to_f32(w[c + lane]), y[c + lane], acc[lane])
        s = np.float64(_fixed_reduce(acc))
    for e in range(body, n):
        s += np.float64(f16_to_f32(w[e]) * y[e])
    return np.float32(s)


@njit(cache=True, forceinline=True)
def _bf16_daz(bits):
    """bf16 bits to float32, a denormal read as zero of its sign (DAZ of VDPBF16PS)."""
    u = np.uint32(bits) << np.uint32(16)
    if (u & np.uint32(0x7F800000)) == 0:
        u &= np.uint32(0x80000000)
    return bits_f32(u)


@njit(cache=True, forceinline=True)
def _ftz(v):
    """A denormal result flushed to zero of its sign (FTZ of VDPBF16PS)."""
    return v if abs(v) >= _FLT_MIN or v == 0 else np.float32(0.0) * v


@njit(cache=True)
def _dot_bf16_row(w, y, acc):
    """ggml_vec_dot_bf16 (AVX512_BF16 path) of bf16 rows w and y (uint16 bits), acc a (32,) scratch."""
    prefer_512()
    n = w.shape[0]
    body = n - n % STEP
    s = np.float64(0.0)
    acc[:32] = 0.0
    for c in range(0, body, STEP):
        for lane in range(32):
            e = c + 2 * lane
            a = _ftz(fma32(_bf16_daz(w[e + 1]), _bf16_daz(y[e + 1]), acc[lane]))
            acc[lane] = _ftz(fma32(_bf16_daz(w[e]), _bf16_daz(y[e]), a))
    s += np.float64(_reduce16(acc, np.int64(0)))
    s += np.float64(_reduce16(acc, np.int64(16)))
    for e in range(body, n):
        s += np.float64(_bf16(w[e]) * _bf16(y[e]))
    return np.float32(s)


@njit(cache=True)
def _dot_bf16_row_avx2(w, y, acc):
    """ggml_vec_dot_bf16 as the AVX2 build runs it (__m256 loop) on bf16 rows w and y (uint16 bits), acc a (32,)
    scratch: 32 elements a step, element e into lane e % 32 of four 8-float accumulators as c + x * y (a bf16
    product is exact in float32, so fused or not gives the same), then (c1 + c3) + (c2 + c4), the 128-bit halves
    added and (g0 + g2) + (g1 + g3); in double with the leftovers' products."""
    n = w.shape[0]
    body = n - n % 32
    acc[:32] = 0.0
    for c in range(0, body, 32):
        for lane in range(32):
            acc[lane] = acc[lane] + _bf16(w[c + lane]) * _bf16(y[c + lane])
    for lane in range(8):
        acc[lane] = (acc[lane] + acc[16 + lane]) + (acc[8 + lane] + acc[24 + lane])
    g0, g1, g2, g3 = acc[4] + acc[0], acc[5] + acc[1], acc[6] + acc[2], acc[7] + acc[3]
    s = np.float64((g0 + g2) + (g1 + g3))
    for e in range(body, n):
        s += np.float64(_bf16(w[e]) * _bf16(y[e]))
    return np.float32(s)


@njit(cache=True, forceinline=True)
def _bf16(bits):
    """bf16 bits to float32 (exact)."""
    return bits_f32(np.uint32(bits) << np.uint32(16))


@njit(cache=True, parallel=True)
def dot_f32(w, y, out, step):
    """out (m, n_rows) = ggml_vec_dot_f32 of float32 rows w (n_rows, n) with activations y (m, n); step 64 (AVX-512
    order) or 32 (AVX2)."""
    n_rows = w.shape[0]
    for t in prange((n_rows + ROWS - 1) // ROWS):
        acc = np.empty(step, np.float32)
        for r in range(t * ROWS, min(n_rows, (t + 1) * ROWS)):
            for i in range(y.shape[0]):
                out[i, r] = _dot_f32_row(w[r], y[i], acc)


@njit(cache=True, parallel=True)
def dot_f16(w, yq, out, step):
    """out (m, n_rows) = ggml_vec_dot_f16 of fp16 rows w (n_rows, n) uint16 with fp16 activations yq (m, n) uint16;
    step as for dot_f32."""
    n_rows = w.shape[0]
    m, n = yq.shape
    y = np.empty((m, n), np.float32)
    for i in range(m):
        for e in range(n):
            y[i, e] = f16_to_f32(yq[i, e])
    for t in prange((n_rows + ROWS - 1) // ROWS):
        acc = np.empty(step, np.float32)
        for r in range(t * ROWS, min(n_rows, (t + 1) * ROWS)):
            for i in range(m):
                out[i, r] = _dot_f16_row(w[r], y[i], acc)


def _dot_f32_serial(w, y, out, step):
    """dot_f32 on the calling thread: for the small products of attention, where starting threads costs more."""
    acc = np.empty(step, np.float32)
    for r in range(w.shape[0]):
        for i in range(y.shape[0]):
            out[i, r] = _dot_f32_row(w[r], y[i], acc)


def _dot_f16_serial(w, yq, out, step):
    """dot_f16 on the calling thread (see dot_f32_serial)."""
    m, n = yq.shape
    y = np.empty((m, n), np.float32)
    for i in range(m):
        for e in range(n):
            y[i, e] = f16_to_f32(yq[i, e])
    acc = np.empty(step, np.float32)
    for r in range(w.shape[0]):
        for i in range(m):
            out[i, r] = _dot_f16_row(w[r], y[i], acc)


def _copies(serial, row):
    """{step: a compiled copy of `serial` whose row function takes that step's order only}: the row function with
    either order behind acc's length compiles both (on an AVX2 host, AVX-512's steps and reduction: 1.5 s of a first
    start's dry pass)."""
    copies = {}
    for step, steps, reduce in ((32, _steps8, _reduce_steps8), (64, _steps16, _reduce_steps16)):
        fixed = specialise(row.py_func, f"s{step}", {"_fixed_steps": steps, "_fixed_reduce": reduce}, cache=True)
        copies[step] = specialise(serial, f"s{step}", {row.__name__: fixed}, cache=True)
    return copies


_F32_SERIAL = _copies(_dot_f32_serial, _dot_f32_row)
_F16_SERIAL = _copies(_dot_f16_serial, _dot_f16_row)


def dot_f32_serial(w, y, out, step):
    """dot_f32 on the calling thread (step 32 or 64): for the small products of attention, where starting threads
    costs more."""
    _F32_SERIAL[int(step)](w, y, out, step)


def dot_f16_serial(w, yq, out, step):
    """dot_f16 on the calling thread (see dot_f32_serial)."""
    _F16_SERIAL[int(step)](w, yq, out, step)


@njit(cache=True, parallel=True)
def dot_bf16_dp(w, yq, out):
    """dot_bf16 with step 64 through VDPBF16PS itself (numba's target has AVX512_BF16: tinyblas.bf16_available), one
    activation yq (1, n): the same bits as _dot_bf16_row, which spells the instruction out (DAZ, FTZ, RNE) for the
    CPUs without it, four times the speed here (an AMD EPYC's instruction gave the spelled-out bits on denormals too)."""
    n_rows, n = w.shape
    body = n - n % STEP
    for t in prange((n_rows + ROWS - 1) // ROWS):
        acc = np.empty(32, np.float32)
        for r in range(t * ROWS, min(n_rows, (t + 1) * ROWS)):
            dot64bf_acc(w, np.uint64(r * w.strides[0]), yq[0], body, acc)
            s = np.float64(_reduce16(acc, np.int64(0))) + np.float64(_reduce16(acc, np.int64(16)))
            for e in range(body, n):
                s += np.float64(_bf16(w[r, e]) * _bf16(yq[0, e]))
            out[0, r] = np.float32(s)


@njit(cache=True, parallel=True)
def dot_bf16(w, yq, out, step):
    """out (m, n_rows) = ggml_vec_dot_bf16 of bf16 rows w (n_rows, n) with bf16 activations yq (m, n), uint16 bits;
    step 64: the AVX512_BF16 build's order, 32: the AVX2 build's."""
    n_rows = w.shape[0]
    for t in prange((n_rows + ROWS - 1) // ROWS):
        acc = np.empty(32, np.float32)
        for r in range(t * ROWS, min(n_rows, (t + 1) * ROWS)):
            for i in range(yq.shape[0]):
                if step == 32:
                    out[i, r] = _dot_bf16_row_avx2(w[r], yq[i], acc)
                else:
                    out[i, r] = _dot_bf16_row(w[r], yq[i], acc)
