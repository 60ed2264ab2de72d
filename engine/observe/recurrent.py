"""What each token of a gated DeltaNet layer reads from the past: the recurrent layer's exact attention map.

A gated DeltaNet layer (Qwen3.5 / Qwen3-Next linear attention, llama.cpp's ggml_compute_forward_gated_delta_net
with one scalar gate per value head) keeps a state S (S_k x S_v) per value head and, for each token t with
L2-normalised q_t, k_t, a value v_t, a log-decay g_t <= 0 and a write strength beta_t in (0, 1), does
    S <- exp(g_t) S;   d_t = beta_t (v_t - S^T k_t);   S <- S + k_t d_t^T;   o_t = S^T q_t / sqrt(S_v)
(`delta_rule_outputs` runs exactly this, the reference). Every step is linear in the v's with scalar
coefficients, so o_t = sum_{s<=t} W[t, s] v_s + (a term from S_0): the map W is what an attention row is to
softmax attention, except that its entries can be negative (the delta rule erases what a key held before).

Derivation (the WY / UT-transform form of the chunked kernels, here over the whole sequence). Let
G_t = g_1 + ... + g_t and D[t, s] = exp(G_t - G_s) for s <= t (<= 1: decay is only ever applied forward).
Unrolling the updates, the state after token t is
    S_t = sum_{s<=t} D[t, s] k_s d_s^T + exp(G_t) S_0.
Putting the decayed S_{t-1} into d_t gives, with Delta and V the (T, S_v) rows d_t and v_t, K and Q the
(T, S_k) rows k_t and q_t and E = diag(exp(G_t)):
    (I + L) Delta = diag(beta) (V - E K S_0),      L[t, s] = beta_t D[t, s] (k_t . k_s) for s < t, else 0,
and reading S_t with q_t gives, with M[t, s] = D[t, s] (q_t . k_s) for s <= t, else 0,
    o = (M Delta + E Q S_0) / sqrt(S_v).
Hence
    W = M (I + L)^{-1} diag(beta) / sqrt(S_v)                           (lower triangular, W[t, s] = 0 for s > t)
    initial = E Q S_0 / sqrt(S_v) - W E K S_0                           (row t: the part of o_t from S_0)
W comes from one triangular solve X (I + L) = M per head (`_right_solve_unit_lower`, blocked over columns so
the work is matrix products); L and M hold only exp(G_t - G_s) with t >= s, never the exp of a positive
number, so gates of -30 and less underflow to exact zeros instead of overflowing. Everything is float64, one
head at a time: O(T^2) memory per head, (T^3)/3 multiply-adds for the solve.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
SOLVE_BLOCK = 64  # columns per step of the triangular solve: small diagonal solves, the rest matrix products


@dataclass(frozen=True)
class RecurrentReads:
    """How each token's output of one gated DeltaNet layer is made from the values before it, per value head."""

    weights: F32  # (H, T, T) weights[h, t, s] = coefficient of v_s (value head h) in o_t; 0 for s > t
    initial: F32  # (H, T, S_v) the part of o_t that comes from the initial state S_0 (zeros without one)
    wrote: F32  # (H, T) beta_t: how much each token wrote into the state
    kept: F32  # (H, T) exp(g_t): how much of the state each token kept

    @property
    def n_heads(self) -> int:
        return int(self.weights.shape[0])

    @property
    def length(self) -> int:
        return int(self.weights.shape[1])


def _shapes(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, state0: np.ndarray | None
) -> tuple[int, int, int, int]:
    """(T, H, S_k, S_v) of a delta-rule input, or a ValueError naming the array whose shape disagrees."""
    if q.ndim != 3 or k.shape != q.shape:
        raise ValueError(f"q {q.shape} and k {k.shape} must both be (T, H, S_k)")
    n, h, s_k = q.shape
    if v.ndim != 3 or v.shape[:2] != (n, h):
        raise ValueError(f"v {v.shape} must be (T, H, S_v) = ({n}, {h}, S_v)")
    s_v = v.shape[2]
    for name, a in (("g", g), ("beta", beta)):
        if a.shape != (n, h):
            raise ValueError(f"{name} {a.shape} must be (T, H) = ({n}, {h})")
    if state0 is not None and state0.shape != (h, s_k, s_v):
        raise ValueError(f"state0 {state0.shape} must be (H, S_k, S_v) = ({h}, {s_k}, {s_v})")
    return n, h, s_k, s_v


def _decay(g: F64) -> F64:
    """D[t, s] = exp(g_{s+1} + ... + g_t) for s <= t, 0 above the diagonal: (T, T), from log-space differences."""
    cum = np.cumsum(g)
    n = len(g)
    lower = np.tril(np.ones((n, n), dtype=bool))
    return np.exp(np.where(lower, cum[:, None] - cum[None, :], -np.inf))  # exp(-inf) = 0 above the diagonal


