"""The ops of a gated DeltaNet layer (Qwen3.5 / Qwen3.6 / Qwen3-Next linear attention), each twice: the float32
reference, and ggml-cpu's exact bits (AVX-512 or AVX2 build, GCC, glibc).

- `softplus`: op_softplus, x > 20 ? x : logf(1.0f + expf(x)) (the decay gate before it is scaled by ssm_a)
- `sigmoid`: op_sigmoid, 1.0f / (1.0f + expf(-x)) (beta, and the attention layers' output gate)
- `l2_norm`: build_gdn_l2_norm, ggml_rms_norm(x, eps / n) then ggml_scale by 1.0f / sqrtf(n)
- `gates`: the decay gate g = softplus(alpha + ssm_dt) * ssm_a, exp(g), and beta = sigmoid(b), in one pass
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
            y = libm_logf(ONE + ggml_ops._expf(x))
        else:
            y = np.log1p(np.exp(x.astype(np.float64))).astype(np.float32)
    return np.where(x > np.float32(20.0), x, y).astype(np.float32)


def sigmoid(x: npt.ArrayLike, exact: bool) -> F32:
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):
        e = ggml_ops._expf(-x) if exact else np.exp(-x)  # libm's expf, compiled where the kernels are
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


def gates(alpha: F32, dt_bias: F32, a: F32, b: F32, exact: bool) -> tuple[F32, F32, F32]:
    """A DeltaNet layer's per-token gates from its products' outputs alpha, b (T, heads): g = softplus(alpha +
    dt_bias) * a (the log decay), exp(g) and beta = sigmoid(b), each op as ggml computes it (exact) or in float32."""
    if exact and HAVE_NUMBA and alpha.size:
        g, decay, beta = (np.empty(alpha.shape, np.float32) for _ in range(3))
        _gates(np.ascontiguousarray(alpha, np.float32), dt_bias, a, np.ascontiguousarray(b, np.float32), g, decay, beta)
        return g, decay, beta
    g = softplus(alpha + dt_bias, exact) * a
    with np.errstate(over="ignore"):
        decay = libm_expf(g) if exact else np.exp(g).astype(np.float32)
    return g, decay, sigmoid(b, exact)


# ---- the short causal convolution


def ssm_conv(window: F32, kernel: F32, exact: bool) -> F32:
    """window (K - 1 + T, C): the carried-over inputs then this batch's; kernel (C, K); -> (T, C)."""
    k = kernel.shape[1]
    t = window.shape[0] - (k - 1)
    if exact and HAVE_NUMBA and t > 0:
        out = np.empty((t, window.shape[1]), np.float32)
        with KERNEL_LOCK:
            _ssm_conv(np.ascontiguousarray(window, np.float32), np.ascontiguousarray(kernel, np.float32), out)
        return out
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
    from engine.kernels.floats.delta_row import delta_row8, delta_row16
    from engine.kernels.floats.vec_dot import _dot_f32_row

    @njit(cache=True, forceinline=True)
    def _gate(alpha, dt, a, b):  # pragma: no cover - compiled
        """One head's g = op_softplus(alpha + dt) * a, expf(g) and beta = op_sigmoid(b): numba's float32 exp and log
        are the C library's expf and logf (the NumPy twins: engine.ops.ggml_math)."""
        one = np.float32(1.0)
        x = alpha + dt
        g = (x if x > np.float32(20.0) else np.log(one + np.exp(x))) * a
        return g, np.exp(g), one / (one + np.exp(-b))

    @njit(cache=True)
    def _gates(alpha, dt, a, b, g_out, decay, beta):  # pragma: no cover - compiled
        """`_gate` for every token and head."""
        for t in range(alpha.shape[0]):
            for h in range(alpha.shape[1]):
                g_out[t, h], decay[t, h], beta[t, h] = _gate(alpha[t, h], dt[h], a[h], b[t, h])

    @njit(cache=True, parallel=True)
    def _ssm_conv(window, kernel, out):  # pragma: no cover - compiled
        """ggml_compute_forward_ssm_conv_f32: per channel and token, the taps' contracted multiply-adds from 0. The
        channels go in chunks (one per task), a token's row of a chunk at a time: each tap a contiguous pass over
        the chunk (the same multiply-adds in the same order per element, in vector lanes)."""
        n_tokens, channels = out.shape
        taps = kernel.shape[1]
        kt = np.ascontiguousarray(kernel.T)  # (K, C): a tap's weights contiguous
        chunk = 512
        for task in prange((channels + chunk - 1) // chunk):
            c0 = task * chunk
            c1 = min(c0 + chunk, channels)
            for t in range(n_tokens):
                row = out[t]
                for c in range(c0, c1):
                    row[c] = np.float32(0.0)
                for i in range(taps):
                    w, kr = window[t + i], kt[i]
                    for c in range(c0, c1):
                        row[c] = fma32(w[c], kr[c], row[c])

    @njit(cache=True, forceinline=True)
    def _token(m, kt, qt, vt, dec, b, scale, acc, out, src=None):  # pragma: no cover - compiled
        """One token of one head, row by row of the transposed state: row j is column j of S, and its four steps
        (the decay, d_j from its dot with k, its update by k d_j, its dot with q) touch no other row, so each row is
        done whole while it is in cache; every value is the op-by-op sequence's. With `src`, the state is read from
        src and written to m (the copy ggml makes first, folded into the decay's pass)."""
        size = m.shape[0]
        for j in range(size):
            row = m[j]
            old = row if src is None else src[j]
            for i in range(size):
                row[i] = old[i] * dec
            dj = (vt[j] - _dot_f32_row(row, kt, acc)) * b
            for i in range(size):
                row[i] = fma32(kt[i], dj, row[i])
            out[j] = _dot_f32_row(row, qt, acc) * scale

    @njit(cache=True, forceinline=True)
    def _vector_head(dst, src, h, k, ko, q, qo, v, vo, dec, b, scale, out, oo, step):  # pragma: no cover - compiled
        """One token of value head h whose rows are a whole number of steps (64 or 32): each row's four steps as
        engine.kernels.floats.delta_row's two vector passes, from src's rows (src is dst for an update in place)
        into dst's (both (H, S, S)); k's and q's rows at byte offsets ko and qo, v[vo + j] the value of row j,
        out[oo + j] its output. No view per row: those cost a shared reference count each."""
        size = dst.shape[1]
        n_steps, row_bytes = np.int64(size // step), np.int64(4 * size)
        for j in range(size):
            mo = np.int64(h * size + j) * row_bytes
            if step == 64:
                o = delta_row16(dst, mo, src, mo, k, ko, q, qo, n_steps, dec, v[vo + j], b)
            else:
                o = delta_row8(dst, mo, src, mo, k, ko, q, qo, n_steps, dec, v[vo + j], b)
            out[oo + j] = o * scale

    @njit(cache=True, parallel=True)
    def _delta_rule_ggml(q, k, v, decay, beta, state, out, snap, snap_at, step):  # pragma: no cover - compiled
        """ggml_compute_forward_gated_delta_net_one_chunk (K = 1) for every value head, one head per task. Rows as
        long as a whole number of steps go through `_vector_head`, others through `_token`."""
        n_tokens, n_heads, size = v.shape
        n_k = q.shape[1]
        scale = np.float32(1.0) / np.float32(np.sqrt(np.float32(size)))
        vector = size % step == 0
        vf, of = v.reshape(-1), out.reshape(-1)  # contiguous: delta_rule made them so
        for h in prange(n_heads):
            acc = np.empty(step, np.float32)
            m = state[h]
            hk = h % n_k
            for t in range(n_tokens):
                if vector:
                    ko, vo = np.int64(t * n_k + hk) * np.int64(4 * size), np.int64(t * n_heads + h) * size
                    _vector_head(state, state, h, k, ko, q, ko, vf, vo, decay[t, h], beta[t, h], scale, of, vo, step)
                else:
                    _token(m, k[t, hk], q[t, hk], v[t, h], decay[t, h], beta[t, h], scale, acc, out[t, h])
                if t == snap_at:
                    snap[h, :, :] = m


# ---- one token, compiled whole (a decode step's DeltaNet layer)


def step_available() -> bool:
    """Whether `step` can run (numba present): else the layer runs op by op."""
    return HAVE_NUMBA


def step(qkv: F32, z: F32, b: F32, alpha: F32, dt_bias: F32, a: F32, kernel: F32, norm: F32, eps: float,
         conv: F32, state: F32, k_heads: int, key_map: int) -> tuple[F32, F32, F32, dict[str, F32]]:
    """One token through a DeltaNet layer after its input products, in ggml's bits, in one compiled call: the gates,
    the convolution with the carried rows `conv` (K - 1, C), SiLU, the L2 norms, the delta rule on `state` (H, S, S)
    and the gated norm. key_map 0: value head h reads key head h % k_heads, 1: h // (H / k_heads). Returns y
    (value_dim,) for ssm_out, the new conv rows, the new state and the delta rule's inputs (for the recorder)."""
    n_heads, size = state.shape[0], state.shape[1]
    y = np.empty(n_heads * size, np.float32)
    x = np.empty(conv.shape[1], np.float32)
    gdb = np.empty((3, n_heads), np.float32)
    with KERNEL_LOCK:
        new_conv, new_state = step_into(qkv, z, b, alpha, dt_bias, a, kernel, norm, eps, conv, state, k_heads, key_map,
                                        x, gdb, y)
    return y, new_conv, new_state, step_inputs(x, gdb, k_heads, n_heads, size)


def step_into(qkv: F32, z: F32, b: F32, alpha: F32, dt_bias: F32, a: F32, kernel: F32, norm: F32, eps: float,
              conv: F32, state: F32, k_heads: int, key_map: int, x: F32, gdb: F32, y: F32,
              w8: bool | None = None) -> tuple[F32, F32]:
    """`step` into the caller's scratch (x (conv_dim,), gdb (3, H): g, exp(g), beta) and output y (value_dim,), the
    kernel lock held by the caller (engine.runtime.decode_plan's step); returns the new conv rows and state (fresh
    arrays: the cache's snapshots keep the old ones). w8: the AVX2 build's lanes (None: engine.kernels.isa's)."""
    new_state = np.empty(state.shape, np.float32)  # written whole by the step (the decay's pass reads `state`)
    new_conv = np.empty_like(conv)
    _step(np.ascontiguousarray(qkv, np.float32).reshape(-1), np.ascontiguousarray(z, np.float32).reshape(-1),
          np.ascontiguousarray(b, np.float32).reshape(-1), np.ascontiguousarray(alpha, np.float32).reshape(-1),
          dt_bias, a, kernel, norm, np.float32(eps), conv, new_conv, np.ascontiguousarray(state, np.float32),
          new_state, x, gdb, y, np.int64(k_heads), np.int64(key_map), isa.lanes() == 8 if w8 is None else w8)
    return new_conv, new_state


def step_inputs(x: F32, gdb: F32, k_heads: int, n_heads: int, size: int) -> dict[str, F32]:
    """The delta rule's inputs of a step as the recorder takes them (views of x and gdb): q, k (1, k_heads, S) after
    the L2 norms, v (1, H, S), g and beta (1, H)."""
    kd = k_heads * size
    return {"q": x[:kd].reshape(1, k_heads, size), "k": x[kd : 2 * kd].reshape(1, k_heads, size),
            "v": x[2 * kd :].reshape(1, n_heads, size), "g": gdb[0][None], "beta": gdb[2][None]}


if HAVE_NUMBA:
    from engine.ops.ggml_kernels import rms_scale, silu_lane

    @njit(cache=True, forceinline=True)
    def _silu(v, lane, w8):  # pragma: no cover - compiled
        """ggml_vec_silu_f32 on one element: ggml_v_silu's lane where the row's vector body covers it, else libm's
        ggml_silu_f32 (the row's n % lanes leftovers)."""
        return silu_lane(v, w8) if lane else v / (np.float32(1.0) + np.exp(-v))

    @njit(cache=True, parallel=True)
    def _step(qkv, z, b, alpha, dt, a, kernel, norm, eps, conv, new_conv, old_state, state, x, gdb, y, k_heads, key_map,
              w8):  # pragma: no cover - compiled
        """See `step`; gdb rows: g, exp(g), beta. Every op as its NumPy path computes it (the same bits): the channels
        (convolution, SiLU) and then the heads (delta rule, SiLU of z, gated norm) each split over the threads."""
        n_heads, size = state.shape[0], state.shape[1]
        rows, channels = conv.shape
        one = np.float32(1.0)
        lanes = 8 if w8 else 16
        for h in range(n_heads):  # the gates
            gdb[0, h], gdb[1, h], gdb[2, h] = _gate(alpha[h], dt[h], a[h], b[h])
        body = channels - channels % lanes  # ggml_vec_silu_f32 on the row of channels: vector lanes, then libm
        for c in prange(channels):  # the convolution over the carried rows and this token (_ssm_conv), then SiLU
            acc = np.float32(0.0)
            for i in range(rows):
                acc = fma32(conv[i, c], kernel[c, i], acc)
            v = fma32(qkv[c], kernel[c, rows], acc)
            x[c] = _silu(v, c < body, w8)
            for i in range(rows - 1):
                new_conv[i, c] = conv[i + 1, c]
            if rows:
                new_conv[rows - 1, c] = qkv[c]
        n_f = np.float32(size)
        l2_eps = np.float32(eps / n_f)
        inv = one / np.sqrt(n_f)
        for hk in range(2 * k_heads):  # build_gdn_l2_norm on each head of q and k: rms_norm(eps / n), then the scale
            s = rms_scale(x, hk * size, size, l2_eps)
            for i in range(hk * size, (hk + 1) * size):
                x[i] = (x[i] * s) * inv
        kd = k_heads * size
        scale = one / np.float32(np.sqrt(np.float32(size)))
        group = n_heads // k_heads
        zbody = size - size % lanes
        step = np.int64(4 * lanes)
        for h in prange(n_heads):  # per head: the delta rule (_token), SiLU of its z row, the gated norm
            acc = np.empty(32 if w8 else 64, np.float32)
            hk = h % k_heads if key_map == 0 else h // group
            vo, o = 2 * kd + h * size, h * size
            if size % step == 0:  # the vector rows, from old_state into state
                _vector_head(state, old_state, h, x, np.int64(kd + hk * size) * 4, x, np.int64(hk * size) * 4, x, vo,
                             gdb[1, h], gdb[2, h], scale, y, o, step)
            else:
                _token(state[h], x[kd + hk * size : kd + (hk + 1) * size], x[hk * size : (hk + 1) * size],
                       x[vo : vo + size], gdb[1, h], gdb[2, h], scale, acc, y[o : o + size], old_state[h])
            s = rms_scale(y, o, size, eps)
            for j in range(size):
                y[o + j] = ((y[o + j] * s) * norm[j]) * _silu(z[o + j], j < zbody, w8)
