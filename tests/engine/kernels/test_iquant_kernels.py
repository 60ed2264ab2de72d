"""I-quant products bit for bit as llama.cpp's ggml-cpu vec_dot, through the kernels and through BlockProduct.

Fixture: tests/fixtures/kernels/iquant_dot.npz, made by tools/make_iquant_fixtures.py from llama-cpp-python's
libggml-cpu (x86, AVX2 + AVX-512 build): activation rows, their from_float bytes (Q8_K; Q8_0 for IQ4_NL),
20 weight rows per type (llama.cpp-quantized, random, edge) and ggml_vec_dot_iq*'s result for every pair, plus
MUL_MAT's for 1, 4 and 9 rows (the tiled path from 8 rows, tinyBLAS for IQ4_NL batches, differ in the last bits:
these kernels keep vec_dot's numbers, as recorded; test_iquant_tiled.py holds the tiled path's). The NumPy fallback is held to the same values within rounding.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from engine.kernels import dispatch
from engine.kernels.iquant import dot as iquant_dot
from engine.kernels.activations import quantize_q8_0
from engine.kernels.q8k import quantize_q8_k
from engine.quant import GGMLType, dequantize_rows

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "kernels" / "iquant_dot.npz"
IQ_TYPES = ["IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(FIXTURE) as f:
        return dict(f)


def case(golden: dict[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, xq, w, vec_dot result) of type `name`; w read-only like the memory map."""
    n = 160 if name == "IQ4_NL" else 768
    vdt = "Q8_0" if name == "IQ4_NL" else "Q8_K"
    w = golden[f"w_{name}"].copy()
    w.flags.writeable = False
    return golden[f"x_{n}"], golden[f"xq_{vdt}_{n}"], w, golden[f"dot_{name}"]


