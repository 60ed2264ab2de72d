"""Repacked Q4_K products (q4_K_8x8_q8_K) bit for bit as llama.cpp's ggml-cpu computes them.

Fixture: tests/fixtures/kernels/q4k_repack.npz, made by tools/make_q4k_repack_fixtures.py from
llama-cpp-python's libggml-cpu (x86, AVX2 + AVX-512 build): MUL_MAT results of Q4_K weights held in
ggml-cpu's CPU_REPACK buffer for 1, 2, 3, 4, 5, 8 and 16 activation rows, and the block_q8_Kx4 bytes of
ggml_quantize_mat_q8_K_4x8. The compiled kernels and the NumPy reference are each checked against
llama.cpp, and against each other on fresh random blocks and activations.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from engine.kernels.kquant import repack as R
from engine.kernels.kquant import repack_ref as ref
from engine.kernels.q8k import quantize_q8_k, quantize_q8_k_ref

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "kernels" / "q4k_repack.npz"


def assert_bits_equal(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != {theirs.shape}"
    bad = np.flatnonzero(ours.view(np.uint32) != theirs.view(np.uint32))
    assert bad.size == 0, f"{what}: {bad.size} of {ours.size} differ, e.g. {ours.flat[bad[:3]]} vs {theirs.flat[bad[:3]]}"


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as f:
        return {k: f[k] for k in f.files}


def _cases(g: dict[str, np.ndarray]) -> list[tuple[str, str, int]]:
    out = []
    for k in sorted(g):
        if k.startswith("y_"):
            wcase, m = k[2:].rsplit("_", 1)
            out.append((k, wcase, int(m)))
    return out


def _inputs(g: dict[str, np.ndarray], wcase: str, m: int) -> tuple[np.ndarray, np.ndarray]:
    w = g[f"w_{wcase}"]
    return w, g[f"x_{w.shape[1] // ref.Q4K_BYTES * ref.QK_K}"][:m]


def test_fixture_covers_the_row_splits(golden) -> None:
    cases = _cases(golden)
    assert {m for _, _, m in cases} == {1, 2, 3, 4, 5, 8, 16}
    assert {"quantized", "random", "edge"} <= {w for _, w, _ in cases}


# ---- activations


def test_mat_quantizer_matches_llama_cpp(golden) -> None:
    """ggml_quantize_mat_q8_K_4x8's values (de-interleaved) for the rows of 4-row groups, from_float's for the rest."""
    for key in (k for k in golden if k.startswith("qx4_")):
        n = int(key[4:])
        x = golden[f"x_{n}"]
        theirs = ref.q8_kx4_rows_ref(golden[key], n)
        assert np.array_equal(ref.quantize_q8_k_4x8_ref(x), theirs), key
        assert np.array_equal(R.quantize_q8_k_mat(x), theirs), key  # 16 rows: all in 4-row groups
        assert not np.array_equal(quantize_q8_k_ref(x), theirs)  # the fixture holds the sign-tie rows
        for m in (1, 2, 3, 5, 7, 9):
            xq = R.quantize_q8_k_mat(x[:m])
            k = ref.mat_rows(m)
            assert np.array_equal(xq[:k], theirs[:k]), (key, m)
            assert np.array_equal(xq[k:], quantize_q8_k(x[k:m])), (key, m)
            assert np.array_equal(xq, ref.quantize_q8_k_mat_ref(x[:m])), (key, m)


def test_mat_quantizer_random_ties() -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((12, 1024)).astype(np.float32)
    for r in range(0, 12, 2):  # -amax before +amax in some blocks, +amax before -amax in others
        for blk in range(4):
            top = np.float32(np.abs(x[r, 256 * blk : 256 * blk + 256]).max() * 2)
            i, j = rng.choice(256, 2, replace=False) + 256 * blk
            x[r, i], x[r, j] = -top, top
    x[3, 256:512] = rng.standard_normal(256) * np.float32(1e-39)  # 127 / amax overflows to inf
    x[5, :256] = 0.0
    assert np.array_equal(R.quantize_q8_k_mat(x), ref.quantize_q8_k_mat_ref(x))
    assert np.array_equal(R.quantize_q8_k_mat(x[:9]), ref.quantize_q8_k_mat_ref(x[:9]))


# ---- products against llama.cpp


def test_compiled_products_match_llama_cpp(golden) -> None:
    for key, wcase, m in _cases(golden):
        w, x = _inputs(golden, wcase, m)
        weight = R.repack_q4_k_8x8(w)
        assert_bits_equal(R.matmul_q4_k_8x8(weight, x), golden[key], key)
        out = np.empty((m, len(w)), np.float32)
        R.gemm_q4_k_8x8(weight, R.quantize_q8_k_mat(x), out)  # the gemm entry for any m, 1 included
        assert_bits_equal(out, golden[key], f"{key} (gemm entry)")
        if m < 4:  # every row through the gemv
            for a in range(m):
                one = R.gemv_q4_k_8x8(weight, quantize_q8_k(x[a]), np.empty(len(w), np.float32))
                assert_bits_equal(one, golden[key][a], f"{key} row {a} (gemv)")


def test_reference_matches_llama_cpp(golden) -> None:
    for key, wcase, m in _cases(golden):
        w, x = _inputs(golden, wcase, m)
        assert_bits_equal(ref.matmul_q4_k_8x8_ref(w, x), golden[key], key)


def test_gemm_and_gemv_round_differently(golden) -> None:
    """The fixture distinguishes the two recurrences (else the row split would be untested)."""
    w, x = _inputs(golden, "quantized", 16)
    xq = quantize_q8_k_ref(x)
    assert not np.array_equal(ref.gemm_q4_k_8x8_ref(w, xq), ref.gemv_q4_k_8x8_ref(w, xq))


# ---- compiled against the reference on fresh inputs


def _random_q4_k(rng: np.random.Generator, rows: int, nb: int) -> np.ndarray:
    w = rng.integers(0, 256, (rows, nb, ref.Q4K_BYTES), dtype=np.uint8)
    w[..., 0:4] = (rng.standard_normal((rows, nb, 2)) * 0.004).astype("<f2").view(np.uint8).reshape(rows, nb, 4)
    w[0, 0, 4:16] = 0xFF  # max scales and mins
    w[0, 0, 16:] = 0xFF  # every quant 15
    w[-1, -1] = 0
    return w.reshape(rows, nb * ref.Q4K_BYTES)


@pytest.mark.parametrize("rows,nb,m", [(8, 1, 1), (16, 2, 3), (24, 3, 4), (8, 4, 7), (32, 1, 17), (16, 2, 36)])
def test_compiled_matches_reference_random(rows: int, nb: int, m: int) -> None:
    rng = np.random.default_rng(rows * 100 + nb * 10 + m)
    w = _random_q4_k(rng, rows, nb)
    x = (rng.standard_normal((m, nb * ref.QK_K)) * rng.uniform(0.01, 3, (m, 1))).astype(np.float32)
    x[0, 5], x[0, 9] = -50.0, 50.0  # a sign tie in row 0 (a gemm row when m >= 4)
    weight = R.repack_q4_k_8x8(w)
    assert_bits_equal(R.matmul_q4_k_8x8(weight, x), ref.matmul_q4_k_8x8_ref(w, x), f"{rows}x{nb} m={m}")
    xq = quantize_q8_k_ref(x)
    assert_bits_equal(R.gemv_q4_k_8x8(weight, xq[0], np.empty(rows, np.float32)), ref.gemv_q4_k_8x8_ref(w, xq[:1])[0],
                      "gemv")


@pytest.mark.parametrize("m", [2, 5, 16, 17, 40])
def test_gemv_rows_is_llama_cpps_gemv_on_each_row(golden, m: int) -> None:
    """MUL_MAT_ID's rows of one expert in one call: each row the fixture's gemv bits (its rows below 4), and
    bit for bit the one-row gemv on fresh rows, past a tile of 16."""
    for key, wcase, n in _cases(golden):
        if n >= 4:
            continue
        w, x = _inputs(golden, wcase, n)
        weight = R.repack_q4_k_8x8(w)
        xq = np.stack([quantize_q8_k(x[a]) for a in range(n)] * 2)
        out = np.full((2 * n, len(w)), np.nan, np.float32)
        R.gemv_rows_q4_k_8x8(weight, xq, out)
        assert_bits_equal(out, np.concatenate([golden[key], golden[key]]), f"{key} (gemv rows)")
    rng = np.random.default_rng(m)
    w = _random_q4_k(rng, 24, 2)
    weight = R.repack_q4_k_8x8(w)
    x = (rng.standard_normal((m, 512)) * rng.uniform(0.01, 3, (m, 1))).astype(np.float32)
    xq = np.stack([quantize_q8_k(row) for row in x])
    out = np.full((m, 24), np.nan, np.float32)
    R.gemv_rows_q4_k_8x8(weight, xq, out)
    for a in range(m):
        assert_bits_equal(out[a], R.gemv_q4_k_8x8(weight, xq[a], np.empty(24, np.float32)), f"row {a} of {m}")


def test_strided_output_rows() -> None:
    """gemm writes (m, n_rows) rows at any row stride (a column slice of a wider output)."""
    rng = np.random.default_rng(9)
    w = _random_q4_k(rng, 16, 2)
    x = rng.standard_normal((6, 512)).astype(np.float32)
    weight = R.repack_q4_k_8x8(w)
    wide = np.full((6, 40), np.float32(7.0))
    R.gemm_q4_k_8x8(weight, R.quantize_q8_k_mat(x), wide[:, 8:24])
    assert_bits_equal(wide[:, 8:24], R.matmul_q4_k_8x8(weight, x), "strided")
    assert (wide[:, :8] == 7).all() and (wide[:, 24:] == 7).all()


# ---- layout


def test_repack_layout_and_unpack() -> None:
    rng = np.random.default_rng(3)
    w = _random_q4_k(rng, 24, 3)
    weight = R.repack_q4_k_8x8(w)
    assert weight.shape == (3, 3 * R.GROUP_BYTES)
    assert np.array_equal(weight, ref.repack_q4_k_8x8_ref(w))
    assert np.array_equal(weight[1, 2 * R.GROUP_BYTES + 5 * 144 : 2 * R.GROUP_BYTES + 6 * 144], w[13, 2 * 144 : 3 * 144])
    assert np.array_equal(R.unpack_q4_k_8x8(weight), w)
    assert np.array_equal(ref.unpack_q4_k_8x8_ref(weight), w)
    assert np.array_equal(R.unpack_q4_k_8x8(weight, [0, 13, 23, 7]), w[[0, 13, 23, 7]])


def test_repack_refuses_what_llama_cpp_does_not_repack() -> None:
    assert ref.repacks(640, 2048) and not ref.repacks(644, 2048) and not ref.repacks(640, 100)
    with pytest.raises(ValueError, match="multiple of 8"):
        R.repack_q4_k_8x8(np.zeros((12, 144), np.uint8))
    with pytest.raises(ValueError):
        R.repack_q4_k_8x8(np.zeros((8, 100), np.uint8))
    weight = R.repack_q4_k_8x8(np.zeros((8, 288), np.uint8))
    with pytest.raises(ValueError):
        R.gemv_q4_k_8x8(weight, np.zeros(292, np.uint8), np.empty(8, np.float32))  # one block, weight has two
