"""The gated DeltaNet layer's ops on traced values: what `TapeNumerics.recurrent()` hands the mixer.

engine.models.deltanet.DeltaNetMixer calls its numerics' recurrent ops (engine.ops.delta_rule) for the gates, the short
causal convolution, the L2 norms and the delta rule. Those write into preallocated arrays or run compiled, so a traced
pass gets this module's twins instead: the same float32 reference maths spelled as NumPy ops on a `Var`, which the
tape records one by one (engine.grad.vjps), so the gradient of the recurrence is composed from the ops' VJPs like every
other part of the graph, never derived by hand:

- `gates`: g = softplus(alpha + ssm_dt) * ssm_a (the identity above 20, ggml's cut-off), exp(g), beta = sigmoid(b)
- `ssm_conv`: per tap, the window's rows times the tap's weights, summed
- `l2_norm`: x / sqrt(mean(x^2) + eps / n) / sqrt(n), as llama.cpp's RMS norm with eps / n then scaled
- `delta_rule`: a token at a time over all heads, the state S (H, S, S) held as ggml holds it (row j: column j):
  S *= exp(g_t); d = (v_t - S k_t) * beta_t; S += d k_t^T; o_t = S q_t / sqrt(S_v)

The compiled one-token step is never available (`step_available`), and the state a pass reaches is the pass's own
(engine.grad.backward.TapeCache keeps no state across passes).
"""
from __future__ import annotations

from typing import Any

import numpy as np

SOFTPLUS_CUT = 20.0  # op_softplus: x above it is returned as it is


def step_available() -> bool:
    """A traced pass runs every token through the ops below, never the compiled decode step."""
    return False


def softplus(x: Any) -> Any:
    """log(1 + e^x), x itself above the cut-off; the branch not taken gets no gradient (and no overflow)."""
    low = np.minimum(x, SOFTPLUS_CUT)
    return np.where(x > SOFTPLUS_CUT, x, np.log(1.0 + np.exp(low)))


def sigmoid(x: Any, exact: bool = False) -> Any:
    return 1.0 / (1.0 + np.exp(-x))


def gates(alpha: Any, dt_bias: np.ndarray, a: np.ndarray, b: Any, exact: bool) -> tuple[Any, Any, Any]:
    """g (the log decay), exp(g) and beta from the products' outputs alpha and b (T, heads)."""
    g = softplus(alpha + dt_bias) * a
    return g, np.exp(g), sigmoid(b)


def ssm_conv(window: Any, kernel: np.ndarray, exact: bool) -> Any:
    """window (K - 1 + T, C), kernel (C, K) -> (T, C): the causal convolution, a tap at a time."""
    k = kernel.shape[1]
    t = window.shape[0] - (k - 1)
    acc = window[0:t] * kernel[:, 0]
    for i in range(1, k):
        acc = acc + window[i : i + t] * kernel[:, i]
    return acc


def l2_norm(x: Any, eps: float, exact: bool) -> Any:
    n = float(x.shape[-1])
    ms = np.mean(x * x, axis=-1, keepdims=True) + float(eps) / n
    return x / np.sqrt(ms) * (1.0 / np.sqrt(n))


def _expand(x: Any, n_heads: int) -> Any:
    """Key heads tiled over the value heads (value head h reads key head h % n_k), as engine.ops.delta_rule."""
    if x.shape[1] == n_heads:
        return x
    return x[:, np.arange(n_heads) % x.shape[1]]


def delta_rule(q: Any, k: Any, v: Any, decay: Any, beta: Any, state: Any, exact: bool,
               snap_at: int = -1) -> tuple[Any, Any, None]:
    """q, k (T, Hk, S), v (T, H, S), decay = exp(g) and beta (T, H), state (H, S, S) -> the outputs (T, H, S) and the
    state after the last token (no snapshot: a traced pass keeps none)."""
    n_tokens, n_heads, size = v.shape
    qx, kx = _expand(q, n_heads), _expand(k, n_heads)
    scale = 1.0 / np.sqrt(float(size))
    s = state
    outs = []
    for t in range(n_tokens):
        s = s * decay[t][:, None, None]
        kt = kx[t][:, None, :]  # (H, 1, S): broadcast over the state's rows j
        d = (v[t] - np.sum(s * kt, axis=-1)) * beta[t][:, None]  # (H, S)
        s = s + d[:, :, None] * kt
        outs.append(np.sum(s * qx[t][:, None, :], axis=-1) * scale)
    return np.stack(outs), s, None
