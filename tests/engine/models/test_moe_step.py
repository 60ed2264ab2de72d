"""A decode step's routing in compiled code (engine.ops.moe_kernels) gives the NumPy steps' bits (engine.models.experts:
`route`, the slots' weighted sum), which test_moe and test_arch_logits hold to llama.cpp: both gatings, with and
without renormalisation, rows shorter than a softmax chunk (the scalar tail) and longer, ties, ablated (-inf) and
NaN logits, both builds' softmax chunks."""
from __future__ import annotations

import numpy as np
import pytest

from engine.kernels import isa
from engine.kernels.dispatch import compiled
from engine.models.experts import route
from engine.ops import ggml

pytestmark = pytest.mark.skipif(not compiled(), reason="needs the compiled (numba) kernels")


class _Ops:
    softmax = staticmethod(ggml.soft_max)


def _logits(rng: np.random.Generator, n: int, case: str) -> np.ndarray:
    x = (rng.standard_normal((1, n)) * 3).astype(np.float32)
    if case == "ties":
        x[0, ::3] = x[0, 1]
    elif case == "ablated":
        x[0, rng.choice(n, n // 2, replace=False)] = -np.inf
    elif case == "nan":
        x[0, rng.integers(n)] = np.nan
    return x


@pytest.mark.parametrize("bits", ["avx512", "avx2"])
@pytest.mark.parametrize(("n", "k", "normalize", "gating"), [(8, 2, True, "softmax"), (128, 8, True, "softmax"),
                                                               (60, 4, False, "softmax"), (32, 4, False, "softmax_weight")])
@pytest.mark.parametrize("case", ["plain", "ties", "ablated", "nan"])
def test_route_one_is_routes_bits(bits: str, n: int, k: int, normalize: bool, gating: str, case: str) -> None:
    from engine.ops.moe_kernels import ROUTE_ONE

    rng = np.random.default_rng(n * 10 + k)
    with isa.forced_bits(bits):
        for _ in range(50):
            logits = _logits(rng, n, case)
            want = route(logits, k, _Ops(), normalize, gating, display=False)
            ids, weights = np.empty(k, np.int64), np.empty(k, np.float32)
            ROUTE_ONE[bool(isa.w8())](logits[0], k, normalize, gating == "softmax_weight", ids, weights)
            assert ids.tolist() == want.experts[0].tolist()
            assert np.array_equal(weights.view(np.uint32), want.weights[0].view(np.uint32)), (weights, want.weights)


def test_the_two_softmax_orders_differ() -> None:
    """The AVX2 build's 8-float chunks give other bits than the AVX-512 build's 16 here, so the test above can fail."""
    from engine.ops.moe_kernels import ROUTE_ONE

    rng = np.random.default_rng(3)
    differ = 0
    for _ in range(50):
        logits = (rng.standard_normal(128) * 3).astype(np.float32)
        got = []
        for w8 in (False, True):
            ids, weights = np.empty(8, np.int64), np.empty(8, np.float32)
            ROUTE_ONE[w8](logits, 8, True, False, ids, weights)
            got.append(weights)
        differ += not np.array_equal(got[0], got[1])
    assert differ


def test_combine_is_the_slots_sum_in_order() -> None:
    from engine.ops.moe_kernels import combine

    rng = np.random.default_rng(4)
    down = (rng.standard_normal((8, 200)) * 10).astype(np.float32)
    weights = rng.random(8).astype(np.float32)
    y = down * weights[:, None]
    want = y[0].copy()
    for s in range(1, 8):
        want = want + y[s]
    out = np.empty(200, np.float32)
    combine(down, weights, out)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
