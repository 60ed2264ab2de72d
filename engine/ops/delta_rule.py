"""The ops of a gated DeltaNet layer (Qwen3.5 / Qwen3.6 / Qwen3-Next linear attention), each twice: the float32
reference, and ggml-cpu's exact bits (AVX-512 or AVX2 build, GCC, glibc).

- `softplus`: op_softplus, x > 20 ? x : logf(1.0f + expf(x)) (the decay gate before it is scaled by ssm_a)
- `sigmoid`: op_sigmoid, 1.0f / (1.0f + expf(-x)) (beta, and the attention layers' output gate)
- `l2_norm`: build_gdn_l2_norm, ggml_rms_norm(x, eps / n) then ggml_scale by 1.0f / sqrtf(n)
- `ssm_conv`: ggml_compute_forward_ssm_conv_f32, per channel and token `sumf += s[i] * c[i]` over the kernel's
  taps from 0, which GCC contracts to a chain of fused multiply-adds
- `delta_rule`: ggml_compute_forward_gated_delta_net (the fused op llama.cpp's CPU backend runs for a prompt and
  for a single token alike), per value head h (reading key head h % n_k_heads) and token t:
      S *= exp(g_t)                       ggml_vec_scale_f32, the state held transposed (row j = column j of S)
      d_j = (v_t[j] - S[:, j] . k_t) * beta_t                      ggml_vec_dot_f32 (four accumulators)
      S[:, j] = fma(k_t, d_j, S[:, j])                             ggml_vec_mad_f32
      o_t[j] = (S[:, j] . q_t) * (1.0f / sqrtf(S_v))
  the output reading the state after the token's own update. The ggml variant runs compiled (one head per
  thread) or, without numba, as NumPy with the same roundings; `decay` is exp(g) already (libm's expf).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.kernels import isa
from engine.kernels.activations import HAVE_NUMBA, KERNEL_LOCK, fma32, njit, prange
from engine.ops import ggml as ggml_ops
from engine.ops.ggml_math import expf as libm_expf
from engine.ops.ggml_math import fma32 as fma32_np
from engine.ops.ggml_math import logf as libm_logf

F32 = npt.NDArray[np.float32]
ONE = np.float32(1.0)


# ---- elementwise


def softplus(x: npt.ArrayLike, exact: bool) -> F32:
    """log(1 + e^x), the identity above 20 (ggml's cut-off, kept by the reference too)."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        if exact:
            y = libm_logf(ONE + libm_expf(x))
        else:
            y = np.log1p(np.exp(x.astype(np.float64))).astype(np.float32)
    return np.where(x > np.float32(20.0), x, y).astype(np.float32)


def sigmoid(x: npt.ArrayLike, exact: bool) -> F32:
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        e = libm_expf(-x) if exact else np.exp(-x)
        return (ONE / (ONE + e)).astype(np.float32)


def l2_norm(x: npt.ArrayLike, eps: float, exact: bool) -> F32:
    """x / max(|x|, ...) over the last axis as llama.cpp's DeltaNet writes it: an RMS norm with eps / n, scaled."""
    x = np.asarray(x, np.float32)
    n = np.float32(x.shape[-1])
    if exact:
        y = ggml_ops.rms_norm(x, None, float(np.float32(eps) / n))
        return ggml_ops.scale(y, float(ONE / np.sqrt(n)))
    ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + float(eps) / float(n)
    return (x / np.sqrt(ms) / np.sqrt(float(n))).astype(np.float32)


# ---- the short causal convolution


def ssm_conv(window: F32, kernel: F32, exact: bool) -> F32:
    """window (K - 1 + T, C): the carried-over inputs then this batch's; kernel (C, K); -> (T, C)."""
    k = kernel.shape[1]
    t = window.shape[0] - (k - 1)
    if not exact:
        taps = np.stack([window[i : i + t] for i in range(k)])  # (K, T, C)
        return np.einsum("ktc,ck->tc", taps.astype(np.float64), kernel.astype(np.float64)).astype(np.float32)
    acc = np.zeros((t, window.shape[1]), np.float32)
    for i in range(k):
        acc = fma32_np(window[i : i + t], kernel[:, i], acc)
    return acc


# ---- the gated delta rule


def delta_rule(q: F32, k: F32, v: F32, decay: F32, beta: F32, state: F32, exact: bool,
               snap_at: int = -1) -> tuple[F32, F32, F32 | None]:
    """q, k (T, Hk, S), v (T, H, S), decay = exp(g) and beta (T, H); state (H, S, S) as ggml holds it (row j:
    column j of S). Returns the outputs (T, H, S), the state after the last token and, with snap_at >= 0, the
    state after token snap_at (a copy), without changing `state`."""
    q, k, v = (np.ascontiguousarray(a, np.float32) for a in (q, k, v))
    decay, beta = np.ascontiguousarray(decay, np.float32), np.ascontiguousarray(beta, np.float32)
    s = np.array(state, np.float32, copy=True)
    out = np.empty(v.shape, np.float32)
    snap = np.zeros(s.shape if snap_at >= 0 else (0, 0, 0), np.float32)
    if exact and HAVE_NUMBA and v.shape[0]:
        with KERNEL_LOCK:
            _delta_rule_ggml(q, k, v, decay, beta, s, out, snap, np.int64(snap_at), np.int64(4 * isa.lanes()))
    else:
        _delta_rule_numpy(q, k, v, decay, beta, s, out, snap, snap_at, exact)
    return out, s, (snap if snap_at >= 0 else None)


def _expand(x: F32, n_heads: int) -> F32:
    """Key heads tiled over the value heads: value head h reads key head h % n_k."""
    return x[:, np.arange(n_heads) % x.shape[1]]


def _dot_ggml(m: F32, x: F32, lanes: int) -> F32:
    """ggml_vec_dot_f32 of each row of m (..., S) with x (..., S) broadcast: four `lanes`-wide accumulators, one fma
    per element, (s0 + s2) + (s1 + s3), the lanes reduced as the build reduces them; the S % (4 lanes) leftovers
    added after (product rounded, then added)."""
    step = 4 * lanes
    n = m.shape[-1]
    body = n - n % step
    accs = [np.zeros(m.shape[:-1] + (lanes,), np.float32) for _ in range(4)]
    xb = np.broadcast_to(x, m.shape)
    for c in range(0, body, step):
        for a in range(4):
            sl = slice(c + a * lanes, c + (a + 1) * lanes)
            accs[a] = fma32_np(m[..., sl], xb[..., sl], accs[a])
    v = (accs[0] + accs[2]) + (accs[1] + accs[3])
    if lanes == 16:  # _mm512_reduce_add_ps: halves added, 16 -> 8 -> 4 -> 2 -> 1
        u = v[..., :8] + v[..., 8:]
        w = u[..., :4] + u[..., 4:]
        s = (w[..., 0] + w[..., 2]) + (w[..., 1] + w[..., 3])
    else:  # GGML_F32x8_REDUCE's tail: the 128-bit halves, then two hadds
        u = v[..., :4] + v[..., 4:]
        s = (u[..., 0] + u[..., 1]) + (u[..., 2] + u[..., 3])
    for e in range(body, n):
        s = s + m[..., e] * xb[..., e]
    return s.astype(np.float32)


def _delta_rule_numpy(q: F32, k: F32, v: F32, decay: F32, beta: F32, s: F32, out: F32, snap: F32, snap_at: int,
                      exact: bool) -> None:
    """The recurrence a token at a time over all heads: ggml's roundings (exact) or plain float32 maths."""
    n_heads, size = v.shape[1], v.shape[2]
    qx, kx = _expand(q, n_heads), _expand(k, n_heads)
    scale = ONE / np.sqrt(np.float32(size))
    lanes = isa.lanes()
    for t in range(v.shape[0]):
        s *= decay[t][:, None, None]
        kt, qt = kx[t][:, None, :], qx[t][:, None, :]
        sk = _dot_ggml(s, kt, lanes) if exact else np.einsum("hji,hi->hj", s, kx[t])
        d = (v[t] - sk) * beta[t][:, None]
        s[:] = fma32_np(kt, d[:, :, None], s) if exact else s + d[:, :, None] * kt
        sq = _dot_ggml(s, qt, lanes) if exact else np.einsum("hji,hi->hj", s, qx[t])
        out[t] = sq * scale
        if t == snap_at:
            snap[:] = s


if HAVE_NUMBA:
    from engine.kernels.floats.vec_dot import _dot_f32_row

    @njit(cache=True, parallel=True)
    def _delta_rule_ggml(q, k, v, decay, beta, state, out, snap, snap_at, step):  # pragma: no cover - compiled
        """ggml_compute_forward_gated_delta_net_one_chunk (K = 1) for every value head, one head per task."""
        n_tokens, n_heads, size = v.shape
        n_k = q.shape[1]
        scale = np.float32(1.0) / np.float32(np.sqrt(np.float32(size)))
        for h in prange(n_heads):
            acc = np.empty(step, np.float32)
            delta = np.empty(size, np.float32)
            m = state[h]
            hk = h % n_k
            for t in range(n_tokens):
                g = decay[t, h]
                for j in range(size):
                    for i in range(size):
                        m[j, i] = m[j, i] * g
                b = beta[t, h]
                kt = k[t, hk]
                qt = q[t, hk]
                for j in range(size):
                    delta[j] = (v[t, h, j] - _dot_f32_row(m[j], kt, acc)) * b
                for j in range(size):
                    dj = delta[j]
                    for i in range(size):
                        m[j, i] = fma32(kt[i], dj, m[j, i])
                for j in range(size):
                    out[t, h, j] = _dot_f32_row(m[j], qt, acc) * scale
                if t == snap_at:
                    snap[h, :, :] = m
