"""Batches of the Q8_K i-quants and Q2_K bit for bit as llama.cpp's tiled MUL_MAT path computes them.

Fixtures from llama-cpp-python's libggml-cpu (x86, AVX2 + AVX-512 VNNI build): tests/fixtures/kernels/iquant_dot.npz
(tools/make_iquant_fixtures.py: 20 weight rows per i-quant, MUL_MAT of 9 activation rows, which takes the
tiled path) and tests/fixtures/kernels/kquant_tiled.npz (tools/make_kquant_tiled_fixtures.py: 44 Q2_K rows in
the plain buffer, MUL_MAT of 1 to 33 rows). engine.kernels.iquant.tiled must give every value; vec_dot's
order (iquant_dot) must not, so the test can tell the paths apart; BlockProduct must take each where llama.cpp does.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from engine.kernels import dispatch, paths
from engine.kernels.iquant import dot as iquant_dot
from engine.kernels.kquant import dot as kquant_dot
from engine.kernels.iquant.tiled import KINDS, gemm_tiled
from engine.kernels.q8k import quantize_q8_k
from engine.quant import GGMLType

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernels"
IQ_TYPES = ("IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M")


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def assert_bits_equal(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert ours.shape == theirs.shape, what
    bad = np.flatnonzero(bits(ours) != bits(theirs))
    assert bad.size == 0, f"{what}: {bad.size} of {ours.size} differ, e.g. {ours.flat[bad[:3]]} vs {theirs.flat[bad[:3]]}"


@pytest.fixture(scope="module")
def iq() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "iquant_dot.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def kq() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "kquant_tiled.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("name", IQ_TYPES)
def test_iquant_batches_are_llamacpp_tiled_path(iq, name: str) -> None:
    w, xq, theirs = iq[f"w_{name}"], iq["xq_Q8_K_768"][:9], iq[f"mul_mat_{name}_9"]
    ours = gemm_tiled(KINDS[name], w, xq, np.empty((9, len(w)), np.float32))
    assert_bits_equal(ours, theirs, f"{name} tiled, 9 rows")
    vec_dot = getattr(iquant_dot, f"gemm_{name.lower()}")(w, xq, np.empty((9, len(w)), np.float32))
    assert not np.array_equal(bits(vec_dot), bits(theirs)), f"{name}: the two orders agree, the test tells nothing"


@pytest.mark.parametrize("name", IQ_TYPES)
def test_block_product_takes_each_path_where_llamacpp_does(iq, name: str) -> None:
    """Under 8 rows vec_dot (MUL_MAT of 4 rows), from 8 the tiled path, through BlockProduct's own quantization."""
    w, x = iq[f"w_{name}"], iq["x_768"]
    product = dispatch.BlockProduct(GGMLType[name], w, 768)
    assert_bits_equal(product(x[:4]), iq[f"mul_mat_{name}_4"], f"{name} BlockProduct 4 rows")
    assert_bits_equal(product(x[:9]), iq[f"mul_mat_{name}_9"], f"{name} BlockProduct 9 rows")