def assert_bits_equal(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    """The same float32 bits, NaN where llama.cpp has NaN."""
    assert ours.shape == theirs.shape, what
    nan = np.isnan(theirs)
    assert np.array_equal(np.isnan(ours), nan), what
    bad = ours.view(np.uint32)[~nan] != theirs.view(np.uint32)[~nan]
    assert not bad.any(), f"{what}: {int(bad.sum())} of {bad.size} values differ"


@pytest.mark.parametrize("name", IQ_TYPES)
def test_activation_bytes_are_ggml_from_float(golden: dict[str, np.ndarray], name: str) -> None:
    x, xq, _, _ = case(golden, name)
    ours = quantize_q8_0(x) if name == "IQ4_NL" else quantize_q8_k(x)
    assert np.array_equal(ours, xq)
    assert np.array_equal(dispatch.quantize_activation(GGMLType[name], x), xq)


@pytest.mark.parametrize("name", IQ_TYPES)
def test_gemv_and_gemm_are_vec_dot_bit_for_bit(golden: dict[str, np.ndarray], name: str) -> None:
    _, xq, w, dot = case(golden, name)
    assert np.isfinite(dot).any() and len(np.unique(dot)) > dot.size // 2  # real products, not zeros
    gemv = getattr(iquant_dot, f"gemv_{name.lower()}")
    gemm = getattr(iquant_dot, f"gemm_{name.lower()}")
    for a in (0, 3, 8):
        assert_bits_equal(gemv(w, xq[a], np.empty(len(w), np.float32)), dot[a], f"{name} gemv row {a}")
    assert_bits_equal(gemm(w, xq, np.empty(dot.shape, np.float32)), dot, f"{name} gemm")


@pytest.mark.parametrize("name", IQ_TYPES)
def test_block_product_runs_the_kernels(golden: dict[str, np.ndarray], name: str) -> None:
    """BlockProduct on the i-quant blocks: one row through gemv (and its bound form), a batch of 4 through gemm, of
    9 through llama.cpp's tiled path (MUL_MAT's numbers; IQ4_NL, whose tinyBLAS order is not reproduced: vec_dot's)."""
    x, xq, w, dot = case(golden, name)
    product = dispatch.BlockProduct(GGMLType[name], w, x.shape[1])
    assert product.gemv is not None and product.gemm is not None and dispatch.compiled()
    assert_bits_equal(product(x[:1]), dot[:1], f"{name} one row")
    assert_bits_equal(product(x[:4]), dot[:4], f"{name} batch of 4")
    assert_bits_equal(product(x), dot if name == "IQ4_NL" else golden[f"mul_mat_{name}_9"], f"{name} batch of 9")
    out = np.zeros((1, len(w)), np.float32)
    run = product.bind(np.ascontiguousarray(xq[2:3]), out)
    with dispatch.KERNEL_LOCK:
        run()
    assert_bits_equal(out[0], dot[2], f"{name} bound gemv")


@pytest.mark.parametrize("name", IQ_TYPES)
def test_numpy_fallback_multiplies_the_same_values(golden: dict[str, np.ndarray], name: str) -> None:
    """Without kernels: dequantized tiles times the activation's values (BLAS order), close to vec_dot."""
    x, _, w, dot = case(golden, name)
    product = dispatch.BlockProduct(GGMLType[name], w, x.shape[1])
    product.gemv = product.gemm = product.dequant = None
    got = product(x)
    finite = np.isfinite(dot)
    scale = np.abs(dot[finite]).max()
    assert np.allclose(got[finite], dot[finite], rtol=1e-5, atol=1e-5 * scale), name
    # the same as a plain float64 product of the values both sides multiply
    xq = dispatch.quantize_activation(GGMLType[name], x)
    xv = dispatch.activation_values(dispatch.VEC_DOT_TYPE[GGMLType[name]], xq, x.shape[1])
    ref = xv.astype(np.float64) @ dequantize_rows(w, GGMLType[name]).astype(np.float64).T
    assert np.allclose(got[finite], ref[finite], rtol=1e-5, atol=1e-6 * scale)


def test_mul_mat_batches_are_recorded_against_vec_dot(golden: dict[str, np.ndarray]) -> None:
    """Below 8 rows llama.cpp's MUL_MAT is vec_dot's (IQ4_NL: one row); the fixture says how far batches differ."""
    meta = json.loads(str(golden["meta"]))
    differs = meta["mul_mat_values_differing_from_vec_dot"]
    for name in IQ_TYPES:
        _, _, _, dot = case(golden, name)
        assert_bits_equal(golden[f"mul_mat_{name}_1"], dot[:1], f"{name} MUL_MAT 1 row")
        if name != "IQ4_NL":
            assert_bits_equal(golden[f"mul_mat_{name}_4"], dot[:4], f"{name} MUL_MAT 4 rows")
        assert differs[f"{name}_9"] > 0  # the tiled path's order (iquant_tiled, test_iquant_tiled.py)
        close = np.isfinite(dot[:9])
        assert np.allclose(golden[f"mul_mat_{name}_9"][close], dot[:9][close], rtol=1e-4, atol=1e-3)


def test_bad_arguments_are_refused(golden: dict[str, np.ndarray]) -> None:
    _, xq, w, _ = case(golden, "IQ4_XS")
    with pytest.raises(ValueError, match="whole number of blocks"):
        iquant_dot.gemv_iq4_xs(np.ascontiguousarray(w[:, :-1]), xq[0], np.empty(len(w), np.float32))
    with pytest.raises(ValueError, match="as long as the weight rows"):
        iquant_dot.gemv_iq4_xs(w, xq[0, :-292], np.empty(len(w), np.float32))
    with pytest.raises(ValueError, match="one float32 per weight row"):
        iquant_dot.gemm_iq4_xs(w, xq, np.empty((len(xq), 3), np.float32))


def test_iq4_nl_rows_in_eights_take_llamacpp_repacked_numbers(golden: dict[str, np.ndarray]) -> None:
    """IQ4_NL rows in eights: llama.cpp repacks them (iq4_nl_8x8), one fma per block and row; so does BlockProduct."""
    x, xq, w, dot = case(golden, "IQ4_NL")
    w16 = w[:16]
    product = dispatch.BlockProduct(GGMLType.IQ4_NL, w16, x.shape[1])
    assert product.path == "iq4_nl_x8"
    for m in (1, 4, 9):
        expected = golden[f"mul_mat_repack_IQ4_NL_{m}"]
        assert_bits_equal(product(x[:m]), expected, f"IQ4_NL repacked, {m} rows")
        assert_bits_equal(iquant_dot.gemm_iq4_nl_x8(w16, xq[:m], np.empty((m, 16), np.float32)), expected, f"gemm {m}")
    assert_bits_equal(iquant_dot.gemv_iq4_nl_x8(w16, xq[0], np.empty(16, np.float32)), golden["mul_mat_repack_IQ4_NL_1"][0],
                      "gemv")
    assert not np.array_equal(golden["mul_mat_repack_IQ4_NL_9"], dot[:9, :16])  # not vec_dot's order
    out = np.zeros((1, 16), np.float32)
    run = product.bind(np.ascontiguousarray(xq[3:4]), out)
    with dispatch.KERNEL_LOCK:
        run()
    assert_bits_equal(out[0], golden["mul_mat_repack_IQ4_NL_4"][3], "bound gemv")
