"""The gated DeltaNet read map: W and the initial-state term rebuild the step-by-step recurrence exactly."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from engine.observe.recurrent import (
    RecurrentReads,
    _right_solve_unit_lower,
    delta_rule_outputs,
    delta_rule_reads,
    normalised_reads,
)

H = 3


def _l2(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _inputs(n: int, s: int, seed: int, with_state: bool, gate_scale: float = 1.0) -> dict[str, np.ndarray | None]:
    """Random delta-rule inputs shaped as a Qwen3.5 layer gives them: unit q and k, g <= 0, beta in (0, 1)."""
    rng = np.random.default_rng(seed)
    softplus = np.log1p(np.exp(rng.normal(size=(n, H))))
    return {
        "q": _l2(rng.normal(size=(n, H, s))),
        "k": _l2(rng.normal(size=(n, H, s))),
        "v": rng.normal(size=(n, H, s)),
        "g": -softplus * rng.uniform(0.05, 2.0, size=(n, H)) * gate_scale,
        "beta": 1.0 / (1.0 + np.exp(-rng.normal(size=(n, H)))),
        "state0": rng.normal(size=(H, s, s)) if with_state else None,
    }


def _rebuilt(reads: RecurrentReads, v: np.ndarray, with_initial: bool = True) -> np.ndarray:
    """sum_s W[h, t, s] v[s, h] (+ initial): (T, H, S_v) like the recurrence's outputs."""
    out = np.einsum("hts,shj->thj", reads.weights.astype(np.float64), v)
    if with_initial:
        out += reads.initial.astype(np.float64).transpose(1, 0, 2)
    return out


def _rel_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("s", [16, 64])
@pytest.mark.parametrize("n", [1, 7, 64, 300])
def test_weights_and_initial_rebuild_the_recurrence(n: int, s: int, with_state: bool) -> None:
    x = _inputs(n, s, seed=n * 1000 + s + with_state, with_state=with_state)
    reads = delta_rule_reads(**x)
    expected, _ = delta_rule_outputs(**x)
    assert reads.weights.shape == (H, n, n) and reads.weights.dtype == np.float32
    assert reads.initial.shape == (H, n, s) and reads.initial.dtype == np.float32
    assert _rel_error(_rebuilt(reads, x["v"]), expected) < 1e-5
    np.testing.assert_allclose(reads.wrote, x["beta"].T, rtol=1e-6)
    np.testing.assert_allclose(reads.kept, np.exp(x["g"]).T, rtol=1e-6)
    if not with_state:
        assert not reads.initial.any()


def test_the_initial_state_term_is_needed_and_the_gates_matter() -> None:
    """Negative controls: leaving out `initial`, or a W without the delta rule's erasing, does not rebuild o."""
    x = _inputs(64, 16, seed=5, with_state=True)
    reads = delta_rule_reads(**x)
    expected, _ = delta_rule_outputs(**x)
    assert _rel_error(_rebuilt(reads, x["v"], with_initial=False), expected) > 1e-2
    # plain gated linear attention (no erasing): W'[t, s] = D[t, s] beta_s (q_t . k_s) / sqrt(S_v)
    cum = np.cumsum(x["g"], axis=0).T  # (H, T)
    decay = np.tril(np.exp(np.minimum(cum[:, :, None] - cum[:, None, :], 0.0)))
    linear = decay * np.einsum("thi,shi->hts", x["q"], x["k"]) * x["beta"].T[:, None, :] / 4.0
    assert np.abs(linear - reads.weights).max() > 1e-2


def test_strong_decay_stays_finite_and_forgets() -> None:
    x = _inputs(200, 16, seed=7, with_state=True)
    x["g"] = -30.0 + np.random.default_rng(8).normal(scale=0.5, size=(200, H))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow, no invalid value
        reads = delta_rule_reads(**x)
    expected, _ = delta_rule_outputs(**x)
    assert np.isfinite(reads.weights).all() and np.isfinite(reads.initial).all()
    assert _rel_error(_rebuilt(reads, x["v"]), expected) < 1e-5
    # exp(-30) ~ 1e-13: each token reads (almost) only itself, and the initial state is gone after token 0
    off_diagonal = reads.weights - np.einsum("htt->ht", reads.weights)[:, :, None] * np.eye(200)
    assert np.abs(off_diagonal).max() < 1e-10
    assert np.abs(reads.initial).max() < 1e-10