def test_q2_k_batches_are_llamacpp_tiled_path(kq) -> None:
    w, xq = kq["w_Q2_K"], kq["xq"]
    assert len(w) % 8  # rows in eights are repacked by llama.cpp (q2_K_8x8 with AVX-512), not tiled
    product = dispatch.BlockProduct(GGMLType.Q2_K, w, w.shape[1] // 84 * 256)
    for m in (1, 7, 8, 9, 16, 33):
        theirs = kq[f"y_Q2_K_{m}"]
        assert_bits_equal(product(kq["x"][:m]), theirs, f"Q2_K BlockProduct {m} rows")
        if m >= 8:
            assert_bits_equal(gemm_tiled(KINDS["Q2_K"], w, xq[:m], np.empty((m, len(w)), np.float32)), theirs,
                              f"Q2_K tiled {m} rows")
            vec_dot = kquant_dot.gemm_q2_k(w, xq[:m], np.empty((m, len(w)), np.float32))
            assert not np.array_equal(bits(vec_dot), bits(theirs))


def test_tiled_writes_strided_output_and_refuses_bad_shapes(iq) -> None:
    w, xq = iq["w_IQ4_XS"], iq["xq_Q8_K_768"][:9]
    wide = np.full((9, len(w) + 6), np.float32(7.0))
    gemm_tiled(KINDS["IQ4_XS"], w, xq, wide[:, 3 : 3 + len(w)])
    assert_bits_equal(wide[:, 3 : 3 + len(w)], iq["mul_mat_IQ4_XS_9"], "strided")
    assert (wide[:, :3] == 7).all() and (wide[:, 3 + len(w) :] == 7).all()
    with pytest.raises(ValueError, match="whole number of blocks"):
        gemm_tiled(KINDS["IQ4_XS"], w[:, :-1], xq, np.empty((9, len(w)), np.float32))
    with pytest.raises(ValueError, match="Q8_K rows"):
        gemm_tiled(KINDS["IQ4_XS"], w, xq[:, :-292], np.empty((9, len(w)), np.float32))


def test_q2_k_rows_in_eights_are_llamacpp_q2_k_8x8(kq) -> None:
    """Q2_K rows in eights on AVX-512: llama.cpp's repacked gemv (one row, and rows left over) and gemm (rows in
    fours, one fma per 128 weights), through BlockProduct's own quantization; the plain paths differ."""
    with np.load(FIXTURES / "q2k_repack.npz") as f:
        golden = {k: f[k] for k in f.files}
    w, x = golden["w"], golden["x"]
    product = dispatch.BlockProduct(GGMLType.Q2_K, w, 768)
    if not paths.takes_q2_k_x8(GGMLType.Q2_K, len(w)):
        pytest.skip("no AVX-512 here: llama.cpp would not repack Q2_K either")
    assert product.path == "q2_k_x8"
    for m in (1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 33):
        theirs = golden[f"y_{m}"]
        assert_bits_equal(product(x[:m]), theirs, f"Q2_K x8 {m} rows")
        plain = kquant_dot.gemm_q2_k(w, quantize_q8_k(x[:m]), np.empty((m, len(w)), np.float32))
        assert not np.array_equal(bits(plain), bits(theirs))
    out = np.zeros((1, len(w)), np.float32)
    run = product.bind(np.ascontiguousarray(quantize_q8_k(x[2:3])), out)
    with dispatch.KERNEL_LOCK:
        run()
    assert_bits_equal(out, golden["y_3"][2:3], "bound gemv")


def test_the_streamed_q2_k_gemv_equals_the_decoded_one_on_any_bytes() -> None:
    """engine.kernels.iquant.q2_k_gemv (integers straight off the blocks) against tiled.gemv_q2_k_x8 (rows decoded
    into scratch first), on blocks of random bytes (any scales, mins, d and dmin) and a Q8_K row: the same bits."""
    from engine.kernels.iquant.q2_k_gemv import gemv_q2_k_rows
    from engine.kernels.iquant.tiled import gemv_q2_k_x8

    rng = np.random.default_rng(7)
    for rows, cols in ((8, 256), (40, 2048), (13, 512), (3, 768)):  # rows in eights, and rows left over
        w = rng.integers(0, 256, (rows, cols // 256 * 84), dtype=np.uint8)
        w[:, 80:84] = np.frombuffer((rng.standard_normal(2 * rows) * 0.01).astype("<f2").tobytes(), np.uint8).reshape(rows, 4)
        w.flags.writeable = False
        xq = np.asarray(quantize_q8_k((rng.standard_normal((1, cols)) * 2).astype(np.float32))).reshape(-1)
        ours, ref = np.full(rows, np.nan, np.float32), np.full(rows, np.nan, np.float32)
        gemv_q2_k_rows(w, xq, ours)
        gemv_q2_k_x8(w, xq, ref)
        assert_bits_equal(ours, ref, f"{rows}x{cols}")
