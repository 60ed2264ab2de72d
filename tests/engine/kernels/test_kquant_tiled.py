"""Plain-buffer k-quant products bit for bit as llama.cpp's ggml-cpu computes them: vec_dot below 8 rows, tiled from 8.

Fixture: tests/fixtures/kernels/kquant_tiled.npz, made by tools/make_kquant_tiled_fixtures.py from
llama-cpp-python's libggml-cpu (x86, AVX2 + AVX-512 VNNI build): MUL_MAT results of Q3_K, Q4_K, Q5_K and Q6_K
weights in the plain CPU buffer (44 rows, not repacked) for 1, 7, 8, 9, 16 and 33 activation rows. Below 8 rows
ggml-cpu runs ggml_vec_dot_q*_K_q8_K (engine.kernels.kquant.dot), from 8 its tiled path
(engine.kernels.kquant.tiled); BlockProduct is checked to pick the right one for the types it routes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from engine.kernels.kquant import dot as kquant_dot
from engine.kernels.kquant import tiled as kquant_tiled
from engine.kernels.dispatch import BlockProduct, compiled
from engine.kernels.q8k import quantize_q8_k
from engine.quant import GGMLType

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "kernels" / "kquant_tiled.npz"
TYPES = ("Q3_K", "Q4_K", "Q5_K", "Q6_K")
ROWS = (1, 7, 8, 9, 16, 33)
# the types whose BlockProduct follows the tiled path from TILED_MIN_ROWS rows (add Q3_K / Q5_K with dispatch.py)
PUBLIC_TYPES = ("Q3_K", "Q4_K", "Q5_K", "Q6_K")


def assert_bits_equal(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != {theirs.shape}"
    bad = np.flatnonzero(ours.view(np.uint32) != theirs.view(np.uint32))
    assert bad.size == 0, f"{what}: {bad.size} of {ours.size} differ, e.g. {ours.flat[bad[:3]]} vs {theirs.flat[bad[:3]]}"


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as f:
        return {k: f[k] for k in f.files}


def _vec_dot(t: str):
    return getattr(kquant_dot, f"gemm_{t.lower()}")


def _tiled(t: str):
    return getattr(kquant_tiled, f"gemm_tiled_{t.lower()}")


def test_fixture_covers_both_paths(golden) -> None:
    assert {k.rsplit("_", 1)[1] for k in golden if k.startswith("y_Q6_K_")} == {str(m) for m in ROWS}
    assert all(golden[f"w_{t}"].shape[0] % 8 != 0 for t in TYPES)  # Q4_K would be repacked at a multiple of 8
    assert kquant_tiled.TILED_MIN_ROWS == 8


def test_activation_bytes_match_llama_cpp(golden) -> None:
    assert np.array_equal(quantize_q8_k(golden["x"]), golden["xq"])


@pytest.mark.parametrize("t", TYPES)
def test_products_match_llama_cpp(golden, t: str) -> None:
    """vec_dot's gemm below 8 rows, the tiled kernel from 8, each equal to MUL_MAT; the other one is not."""
    w = golden[f"w_{t}"]
    for m in ROWS:
        xq, theirs = golden["xq"][:m], golden[f"y_{t}_{m}"]
        right, wrong = (_vec_dot(t), _tiled(t)) if m < kquant_tiled.TILED_MIN_ROWS else (_tiled(t), _vec_dot(t))
        assert_bits_equal(right(w, xq, np.empty((m, len(w)), np.float32)), theirs, f"{t} m={m}")
        other = wrong(w, xq, np.empty((m, len(w)), np.float32))
        assert not np.array_equal(other.view(np.uint32), theirs.view(np.uint32)), f"{t} m={m}: paths agree"


@pytest.mark.parametrize("t", TYPES)
def test_tiled_writes_strided_output(golden, t: str) -> None:
    """The tiled kernels write (m, n_rows) at any row stride (a slice of a wider output), nothing else."""
    w, xq = golden[f"w_{t}"], golden["xq"][:9]
    wide = np.full((9, len(w) + 12), np.float32(7.0))
    _tiled(t)(w, xq, wide[:, 4 : 4 + len(w)])
    assert_bits_equal(wide[:, 4 : 4 + len(w)], golden[f"y_{t}_9"], f"{t} strided")
    assert (wide[:, :4] == 7).all() and (wide[:, 4 + len(w) :] == 7).all()


@pytest.mark.skipif(not compiled(), reason="BlockProduct takes ggml's paths with the compiled kernels only")
@pytest.mark.parametrize("t", PUBLIC_TYPES)
def test_block_product_follows_llama_cpp(golden, t: str) -> None:
    w, x = golden[f"w_{t}"], golden["x"]
    product = BlockProduct(GGMLType[t], w, x.shape[1])
    assert product.path == "vec_dot" and product.tiled is not None
    for m in (1, 7, 8, 16, 33):
        assert_bits_equal(product(x[:m]), golden[f"y_{t}_{m}"], f"{t} BlockProduct m={m}")
