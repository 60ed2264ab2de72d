"""engine.quant.quantize is byte-exact with llama.cpp's ggml_quantize_chunk (no imatrix).

The golden bytes in tests/fixtures/quant come from llama.cpp itself, written by
tools/make_quant_fixtures.py (run it with a Python that has llama-cpp-python to regenerate
them, or with --check to compare on millions of weights).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.quant import QUANTIZERS, TYPES, GGMLType, dequantize, quantize
from engine.quant.floats import f32_to_bf16_bits, f32_to_f16_bits
from engine.quant.ggml_math import nearest_int, roundf, seq_sum

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "quant"
QUANT_TYPES = ["F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K"]
# relative RMS error of dequantize(quantize(x)) on Gaussian weights, with some headroom
MAX_REL_RMSE = {
    "F32": 0.0, "F16": 1e-3, "BF16": 5e-3, "Q8_0": 0.01, "Q6_K": 0.025, "Q5_1": 0.05, "Q5_0": 0.055,
    "Q5_K": 0.045, "Q4_1": 0.095, "Q4_0": 0.1, "Q4_K": 0.085, "Q3_K": 0.18, "Q2_K": 0.34,
}


@pytest.fixture(scope="module")
def inputs() -> dict[str, np.ndarray]:
    """The float32 inputs the golden bytes were made from, by case name."""
    with np.load(FIXTURES / "inputs.npz") as data:
        return {name: data[name] for name in data.files if name != "source"}


def golden(name: str) -> dict[str, np.ndarray]:
    """llama.cpp's bytes for type `name`, by case name."""
    with np.load(FIXTURES / f"{name}.npz") as data:
        return {case: data[case] for case in data.files}


def rel_rmse(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.mean((x - y) ** 2)) / np.sqrt(np.mean(x**2)))


def test_fixtures_cover_every_type_and_record_their_source() -> None:
    with np.load(FIXTURES / "inputs.npz") as data:
        assert "llama-cpp-python" in str(data["source"])
        assert {"normal", "heavy", "uniform", "edge"} <= set(data.files)
        assert any(name.startswith("smollm2") for name in data.files)
        assert any(name.startswith("gemma3") for name in data.files)
    assert {p.stem for p in FIXTURES.glob("*.npz")} >= set(QUANT_TYPES)


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_bytes_match_llama_cpp(name: str, inputs: dict[str, np.ndarray]) -> None:
    expected = golden(name)
    assert len(expected) >= 12
    differing = []
    for case, want in expected.items():
        got = quantize(inputs[case], GGMLType[name])
        assert got.dtype == np.uint8 and got.shape == want.shape, case
        if not np.array_equal(got, want):
            blocks = (got != want).reshape(-1, TYPES[GGMLType[name]].type_size).any(axis=1)
            differing.append(f"{case}: {int(blocks.sum())} blocks")
    assert not differing, f"{name} differs from llama.cpp in " + ", ".join(differing)


@pytest.mark.parametrize("name", ["F32", *QUANT_TYPES])
def test_round_trip_error_is_small(name: str) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((16, 1024)) * 0.02).astype(np.float32)
    y = dequantize(quantize(x, GGMLType[name]), GGMLType[name]).reshape(x.shape)
    assert rel_rmse(x, y) <= MAX_REL_RMSE[name]


@pytest.mark.parametrize("name", QUANT_TYPES)
def test_zero_rows_stay_zero(name: str) -> None:
    x = np.zeros((2, 256), dtype=np.float32)
    assert not dequantize(quantize(x, GGMLType[name]), GGMLType[name]).any()


def test_f16_and_f32_round_trips_are_exact() -> None:
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((3, 64)) * 100).astype(np.float32)
    assert np.array_equal(dequantize(quantize(x, GGMLType.F32), GGMLType.F32).reshape(x.shape), x)
    h = x.astype(np.float16).astype(np.float32)
    assert np.array_equal(dequantize(quantize(h, GGMLType.F16), GGMLType.F16).reshape(x.shape), h)


