"""Each op's VJP against central finite differences in float64, on the tape alone (no model)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from engine.grad.tape import NoVJP, Tape

RNG = np.random.default_rng(7)


def check(fn: Callable, *shapes: tuple[int, ...], eps: float = 1e-6) -> None:
    """d sum(w * fn(x...)) by the tape against central differences, every entry of every input."""
    xs = [RNG.standard_normal(s) for s in shapes]
    tape = Tape(np.float64)
    leaves = [tape.leaf(x) for x in xs]
    out = fn(*leaves)
    w = RNG.standard_normal(out.shape)
    grads = tape.backward(np.sum(out * w), [v.idx for v in leaves])

    def f(vals: list[np.ndarray]) -> float:
        t = Tape(np.float64)
        return float(np.sum(fn(*[t.leaf(v) for v in vals]).value * w))

    for k, x in enumerate(xs):
        for idx in np.ndindex(x.shape):
            up = [v.copy() for v in xs]
            down = [v.copy() for v in xs]
            up[k][idx] += eps
            down[k][idx] -= eps
            fd = (f(up) - f(down)) / (2 * eps)
            got = grads[leaves[k].idx][idx]
            assert abs(got - fd) <= 1e-6 * max(1.0, abs(fd)), (k, idx, got, fd)


CASES = {
    "add_broadcast": (lambda a, b: a + b, (3, 4), (4,)),
    "mul_sub_div": (lambda a, b: (a * b - b) / (2.0 + a * a), (2, 3), (2, 3)),
    "exp_tanh_sqrt": (lambda a: np.exp(np.tanh(a)) + np.sqrt(a * a + 1.0), (5,)),
    "matmul_batched": (lambda a, b: a @ b.transpose(0, 2, 1), (2, 3, 4), (2, 5, 4)),
    "matmul_const": (lambda a: a @ np.arange(12.0).reshape(4, 3), (2, 4)),
    "mean_square_keepdims": (lambda a: a / np.sqrt(np.mean(np.square(a), axis=-1, keepdims=True) + 1e-5), (3, 4)),
    "max_where": (lambda a: np.where(a > 0, a, -np.inf).max(axis=-1) + np.max(a), (3, 4)),
    "softmax": (lambda a: np.exp(a - np.max(a.detach(), axis=-1, keepdims=True))
                / np.sum(np.exp(a - np.max(a.detach(), axis=-1, keepdims=True)), axis=-1, keepdims=True), (2, 5)),
    "reshape_transpose_getitem": (lambda a: a.reshape(2, 3, 2).transpose(1, 0, 2)[:, 1, ::-1] * 3.0, (12,)),
    "fancy_getitem_repeats": (lambda a: a[[0, 2, 0]] * a[np.array([1, 1, 2])], (3, 2)),
    "setitem": (lambda a, b: _setitem(a, b), (4, 3), (3,)),
    "concatenate_stack": (lambda a, b: np.concatenate([np.stack([a, b], axis=-1).reshape(2, 6), a], axis=1), (2, 3),
                          (2, 3)),
    "min_max_clip": (lambda a, b: np.minimum(a, 0.3) * np.maximum(b, -0.2) + np.clip(a, -0.5, 0.5), (7,), (7,)),
    "sigmoid_silu": (lambda a: a / (1.0 + np.exp(-a)) + 1.0 / (1.0 + np.exp(-a)), (6,)),
}


def _setitem(a, b):  # noqa: ANN001, ANN202 - an in-place write, as apply_rope does
    out = a.copy()
    out[1] = b * 2.0
    out[..., 0] = a[..., 2]
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_vjp_matches_finite_differences(name: str) -> None:
    fn, *shapes = CASES[name]
    check(fn, *shapes)


def test_an_op_without_a_vjp_is_named() -> None:
    tape = Tape(np.float64)
    x = tape.leaf(np.ones(3))
    with pytest.raises(NoVJP, match="numpy.sin"):
        np.sin(x)
    with pytest.raises(NoVJP, match="plain array"):
        np.asarray(x)
    with pytest.raises(NoVJP, match="numpy.cumsum"):
        np.cumsum(x)
