"""The textbook maths of a transformer layer as pure NumPy functions: the float32 reference numerics.

RMSNorm, SiLU, GELU (tanh), a stable softmax, soft-capping, the causal (and sliding-window) mask and grouped-query
attention. engine.ops.ggml computes the same ops with ggml-cpu's bits; the runtime's numerics object picks one.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import numpy.typing as npt

from engine.kernels.activations import HAVE_NUMBA

F32 = npt.NDArray[np.float32]


def rms_norm(x: F32, weight: F32, eps: float) -> F32:
    """x / sqrt(mean(x^2) + eps) * weight, over the last axis (ggml_rms_norm then a multiply)."""
    ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    return (x * (1.0 / np.sqrt(ms + np.float32(eps)))) * weight


def silu(x: F32) -> F32:
    """x * sigmoid(x)."""
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: F32) -> F32:
    """GELU with the tanh approximation, as ggml_gelu computes it."""
    c = np.float32(math.sqrt(2.0 / math.pi))
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def softmax(x: F32, axis: int = -1) -> F32:
    """Numerically stable softmax; rows that are all -inf give zeros instead of NaN."""
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(s > 0, s, 1.0)


def softmax_with_sinks(x: F32, sinks: F32) -> F32:
    """Softmax over the last axis as if one more logit per row, `sinks` (broadcast against x[..., :1]), were in the
    row: it takes its share of the sum and gives no output (gpt-oss's learned attention sinks)."""
    m = np.maximum(np.max(x, axis=-1, keepdims=True), sinks)
    e = np.exp(x - m)
    return e / (np.sum(e, axis=-1, keepdims=True) + np.exp(sinks - m))


def swiglu_oai(gate: F32, up: F32, alpha: float = 1.702, limit: float = 7.0) -> F32:
    """gpt-oss's clamped SwiGLU: g = min(gate, limit), u = clamp(up, -limit, limit), g * sigmoid(alpha g) * (u + 1)."""
    g = np.minimum(gate, np.float32(limit))
    u = np.clip(up, -np.float32(limit), np.float32(limit))
    with np.errstate(over="ignore"):
        return (g / (np.float32(1.0) + np.exp(np.float32(-alpha) * g)) * (u + np.float32(1.0))).astype(np.float32)


def soft_cap(x: F32, cap: float) -> F32:
    """cap * tanh(x / cap) as llama.cpp builds it: ggml_scale by 1/cap, ggml_tanh (tanhf), ggml_scale by cap."""
    y = np.ascontiguousarray(np.asarray(x, np.float32) * (np.float32(1.0) / np.float32(cap)))
    if HAVE_NUMBA:
        from engine.ops.ggml_kernels import tanhf_flat  # noqa: PLC0415 - compiled kernels only

        t = np.empty_like(y)
        tanhf_flat(y.reshape(-1), t.reshape(-1))
    else:  # NumPy's float32 tanh: within an ulp of tanhf
        t = np.tanh(y)
    return t * np.float32(cap)


def causal_mask(q_pos: npt.NDArray[np.int64], k_len: int, window: int | None = None) -> npt.NDArray[np.bool_]:
    """(T, k_len) bool: True where query at absolute position q_pos[t] may see key j (j <= pos, and pos - j < window)."""
    j = np.arange(k_len)[None, :]
    p = q_pos[:, None]
    ok = j <= p
    if window is not None:
        ok &= (p - j) < window
    return ok


def attention(
    q: F32, k: F32, v: F32, mask: npt.NDArray[np.bool_] | None, scale: float,
    round_weights: Callable[[F32], F32] | None = None, softcap: float | None = None, sinks: F32 | None = None,
) -> tuple[F32, F32]:
    """Grouped-query attention. q (Hq, T, d), k/v (Hkv, S, d), mask (T, S) or None when every key is visible.

    `round_weights` rounds the softmax weights before they multiply V, as ggml converts them to the V cache's
    type (F16) for that product. `softcap` (Gemma 2) caps the raw scores as cap * tanh(kq / cap) before the scale
    (build_attn_mha's attn_soft_cap). `sinks` (Hq,) (gpt-oss): one learned logit per head joins each softmax row
    and carries no value. Returns (out (Hq, T, d), weights (Hq, T, S)).
    """
    hq, t, d = q.shape
    hkv = k.shape[0]
    g = hq // hkv
    qg = q.reshape(hkv, g * t, d)  # (Hkv, G*T, d): query heads h = kv*G + i share kv head kv
    if softcap is None:
        scores = (qg @ k.transpose(0, 2, 1)).reshape(hq, t, -1) * np.float32(scale)  # (Hq, T, S)
    else:
        scores = soft_cap((qg @ k.transpose(0, 2, 1)).reshape(hq, t, -1), softcap) * np.float32(scale)
    if mask is not None:
        scores = np.where(mask[None], scores, np.float32(-np.inf))
    w = softmax(scores) if sinks is None else softmax_with_sinks(scores, np.asarray(sinks, np.float32)[:, None, None])
    wv = w if round_weights is None else round_weights(w)
    out = (wv.reshape(hkv, g * t, -1) @ v).reshape(hq, t, d)  # (Hq, T, d)
    return out, w
