"""Attention as llama.cpp computes it on the CPU without flash attention, with ggml-cpu's exact bits.

llama.cpp's graph (build_attn_mha): kq = mul_mat(K, q) over the KV cache's first n_kv cells (n_kv padded
to a multiple of 256, the padding masked), kq_soft_max = soft_max_ext(kq, mask, scale), kqv =
mul_mat(V^T, kq_soft_max) with V kept transposed, so each output element is a dot product over the keys.
Which kernel ggml_compute_forward_mul_mat runs for each product decides the summation order:

- vec_dot_f32 / vec_dot_f16 (four 16-lane accumulators over 64-float steps; engine.kernels.legacy.family's
  F32 / F16 products follow them bit for bit) when llamafile_sgemm declines: for one query column
  (n < 2), or for K*q with an F32 cache, whose q operand is a permuted, non-contiguous view;
- llamafile's tinyBLAS otherwise (LLAMAFILE = 1 in this build): one 16-lane accumulator per output,
  _mm512_fmadd_ps over 16-float steps, then _mm512_reduce_add_ps. With an F16 cache, q (for K*q) and the
  softmax weights (for V*w) are first rounded to fp16.

That is the AVX-512 build. The AVX2 build (engine.kernels.isa.lanes() == 8) has vec_dot's four accumulators 8
lanes wide (32-float steps) and tinyBLAS<8, __m256>, which takes a product when its row length is a multiple of 8.

Inputs use the engine's layout: q (Hq, T, d); keys / values (Hkv, S, d) as float32 (an F32 cache) or
float16 (an F16 cache); query head h reads KV head h // (Hq / Hkv), as ggml broadcasts.
"""
from __future__ import annotations


import numpy as np
import numpy.typing as npt

from engine.kernels import isa, precompile
from engine.kernels.floats import vec_dot as legacy_floats
from engine.kernels.activations import (
    HAVE_NUMBA,
    KERNEL_LOCK,
    fma32,
    njit,
    prange,
    quantize_f16,
)
from engine.kernels.legacy.family import gemm_f16, gemm_f32
from engine.kernels.variants import early
from engine.ops.reference import soft_cap
from engine.ops.ggml_math import fma32 as fma32_np
from engine.ops.ggml import soft_max

F32 = npt.NDArray[np.float32]
KV_PAD = 256  # llama_kv_cache::get_n_kv pads n_kv to a multiple of 256 (capped by the cache size)
LANES = 16  # tinyBLAS<16, __m512, ...>: KN (8 in the AVX2 build)

__all__ = ["attention", "kq", "kqv", "kv_length", "lanes_dot"]


