"""MXFP4 (gpt-oss's expert format) against llama.cpp's own bytes and values.

Fixture: tests/fixtures/quant/mxfp4.npz, made by tools/make_mxfp4_fixtures.py from llama-cpp-python's libggml-base
(ggml_quantize_chunk and the type's to_float) on random rows at scales from 1e-45 to 1e38, the catalog models' rows
and edge blocks (zeros, subnormals, inf, NaN, maxima just below and at powers of two, ties between codes).
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.quant import GGMLType, dequantize
from engine.quant.blocks import block_scales, decode_block
from engine.quant.mxfp4 import BLOCK_BYTES, dequantize_mxfp4, quantize_mxfp4

FIXTURE = np.load("tests/fixtures/quant/mxfp4.npz")
CASES = sorted(k[:-2] for k in FIXTURE.files if k.endswith("_x"))


@pytest.mark.parametrize("case", CASES)
def test_quantize_is_llama_cpps_bytes(case: str) -> None:
    x, want = FIXTURE[f"{case}_x"], FIXTURE[f"{case}_q"]
    got = quantize_mxfp4(x.reshape(-1, 32)).reshape(want.shape)
    np.testing.assert_array_equal(got, want)


def test_dequantize_is_llama_cpps_values_for_every_exponent() -> None:
    raw, want = FIXTURE["dq_bytes"], FIXTURE["dq_values"]
    assert sorted(set(raw[:, 0].tolist())) == list(range(256))
    got = dequantize_mxfp4(raw)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # bits: inf and subnormals too
    np.testing.assert_array_equal(dequantize(raw, GGMLType.MXFP4).reshape(-1, 32).view(np.uint32), want.view(np.uint32))


def test_the_edges_reach_log2fs_rounding_below_a_power_of_two() -> None:
    """Some edge blocks' exponent byte is not the exact floor(log2(amax)) + 125: llama.cpp's log2f rounded up."""
    x, q = FIXTURE["edges_x"], FIXTURE["edges_q"]
    amax = np.max(np.where(np.isnan(x), 0, np.abs(x)), axis=1).astype(np.float32)
    finite = np.isfinite(amax) & (amax > 0) & (amax >= np.float32(2.0**-126))
    _, exp = np.frexp(amax[finite])
    naive = ((exp - 1) + 125) & 0xFF
    assert np.count_nonzero(naive != q[finite, 0]) > 0


def test_a_block_taken_apart_gives_its_weights() -> None:
    blocks = FIXTURE["normal_q"].reshape(-1, BLOCK_BYTES)[:8]
    for block in blocks:
        d = decode_block(block, GGMLType.MXFP4)
        np.testing.assert_array_equal(d.weights, dequantize(block, GGMLType.MXFP4))
        assert [f.spec.name for f in d.fields] == ["e", "qs"] and set(np.unique(d.quants)) <= set(range(-12, 13))
    scales = block_scales(blocks, GGMLType.MXFP4)["d"]
    np.testing.assert_array_equal(scales, np.float32(2.0) ** (blocks[:, 0].astype(np.float64) - 128))
