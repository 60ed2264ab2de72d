"""MXFP4 products (gpt-oss's expert type) bit for bit with llama.cpp's ggml-cpu on this host's build: vec_dot
(ggml_vec_dot_mxfp4_q8_0) for rows not in eights, the mxfp4_8x8 repack's gemv and gemm for rows in eights
(tests/fixtures/kernels/mxfp4_dot.npz, from tools/make_mxfp4_product_fixtures.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.kernels.activations import quantize_activation
from engine.kernels.dispatch import BlockProduct, compiled
from engine.quant import dequantize_rows
from engine.quant.types import GGMLType

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "kernels" / "mxfp4_dot.npz"
T = GGMLType


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as f:
        return {k: f[k] for k in f.files}


def same_bits(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != {theirs.shape}"
    bad = np.flatnonzero(ours.astype(np.float32).view(np.uint32) != theirs.view(np.uint32))
    assert bad.size == 0, f"{what}: {bad.size} of {ours.size} differ, e.g. {ours.flat[bad[:3]]} vs {theirs.flat[bad[:3]]}"


def _kernels():
    if not compiled():
        pytest.skip("the compiled kernels are not in use")
    from engine.kernels.iquant import dot

    return dot


def test_the_activations_are_ggml_cpus_q8_0(golden) -> None:
    np.testing.assert_array_equal(quantize_activation(T.MXFP4, golden["x"]), golden["xq"])


def test_vec_dot_and_the_8x8_repack_equal_llama_cpp(golden) -> None:
    dot = _kernels()
    w, xq = golden["w"], golden["xq"]
    for a in range(len(xq)):
        same_bits(dot.gemv_mxfp4(w, xq[a], np.empty(len(w), np.float32)), golden["dot"][a], f"vec_dot row {a}")
    for m in (1, 4, 9):
        out = np.empty((m, len(w)), np.float32)
        same_bits(dot.gemm_mxfp4(w, xq[:m], out), golden[f"mul_mat_{m}"], f"mul_mat m={m}")
        out = np.empty((m, 16), np.float32)
        same_bits(dot.gemm_mxfp4_x8(w[:16], xq[:m], out), golden[f"mul_mat_repack_{m}"], f"mxfp4_8x8 gemm m={m}")
        for a in range(m):
            one = dot.gemv_mxfp4_x8(w[:16], xq[a], np.empty(16, np.float32))
            same_bits(one, golden[f"mul_mat_repack_{m}"][a], f"mxfp4_8x8 gemv row {a}")
    # the two paths round differently on these rows (else the repack's order would be untested)
    assert not np.array_equal(golden["mul_mat_repack_9"], golden["mul_mat_9"][:, :16])


def test_eight_rows_at_once_are_each_rows_value(golden) -> None:
    """The x8 gemv runs eight rows per step (simd.rows8_mxfp4_x8): each row's value is the one-row x8 dot's (the
    gemm's tile on one activation), for a row count past the eights too, and for routed experts in one call."""
    dot = _kernels()
    w, xq = golden["w"], golden["xq"]
    n = min(len(w), 21)
    for a in range(len(xq)):
        want = dot.gemm_mxfp4_x8(w[:n], xq[a : a + 1], np.empty((1, n), np.float32))[0]
        same_bits(dot.gemv_mxfp4_x8(w[:n], xq[a], np.empty(n, np.float32)), want, f"gemv x8 row {a}")
    experts = (np.ascontiguousarray(w[:16]), np.ascontiguousarray(w[16:32]) if len(w) >= 32 else w[:16].copy())
    rows = np.array([1, 0], np.int64)
    out = np.empty((2, 16), np.float32)
    dot.gemv_experts_mxfp4_x8(experts, xq, rows, out)
    for i, e in enumerate(experts):
        same_bits(out[i], dot.gemv_mxfp4_x8(e, xq[rows[i]], np.empty(16, np.float32)), f"expert {i}")
    with pytest.raises(ValueError, match="contiguous"):
        dot.gemv_mxfp4_x8(w[:16], xq[0], np.empty(32, np.float32)[::2])


def test_the_product_takes_llama_cpps_path_by_row_count(golden) -> None:
    _kernels()
    w, x = golden["w"], golden["x"]
    eights = BlockProduct(T.MXFP4, w[:16], x.shape[1])
    assert eights.path == "mxfp4_x8"
    same_bits(eights(x[:1]), golden["mul_mat_repack_1"], "one row, rows in eights")
    same_bits(eights(x[:9]), golden["mul_mat_repack_9"], "a batch, rows in eights")
    other = BlockProduct(T.MXFP4, w[:20], x.shape[1])  # 20 rows: no repack, vec_dot
    assert other.path == "vec_dot"
    same_bits(other(x[:1]), golden["dot"][:1, :20], "one row, vec_dot")
    same_bits(other(x[:9]), golden["mul_mat_9"][:, :20], "a batch, vec_dot")


def test_the_products_are_near_the_dequantized_weights(golden) -> None:
    """Against float64 on the dequantized weights (a check of the tables and scales, independent of ggml)."""
    _kernels()
    w, x = golden["w"][:12], golden["x"]  # the rows llama.cpp quantized
    exact = x.astype(np.float64) @ dequantize_rows(w, T.MXFP4).astype(np.float64).T
    ours = BlockProduct(T.MXFP4, w, x.shape[1])(x)
    scale = np.abs(x).max(axis=1, keepdims=True) * np.abs(dequantize_rows(w, T.MXFP4)).sum(axis=1)[None, :]
    assert np.all(np.abs(ours - exact) <= 0.02 * scale + 1e-6)  # Q8_0 activations: about 1% error