@pytest.mark.parametrize("name", ["Q4_0", "Q6_K", "Q4_K"])
def test_chunked_quantization_equals_row_by_row(name: str) -> None:
    # 300 rows of 1024 span several internal chunks for every block size
    x = (np.random.default_rng(3).standard_normal((300, 1024)) * 0.02).astype(np.float32)
    rows = 300 if name != "Q4_K" else 2  # keep the slowest type's loop short
    whole = quantize(x, GGMLType[name])
    by_row = np.concatenate([quantize(x[i : i + 1], GGMLType[name]) for i in range(rows)])
    assert np.array_equal(whole[:rows], by_row)


def test_row_size_must_be_a_multiple_of_the_block_size() -> None:
    with pytest.raises(SettingError, match="row size 100 is not a multiple of Q4_K block size 256"):
        quantize(np.zeros((2, 100), dtype=np.float32), GGMLType.Q4_K)
    with pytest.raises(SettingError, match="row size 48 is not a multiple of Q8_0 block size 32"):
        quantize(np.zeros((1, 48), dtype=np.float32), GGMLType.Q8_0)


def test_bad_shapes_and_types_are_rejected() -> None:
    with pytest.raises(SettingError, match="n_rows, n_cols"):
        quantize(np.zeros(256, dtype=np.float32), GGMLType.Q4_K)
    with pytest.raises(SettingError, match="IQ2_XXS is not supported"):
        quantize(np.zeros((1, 256), dtype=np.float32), GGMLType.IQ2_XXS)
    # the reference quantizers of this file's fixtures, IQ4_NL / IQ4_XS (held to ggml_quantize_chunk in
    # tests/engine/quant/test_weighted.py) and MXFP4 (tests/engine/quant/test_mxfp4.py)
    assert set(QUANTIZERS) == {GGMLType[n] for n in ["F32", *QUANT_TYPES, "IQ4_NL", "IQ4_XS", "MXFP4"]}


def test_quantize_accepts_float64_and_int_type_ids() -> None:
    x = np.linspace(-1, 1, 64).reshape(2, 32)
    assert np.array_equal(quantize(x, 8), quantize(x.astype(np.float32), GGMLType.Q8_0))


# ---- the C-semantics helpers the quantizers are built on


def test_f16_conversion_matches_numpy_rounding_and_quiets_nan() -> None:
    rng = np.random.default_rng(4)
    bits = rng.integers(0, 2**32, size=2_000_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    finite = ~np.isnan(x)
    with np.errstate(over="ignore"):
        expected = x[finite].astype(np.float16).view(np.uint16)
    assert np.array_equal(f32_to_f16_bits(x[finite]), expected)
    nan = np.array([np.nan, -np.nan], dtype=np.float32)
    assert f32_to_f16_bits(nan).tolist() == [0x7E00, 0xFE00]


def test_bf16_conversion_rounds_to_nearest_even() -> None:
    x = np.array([1.0, 1.00390625, 1.01171875, -2.5, np.inf], dtype=np.float32)
    assert f32_to_bf16_bits(x).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x7F80]
    assert f32_to_bf16_bits(np.array([np.nan], dtype=np.float32))[0] & 0x7FC0 == 0x7FC0


def test_nearest_int_rounds_half_to_even_and_roundf_away_from_zero() -> None:
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3.49999976, -7.0, 4194303.0], dtype=np.float32)
    assert nearest_int(v).tolist() == [0, 2, 2, 0, -2, 3, -7, 4194303]
    assert roundf(v).tolist() == [1.0, 2.0, 3.0, -1.0, -2.0, 3.0, -7.0, 4194303.0]
    assert roundf(np.float32([0.49999997]))[0] == 0.0  # x + 0.5 would round up to 1


def test_seq_sum_adds_in_c_order() -> None:
    terms = np.array([[1e8], [1.0], [-1e8], [1.0]], dtype=np.float32)
    assert seq_sum(terms)[0] == np.float32(1.0)  # ((1e8 + 1) - 1e8) + 1 in float32
    assert np.signbit(seq_sum(np.array([[-0.0], [-0.0]], dtype=np.float32))[0]) == np.False_
