"""Every expert's few rows in one call (engine.kernels.kquant.groups) give the one-expert kernels' bits: repacked
Q4_K against kquant_repack.gemv_rows_q4_k_8x8 (itself held to llama.cpp's gemv in test_kquant_band) and Q6_K
against kquant_dot.gemv_rows_q6_k (held to llama.cpp's vec_dot in test_kquant_kernels), on random bytes with
groups of 0 to 19 rows (past a tile of 16); the MoE layer takes the grouped call and keeps its numbers; a
malformed call is refused."""
from __future__ import annotations

import numpy as np
import pytest

from engine.kernels.activations import HAVE_NUMBA
from engine.quant import GGMLType
from engine.tensor import QTensor
from tests.engine.kernels.test_kquant_band import _q8k, _random_bytes

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="compiled kernels only")

SIZES = [3, 0, 1, 19, 2, 16, 5]  # rows per expert: none, one, a tile and more


def _random_q6_k(rng: np.random.Generator, rows: int, nb: int) -> np.ndarray:
    w = rng.integers(0, 256, (rows, nb, 210), dtype=np.uint8)
    d = (rng.standard_normal((rows, nb)) * 0.01).astype("<f2")
    w[..., 208:] = d.view(np.uint8).reshape(rows, nb, 2)
    return w.reshape(rows, nb * 210)


def _starts(sizes: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _xq(rng: np.random.Generator, nb: int) -> np.ndarray:
    return _q8k(rng.standard_normal((sum(SIZES), nb * 256)).astype(np.float32))


def _q4_k_case(rng: np.random.Generator, nb: int):
    """Repacked Q4_K experts of 24 rows: (weights, the grouped kernel and its shape arguments, the one-expert one)."""
    from engine.kernels.kquant import groups, repack  # noqa: PLC0415

    experts = [repack.repack_q4_k_8x8(_random_bytes(rng, 24, nb)) for _ in SIZES]
    shape = (np.int64(experts[0].shape[0]), np.int64(experts[0].shape[1]))
    return experts, 24, groups.gemv_groups_q4_k_8x8, shape, repack.gemv_rows_q4_k_8x8


def _q6_k_case(rng: np.random.Generator, nb: int):
    """Plain Q6_K experts of 20 rows, as _q4_k_case."""
    from engine.kernels.kquant import dot, groups  # noqa: PLC0415

    experts = [_random_q6_k(rng, 20, nb) for _ in SIZES]
    return experts, 20, groups.gemv_groups_q6_k, (np.int64(20), np.int64(nb * 210)), dot.gemv_rows_q6_k


@pytest.mark.parametrize("case", [_q4_k_case, _q6_k_case], ids=["Q4_K", "Q6_K"])
def test_the_groups_are_each_experts_rows(case) -> None:
    from engine.kernels.kquant import groups  # noqa: PLC0415

    rng = np.random.default_rng(5)
    nb = 3
    experts, width, grouped, shape, one = case(rng, nb)
    xq, starts = _xq(rng, nb), _starts(SIZES)
    got = np.full((len(xq), width), np.nan, np.float32)
    grouped(groups.addresses(experts), *shape, xq, starts, got)
    for e, w in enumerate(experts):
        a, z = starts[e], starts[e + 1]
        want = one(w, np.ascontiguousarray(xq[a:z]), np.empty((z - a, width), np.float32))
        assert np.array_equal(got[a:z].view(np.uint32), want.view(np.uint32)), e


def test_a_malformed_call_is_refused() -> None:
    from engine.kernels.kquant import groups  # noqa: PLC0415

    rng = np.random.default_rng(7)
    experts = [_random_q6_k(rng, 4, 1) for _ in range(2)]
    addrs = groups.addresses(experts)
    xq = _q8k(rng.standard_normal((3, 256)).astype(np.float32))
    out = np.empty((3, 4), np.float32)
    for starts in ([0, 2], [0, 2, 4], [0, 3, 2], [1, 2, 3]):  # too few, past the rows, decreasing, not from 0
        with pytest.raises(ValueError, match="starts"):
            groups.gemv_groups_q6_k(addrs, np.int64(4), np.int64(210), xq, np.array(starts, np.int64), out)
    with pytest.raises(ValueError, match="blocks"):
        groups.gemv_groups_q6_k(addrs, np.int64(4), np.int64(200), xq, np.array([0, 1, 3], np.int64), out)
    with pytest.raises(ValueError, match="out"):
        groups.gemv_groups_q6_k(addrs, np.int64(4), np.int64(210), xq, np.array([0, 1, 3], np.int64),
                                np.empty((3, 5), np.float32))


def test_the_moe_layer_runs_its_few_rows_in_one_call(monkeypatch) -> None:
    """A batch through a Q4_K expert layer: the few-rows groups go to the grouped kernel in one call, and the
    output is what each expert's own product gives its rows."""
    from engine.kernels.dispatch import Activation  # noqa: PLC0415
    from engine.kernels.kquant import groups, repack  # noqa: PLC0415
    from engine.models import experts as E  # noqa: PLC0415

    rng = np.random.default_rng(8)
    n_expert, n_out, nb = 6, 16, 2
    blocks = np.concatenate([_random_bytes(rng, n_out, nb) for _ in range(n_expert)])
    layer = E.ExpertLinear(QTensor("ffn_up_exps", GGMLType.Q4_K, (nb * 256, n_out, n_expert), blocks), nb * 256,
                           n_out, n_expert)
    calls = []
    real = E.EXPERT_GROUPS[repack.gemv_q4_k_8x8]
    monkeypatch.setitem(E.EXPERT_GROUPS, repack.gemv_q4_k_8x8,
                        lambda *a: calls.append(len(a[0])) or real(*a))
    assert real is groups.gemv_groups_q4_k_8x8
    x = rng.standard_normal((9, nb * 256)).astype(np.float32)
    ids = np.array([4, 0, 4, 2, 0, 4, 5, 0, 2])
    got = layer(Activation(x), ids)
    assert calls == [4]  # experts 0, 2, 4 and 5, each with fewer rows than any other kernel takes
    xq = Activation(x).bytes_for(layer.weight.qtype)
    for r, e in enumerate(ids):
        p = layer.product(int(e))
        want = p.gemv(p.weight, xq[r], np.empty(n_out, np.float32))
        assert np.array_equal(got[r].view(np.uint32), want.view(np.uint32)), r
    # groups that another kernel takes (here: from 3 rows) leave the others' rows gathered into one call
    monkeypatch.setattr(E, "_fewest_other", lambda p: 3)
    calls.clear()
    again = layer(Activation(x), ids)
    assert calls == [2]  # experts 2 and 5
    assert np.array_equal(again.view(np.uint32), got.view(np.uint32))