def kv_length(n_used: int, kv_size: int | None = None) -> int:
    """llama.cpp's n_kv for a cache whose first n_used cells are filled: max(256, n_used rounded up to 256),
    at most the cache size, which llama_context rounds up to a multiple of 256 too (a context of 129 holds
    256 cells). Padding with masked zero keys never changes a bit of the result, but where the key rows end
    decides ggml's chunks, so the products here run on n_kv keys."""
    n = max(KV_PAD, -(-n_used // KV_PAD) * KV_PAD)
    return n if kv_size is None else min(n, -(-kv_size // KV_PAD) * KV_PAD)


# ---- tinyBLAS order


@njit(cache=True, parallel=True)
def _lanes_kernel(w, yt, out, lanes):
    """out (m, r) = tinyBLAS dot of rows w (r, k) with the columns of yt (k, m), k a multiple of lanes (16 or 8).

    The columns are the innermost loop (contiguous in yt), so LLVM vectorises across outputs while each
    output keeps its own lanes and its own order."""
    r_rows, k = w.shape
    m = yt.shape[1]
    for r in prange(r_rows):
        acc = np.zeros((lanes, m), np.float32)
        for c in range(0, k, lanes):
            for lane in range(lanes):
                wv = w[r, c + lane]
                for i in range(m):
                    acc[lane, i] = fma32(wv, yt[c + lane, i], acc[lane, i])
        if lanes == 16:  # _mm512_reduce_add_ps: the 256-bit halves first
            for lane in range(8):
                for i in range(m):
                    acc[lane, i] = acc[lane, i] + acc[lane + 8, i]
        for i in range(m):  # then the 128-bit halves, movehl and movehdup (hsum(__m256) in the AVX2 build)
            u0, u1 = acc[0, i] + acc[4, i], acc[1, i] + acc[5, i]
            u2, u3 = acc[2, i] + acc[6, i], acc[3, i] + acc[7, i]
            out[i, r] = (u0 + u2) + (u1 + u3)


def _reduce_np(v: F32) -> F32:
    """One register's horizontal sum over the last axis (16: _mm512_reduce_add_ps; 8: the AVX2 hsum)."""
    if v.shape[-1] == 16:
        v = v[..., :8] + v[..., 8:]
    q = v[..., :4] + v[..., 4:]
    return (q[..., 0] + q[..., 2]) + (q[..., 1] + q[..., 3])


def lanes_dot(w: F32, y: F32, lanes: int = LANES) -> F32:
    """(m, r): tinyBLAS's dot of every row of w (r, k) with every row of y (m, k), k % lanes == 0.

    Lane l of one accumulator takes elements l, l + lanes, l + 2 lanes, ... by fused multiply-adds; then the
    register's horizontal sum (lanes 16: the AVX-512 build's _mm512_reduce_add_ps; 8: the AVX2 build's hsum).
    (fp16 operands: pass their float32 values, which is what tinyBLAS loads.)
    """
    w = np.ascontiguousarray(w, np.float32)
    y = np.ascontiguousarray(y, np.float32)
    out = np.empty((y.shape[0], w.shape[0]), np.float32)
    if HAVE_NUMBA:
        # on numba's threads; on this one while the late kernels compile (a first start: a third of the compile)
        kernel = early(_lanes_kernel)  # its serial twin before the late kernels (engine.kernels.variants)
        with KERNEL_LOCK:
            kernel(w, np.ascontiguousarray(y.T), out, np.int64(lanes))
        return out
    acc = np.zeros((y.shape[0], w.shape[0], lanes), np.float32)
    for c in range(0, w.shape[1], lanes):
        acc = fma32_np(w[None, :, c : c + lanes], y[:, None, c : c + lanes], acc)
    out[:] = _reduce_np(acc)
    return out


SERIAL_MACS = 1 << 20  # below this many multiply-adds a product runs on the calling thread (no thread start-up)


def load_kernels() -> None:
    """Load (or compile) what a long prompt's attention runs and a four-token warm pass does not reach: the
    parallel F32 and F16 row products (an F32 or F16 cache) and tinyBLAS's dot, parallel once the late kernels
    are ready, else its serial copy; on a few floats, at the warm-up, so that no later job (a comparison's
    128-position chunks) brings their code into the process. The caller holds no KERNEL_LOCK."""
    if not HAVE_NUMBA:
        return
    w = np.zeros((1, 64), np.float32)
    out = np.empty((1, 1), np.float32)
    with KERNEL_LOCK:
        gemm_f32(w.view(np.uint8), w.view(np.uint8), out)
        gemm_f16(w.astype(np.float16).view(np.uint8), quantize_f16(w).reshape(1, -1), out)
    lanes_dot(w, w, isa.lanes())


def _vec_dot(w: np.ndarray, y: F32) -> F32:
    """(m, r): ggml_vec_dot_f32 (w float32) or ggml_vec_dot_f16 (w float16, y rounded to fp16) of rows."""
    out = np.empty((y.shape[0], w.shape[0]), np.float32)
    if precompile.is_dry_attention():  # a first start's dry pass: a product helper compiles these (compile_jobs)
        out[:] = 0.0
        return out
    if HAVE_NUMBA and w.size * y.shape[0] < SERIAL_MACS:
        step = np.int64(4 * isa.lanes())
        if w.dtype == np.float16:
            legacy_floats.dot_f16_serial(np.ascontiguousarray(w).view(np.uint16),
                                         quantize_f16(np.ascontiguousarray(y, np.float32)).view(np.uint16)
                                         .reshape(y.shape[0], -1), out, step)
        else:
            legacy_floats.dot_f32_serial(np.ascontiguousarray(w, np.float32), np.ascontiguousarray(y, np.float32), out,
                                         step)
        return out
    if w.dtype == np.float16:
        xq = quantize_f16(np.ascontiguousarray(y, np.float32))
        wb = np.ascontiguousarray(w).view(np.uint8)
        with KERNEL_LOCK:
            gemm_f16(wb, xq.reshape(y.shape[0], -1), out)
    else:
        wb = np.ascontiguousarray(w, np.float32).view(np.uint8)
        yb = np.ascontiguousarray(y, np.float32).view(np.uint8)
        with KERNEL_LOCK:
            gemm_f32(wb, yb, out)
    return out


def _product(w: np.ndarray, y: F32, tinyblas: bool) -> F32:
    """One ggml mul_mat block, w (r, k) the weight-side rows, y (m, k) the columns, by the kernel ggml picks."""
    if not tinyblas:
        return _vec_dot(w, y)
    if w.dtype == np.float16:  # src1 converted to F16 (vec_dot_type) before tinyBLAS<F16, F16>
        y = y.astype(np.float16).astype(np.float32)
    return lanes_dot(w.astype(np.float32), y, isa.lanes())


def _sgemm_takes(m: int, n: int, k: int) -> bool:
    """llamafile_sgemm accepts (AVX-512): n >= 2 columns, k % 16 == 0, m % 4 == 0 (AVX2: k % 8 == 0)."""
    return n >= 2 and k % isa.lanes() == 0 and m % 4 == 0


def _padded(rows: np.ndarray, n_kv: int) -> np.ndarray:
    """(Hkv, S, d) rows padded with zero rows to (Hkv, n_kv, d)."""
    s = rows.shape[1]
    if s == n_kv:
        return rows
    if s > n_kv:
        raise ValueError(f"{s} cached rows exceed n_kv {n_kv}")
    out = np.zeros((rows.shape[0], n_kv, rows.shape[2]), rows.dtype)
    out[:, :s] = rows
    return out


def kq(q: F32, keys: np.ndarray, n_kv: int | None = None) -> F32:
    """ggml_mul_mat(K, q): scores (Hq, T, n_kv) for q (Hq, T, d) and keys (Hkv, S, d) float32 or float16."""
    hq, t, d = q.shape
    hkv, s, _ = keys.shape
    n_kv = kv_length(s) if n_kv is None else n_kv
    if s > n_kv:
        raise ValueError(f"{s} cached rows exceed n_kv {n_kv}")
    g = hq // hkv
    q = np.asarray(q, np.float32)
    contiguous_q = t == 1 or hq == 1  # ggml_permute(q, 0, 2, 1, 3) is a plain layout only then
    if keys.dtype == np.float16:
        tinyblas = _sgemm_takes(n_kv, t, d)  # q goes through the F16 work buffer, always contiguous
    else:
        tinyblas = contiguous_q and _sgemm_takes(n_kv, t, d)
    # rows past the s cached keys are zero (the padding): each score is its own dot, so they are skipped and
    # left at 0 (the mask hides them anyway); the kernel choice above still follows n_kv, as llama.cpp's
    out = np.zeros((hq, t, n_kv), np.float32)
    for h in range(hkv):
        cols = q[h * g : (h + 1) * g].reshape(g * t, d)
        out[h * g : (h + 1) * g, :, :s] = _product(keys[h], cols, tinyblas).reshape(g, t, s)
    return out


def kqv(weights: F32, values: np.ndarray) -> F32:
    """ggml_mul_mat(V^T, kq_soft_max): (Hq, T, d) for weights (Hq, T, n_kv) and values (Hkv, S, d), S <= n_kv."""
    hq, t, n_kv = weights.shape
    hkv, _, d = values.shape
    # the dot runs over the keys in 64-wide steps (16-wide for tinyBLAS): past the cached keys the padding adds
    # exact zeros to every accumulator, so stopping at the next multiple of 64 gives the same bits
    tinyblas = _sgemm_takes(d, t, n_kv)
    n_kv = min(n_kv, -(-values.shape[1] // 64) * 64)
    weights = weights[..., :n_kv]
    v = _padded(values, n_kv)
    g = hq // hkv
    out = np.empty((hq, t, d), np.float32)
    for h in range(hkv):
        vt = np.ascontiguousarray(v[h].T)  # (d, n_kv): llama.cpp's transposed V rows
        cols = np.ascontiguousarray(weights[h * g : (h + 1) * g].reshape(g * t, n_kv), np.float32)
        out[h * g : (h + 1) * g] = _product(vt, cols, tinyblas).reshape(g, t, d)
    return out


def attention(
    q: F32, keys: np.ndarray, values: np.ndarray, mask: npt.NDArray[np.bool_] | None, scale: float,
    n_kv: int | None = None, softcap: float | None = None, sinks: F32 | None = None,
) -> tuple[F32, F32]:
    """kq -> soft_max_ext(scale, mask) -> kqv. mask (T, S) True where visible (None: all S keys visible).
    softcap (Gemma 2): kq -> cap * tanh(kq / cap) before the softmax, as build_attn_mha does. sinks (Hq,)
    (gpt-oss): ggml_soft_max_add_sinks, one logit per head in each row's maximum and sum.

    Returns (out (Hq, T, d), weights (Hq, T, S)), the weights without the padding.
    """
    s = keys.shape[1]
    n_kv = kv_length(s) if n_kv is None else n_kv
    scores = kq(q, keys, n_kv)
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    full = np.zeros((q.shape[1], n_kv), bool)
    full[:, :s] = True if mask is None else mask
    w = soft_max(scores, scale, full, None if sinks is None else np.asarray(sinks, np.float32)[:, None, None])
    return kqv(w, values), w[..., :s]