def test_gates_far_past_underflow_give_exact_zeros() -> None:
    x = _inputs(50, 16, seed=9, with_state=True)
    x["g"] = np.full((50, H), -1000.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reads = delta_rule_reads(**x)
    assert np.isfinite(reads.weights).all()
    assert not np.tril(reads.weights, -1).any() and not reads.initial.any()


def test_no_token_reads_the_future() -> None:
    x = _inputs(64, 16, seed=11, with_state=True)
    w = delta_rule_reads(**x).weights
    assert not np.triu(w, 1).any()
    assert np.abs(np.tril(w)).max() > 0


def test_orthonormal_keys_with_beta_one_store_and_read_back_values() -> None:
    """beta = 1, no decay, orthonormal keys: the state is a key -> value memory and a query equal to a key reads
    back exactly the value last stored under it (the delta rule overwrites; linear attention would add)."""
    s, rng = 16, np.random.default_rng(13)
    basis = np.linalg.qr(rng.normal(size=(s, s)))[0].T  # rows orthonormal
    key_of = np.array([0, 1, 2, 3, 0, 4, 1, 5])  # keys 0 and 1 are written twice
    read_of = np.array([0, 0, 1, 2, 0, 3, 1, 2])  # the key each token queries with
    n = len(key_of)
    k = np.repeat(basis[key_of][:, None, :], H, axis=1)  # (T, H, S)
    q = np.repeat(basis[read_of][:, None, :], H, axis=1)
    v = rng.normal(size=(n, H, s))
    reads = delta_rule_reads(q, k, v, np.zeros((n, H)), np.ones((n, H)))
    expected = np.zeros((n, n))
    for t in range(n):
        last = max(u for u in range(t + 1) if key_of[u] == read_of[t])
        expected[t, last] = 1.0 / np.sqrt(s)
    for h in range(H):
        np.testing.assert_allclose(reads.weights[h], expected, atol=1e-6)
    out, _ = delta_rule_outputs(q, k, v, np.zeros((n, H)), np.ones((n, H)))
    np.testing.assert_allclose(out[4, 0], v[4, 0] / np.sqrt(s), atol=1e-12)  # key 0 rewritten: v_0 is gone


def test_empty_sequence_gives_empty_arrays() -> None:
    x = _inputs(0, 16, seed=0, with_state=True)
    reads = delta_rule_reads(**x)
    assert reads.weights.shape == (H, 0, 0) and reads.initial.shape == (H, 0, 16)
    assert reads.wrote.shape == (H, 0) and reads.kept.shape == (H, 0)
    assert reads.length == 0 and reads.n_heads == H
    out, state = delta_rule_outputs(**x)
    assert out.shape == (0, H, 16)
    np.testing.assert_array_equal(state, x["state0"])


def test_float32_recurrence_as_llama_cpp_runs_it_matches_the_float64_map() -> None:
    x = _inputs(300, 64, seed=17, with_state=True)
    x32 = {key: None if a is None else a.astype(np.float32) for key, a in x.items()}
    out32, state32 = delta_rule_outputs(**x32, dtype=np.float32)
    assert out32.dtype == np.float32 and state32.dtype == np.float32
    reads = delta_rule_reads(**x32)
    assert _rel_error(_rebuilt(reads, x32["v"].astype(np.float64)), out32.astype(np.float64)) < 1e-4


def test_final_state_carries_over_between_calls() -> None:
    """Splitting a sequence and passing the final state on gives the same outputs and the same initial-state split."""
    x = _inputs(40, 16, seed=19, with_state=False)
    whole, _ = delta_rule_outputs(**x)
    first = {key: None if a is None else a[:25] for key, a in x.items()}
    _, state = delta_rule_outputs(**first)
    rest = {key: None if a is None else a[25:] for key, a in x.items()}
    rest["state0"] = state
    tail_reads = delta_rule_reads(**rest)
    assert _rel_error(_rebuilt(tail_reads, rest["v"]), whole[25:]) < 1e-5
    assert np.abs(tail_reads.initial).max() > 1e-3  # the first 25 tokens arrive through the state


def test_blocked_triangular_solve_matches_a_dense_solve() -> None:
    rng = np.random.default_rng(23)
    n = 150  # three column blocks, the last one partial
    l = np.tril(rng.normal(scale=0.1, size=(n, n)), -1)
    m = np.tril(rng.normal(size=(n, n)))
    x = _right_solve_unit_lower(m.copy(), l, block=64)
    np.testing.assert_allclose(x @ (np.eye(n) + l), m, atol=1e-10)
    assert not np.triu(x, 1).any()


def test_normalised_reads_are_row_shares_of_magnitude() -> None:
    w = np.array([[[2.0, 0.0, 0.0], [-1.0, 3.0, 0.0], [0.0, 0.0, 0.0]]], dtype=np.float32)
    shares = normalised_reads(w)
    assert shares.dtype == np.float32 and shares.shape == w.shape
    np.testing.assert_allclose(shares[0], [[1.0, 0.0, 0.0], [0.25, 0.75, 0.0], [0.0, 0.0, 0.0]])
    x = _inputs(30, 16, seed=29, with_state=False)
    shares = normalised_reads(delta_rule_reads(**x).weights)
    assert (shares >= 0).all()
    np.testing.assert_allclose(shares.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    ("field", "shape", "message"),
    [("k", (5, H, 8), "must both be"), ("v", (4, H, 16), "v "), ("g", (5, 2), "g "), ("state0", (H, 16, 8), "state0")],
)
def test_mismatched_shapes_are_named(field: str, shape: tuple[int, ...], message: str) -> None:
    x = _inputs(5, 16, seed=31, with_state=True)
    x[field] = np.zeros(shape)
    with pytest.raises(ValueError, match=message):
        delta_rule_reads(**x)
