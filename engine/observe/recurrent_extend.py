"""A recurrent layer's reads grown by a few positions: the new rows only, not the whole window again.

While a reply streams, the lenses ask for the reads of a recording a few positions longer than the last time.
engine.observe.recurrent.delta_rule_reads decomposes a window with a triangular solve of T^3 / 3 per value head;
here the rows of the positions added since are computed on their own, and the rows before them are kept: the map
is causal, W[t, s] depends on positions s..t only, so an old row does not change when the recording grows.

Rows one at a time (the same W as delta_rule_reads, derived from the recurrence `delta_rule_outputs` runs). With
F_u = exp(g_u) (I - beta_u k_u k_u^T) (symmetric), one token's update is S_u = F_u S_{u-1} + beta_u k_u v_u^T, so
    o_t = scale S_t^T q_t
    W[t, s] = scale beta_s k_s . (F_{s+1} ... F_t q_t)          initial[t] = scale S_0^T (F_1 ... F_t q_t)
(the window's positions counted 1..T, S_0 the state before it, scale = 1 / sqrt(S_v)). Carrying x = q_t back
through the window, x <- F_u x from u = t down to 1, reads row t off at every step: T steps of S_k multiply-adds
per row and head, float64, and the new rows of all value heads go back together (`delta_rule_rows`).

The window's start moves in strides (`window_start`): it holds the last `window` positions and up to
`window_stride(window) - 1` more, and stays where it is until the recording has grown by a stride, so that most
growths keep the start and only add rows. When the start moves the kept rows lose their first columns (the values
now before the window) and their earlier-context term is run again through the recurrence from the state the new
window starts from (`extend_reads`), still no triangular solve.
"""
from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from engine.observe.recurrent import RecurrentReads, _shapes, delta_rule_outputs

F64 = npt.NDArray[np.float64]
STRIDE = 64  # the most positions a window's start moves at once (and the most positions past `window` it holds)


def window_stride(window: int) -> int:
    """How far a window of `window` positions moves its start at once: window / 8, between 1 and STRIDE."""
    return max(1, min(STRIDE, int(window) // 8))


def window_start(n: int, window: int) -> int:
    """The first position decomposed of a recording of `n`: 0 up to `window` positions, then a multiple of the
    stride, the latest that leaves at least `window` positions after it (so the window holds from `window` up to
    window + stride - 1 positions, and the start changes once every stride positions of growth)."""
    if n <= window:
        return 0
    step = window_stride(window)
    return ((int(n) - int(window)) // step) * step


def delta_rule_rows(
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    g: npt.ArrayLike,
    beta: npt.ArrayLike,
    state0: npt.ArrayLike | None,
    first: int,
) -> tuple[F64, F64]:
    """Rows first..T-1 of delta_rule_reads(q, k, v, g, beta, state0): weights (H, R, T) and initial (H, R, S_v),
    float64 (R = T - first; v gives S_v only). Each row's query is carried back through the window (module
    docstring)."""
    q, k, v, g, beta = (np.asarray(a, dtype=np.float64) for a in (q, k, v, g, beta))
    s0 = None if state0 is None else np.asarray(state0, dtype=np.float64)
    n, n_heads, _s_k, s_v = _shapes(q, k, v, g, beta, s0)
    first = int(first)
    rows = max(0, n - first)
    initial = np.zeros((n_heads, rows, s_v), dtype=np.float64)
    if not rows:
        return np.zeros((n_heads, rows, n), dtype=np.float64), initial
    by_key = np.zeros((n, n_heads, rows), dtype=np.float64)  # (T, H, R): weights by column, filled a column a step
    x = q[first:].transpose(1, 0, 2).copy()  # (H, R, S_k): row first + r's query, carried back (a copy: written over)
    written = beta[:, :, None] * k  # (T, H, S_k) beta_u k_u
    kept = np.exp(g)  # (T, H)
    for u in range(n - 1, -1, -1):
        r0 = max(0, u - first)  # rows t >= u: a later row does not read position u yet
        xs = x[:, r0:]
        dot = np.matmul(xs, k[u][:, :, None])[..., 0]  # (H, R') k_u . x
        by_key[u, :, r0:] = dot * beta[u][:, None]
        xs -= dot[:, :, None] * written[u][:, None, :]  # x <- F_u x
        xs *= kept[u][:, None, None]
    scale = 1.0 / math.sqrt(s_v)
    weights = by_key.transpose(1, 2, 0) * scale  # (H, R, T)
    if s0 is not None:
        initial = np.matmul(x, s0) * scale  # (H, R, S_v) S_0^T (F_0 ... F_t q_t) / sqrt(S_v)
    return weights, initial


def extend_reads(
    old: RecurrentReads,
    shift: int,
    q: npt.ArrayLike,
    k: npt.ArrayLike,
    v: npt.ArrayLike,
    g: npt.ArrayLike,
    beta: npt.ArrayLike,
    state0: npt.ArrayLike | None = None,
) -> RecurrentReads:
    """delta_rule_reads(q, k, v, g, beta, state0) of a window that starts `shift` positions after `old`'s and
    continues it: the inputs' first old.length - shift positions are the last ones `old` decomposed (the caller
    checks that). Those rows keep their weights (less the first `shift` columns); without a shift they keep their
    initial term too, with one it is the recurrence run from `state0` with zero values (the state's part of each
    output, exactly as delta_rule_reads defines it). The rows after them come from delta_rule_rows."""
    q, k, v, g, beta = (np.asarray(a, dtype=np.float64) for a in (q, k, v, g, beta))
    s0 = None if state0 is None else np.asarray(state0, dtype=np.float64)
    n, n_heads, _s_k, s_v = _shapes(q, k, v, g, beta, s0)
    shift = int(shift)
    kept_rows = old.length - shift
    if shift < 0 or not 0 < kept_rows <= n or old.n_heads != n_heads:
        raise ValueError(f"a window of {n} positions {shift} after one of {old.length} does not continue it")
    if shift and s0 is None:
        raise ValueError("a window that moved starts from a state: state0 is needed")
    weights = np.zeros((n_heads, n, n), dtype=np.float32)
    initial = np.zeros((n_heads, n, s_v), dtype=np.float32)
    weights[:, :kept_rows, :kept_rows] = old.weights[:, shift:, shift:]
    if not shift:
        initial[:, :kept_rows] = old.initial
    else:
        part = slice(0, kept_rows)
        out, _ = delta_rule_outputs(q[part], k[part], np.zeros_like(v[part]), g[part], beta[part], s0)
        initial[:, :kept_rows] = out.transpose(1, 0, 2)
    w, init = delta_rule_rows(q, k, v, g, beta, s0, kept_rows)
    weights[:, kept_rows:] = w
    initial[:, kept_rows:] = init
    return RecurrentReads(
        weights=weights,
        initial=initial,
        wrote=np.ascontiguousarray(beta.T, dtype=np.float32),
        kept=np.ascontiguousarray(np.exp(g).T, dtype=np.float32),
    )