def _right_solve_unit_lower(m: F64, l: F64, block: int = SOLVE_BLOCK) -> F64:
    """X with X (I + L) = M, L strictly lower triangular and M lower triangular, written over M: (T, T).

    Column blocks from the last to the first: X[:, J] = (M[:, J] - X[:, after J] L[after J, J]) (I + L)[J, J]^-1,
    and only rows from J's first on are non-zero (X is lower triangular like M).
    """
    n = m.shape[0]
    for j0 in range(((n - 1) // block) * block, -1, -block):
        j1 = min(j0 + block, n)
        rhs = m[j0:, j0:j1]  # (T - j0, b), a view: the block is overwritten with its solution
        if j1 < n:
            rhs -= m[j0:, j1:] @ l[j1:, j0:j1]
        diag = l[j0:j1, j0:j1] + np.eye(j1 - j0)  # unit lower triangular: partial pivoting never swaps rows
        m[j0:, j0:j1] = np.linalg.solve(diag.T, rhs.T).T
    return m


def _head_reads(q: F64, k: F64, g: F64, beta: F64, scale: float) -> F64:
    """W (T, T) of one value head from its q, k (T, S_k), g and beta (T,): M (I + L)^-1 diag(beta) * scale."""
    decay = _decay(g)  # (T, T)
    l = np.tril(beta[:, None] * decay * (k @ k.T), -1)  # (T, T) strictly lower
    m = decay * (q @ k.T)  # (T, T) lower, zeros above the diagonal come from decay
    w = _right_solve_unit_lower(m, l)
    w *= beta[None, :] * scale
    return np.tril(w)


def delta_rule_reads(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    g: npt.ArrayLike,
    beta: npt.ArrayLike,
    state0: npt.ArrayLike | None = None,
) -> RecurrentReads:
    """The exact map of what each token's output reads from every earlier value, and the initial state's part.

    q, k: (T, H, S_k) already L2-normalised and already expanded to the value heads; v: (T, H, S_v); g, beta:
    (T, H); state0: (H, S_k, S_v) with state0[h, i, j] = S[i, j] (key index i, value index j) or None (zeros).
    o_t of head h equals sum_s weights[h, t, s] v[s, h] + initial[h, t] (see the module docstring).
    """
    q, k, v, g, beta = (np.asarray(a, dtype=np.float64) for a in (q, k, v, g, beta))
    s0 = None if state0 is None else np.asarray(state0, dtype=np.float64)
    n, n_heads, s_k, s_v = _shapes(q, k, v, g, beta, s0)
    scale = 1.0 / math.sqrt(s_v)
    weights = np.zeros((n_heads, n, n), dtype=np.float32)
    initial = np.zeros((n_heads, n, s_v), dtype=np.float32)
    for h in range(n_heads if n else 0):
        w = _head_reads(q[:, h], k[:, h], g[:, h], beta[:, h], scale)  # (T, T)
        weights[h] = w
        if s0 is not None:
            kept_from_start = np.exp(np.cumsum(g[:, h]))[:, None]  # (T, 1) exp(G_t): <= 1, may underflow to 0
            read = kept_from_start * (q[:, h] @ s0[h]) * scale  # (T, S_v) E Q S_0 / sqrt(S_v)
            initial[h] = read - w @ (kept_from_start * (k[:, h] @ s0[h]))  # minus W E K S_0
    return RecurrentReads(
        weights=weights,
        initial=initial,
        wrote=np.ascontiguousarray(beta.T, dtype=np.float32),
        kept=np.ascontiguousarray(np.exp(g).T, dtype=np.float32),
    )


def delta_rule_outputs(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    g: npt.ArrayLike,
    beta: npt.ArrayLike,
    state0: npt.ArrayLike | None = None,
    dtype: npt.DTypeLike = np.float64,
) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence run token by token (float64 unless `dtype` says otherwise): outputs (T, H, S_v), final state.

    The order of ggml_compute_forward_gated_delta_net (ggml-cpu/ops.cpp): decay the state, read it with k,
    write beta (v - read) along k, then read the updated state with q and scale by 1 / sqrt(S_v). The state is
    (H, S_k, S_v), state[h, i, j] = S[i, j].
    """
    q, k, v, g, beta = (np.asarray(a, dtype=dtype) for a in (q, k, v, g, beta))
    s0 = None if state0 is None else np.asarray(state0, dtype=dtype)
    n, n_heads, s_k, s_v = _shapes(q, k, v, g, beta, s0)
    state = np.zeros((n_heads, s_k, s_v), dtype=dtype) if s0 is None else s0.copy()
    scale = np.asarray(1.0 / math.sqrt(s_v), dtype=dtype)
    out = np.zeros((n, n_heads, s_v), dtype=dtype)
    for t in range(n):
        state *= np.exp(g[t])[:, None, None]
        kv = np.einsum("hi,hij->hj", k[t], state)  # (H, S_v) S^T k_t
        delta = beta[t][:, None] * (v[t] - kv)  # (H, S_v)
        state += k[t][:, :, None] * delta[:, None, :]  # outer(k_t, d_t) per head
        out[t] = np.einsum("hi,hij->hj", q[t], state) * scale
    return out, state


def normalised_reads(weights: npt.ArrayLike) -> F32:
    """|W| / sum_s |W| along each row (last axis): the share of a token's read from each earlier token.

    This is what the heatmap draws. It forgets the signs (the delta rule subtracts old values as well as
    adding new ones) and the row's overall size (how much the output reads at all); rows that read nothing
    stay all zeros.
    """
    a = np.abs(np.asarray(weights, dtype=np.float32))
    total = a.sum(axis=-1, keepdims=True)
    return np.divide(a, total, out=np.zeros_like(a), where=total > 0)
