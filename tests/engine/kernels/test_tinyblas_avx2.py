"""The AVX2 build's float products, bit for bit: F16, F32 and BF16 weights with the ggml numerics following that
build (engine.kernels.isa, forced here on any x86 CPU): vec_dot's four 8-float accumulators, tinyBLAS<8>, and
BF16 without VDPBF16PS (vec_dot_bf16's __m256 loop, tinyBLAS<8, __m256, __m256, ggml_bf16_t>). Fixtures:
tools/make_float_gemm_fixtures.py --isa avx2, run with the AVX2-only llama-cpp-python (README.md)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.kernels import isa
from engine.kernels.dispatch import BlockProduct, compiled
from engine.kernels.legacy.ref import dot_ref
from engine.quant.types import GGMLType

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "kernels" / "float_gemm_avx2.npz"
AVX512 = FIXTURE.with_name("float_gemm.npz")
pytestmark = pytest.mark.skipif(not compiled(), reason="needs the compiled (numba) kernels")


@pytest.fixture(scope="module")
def golden():
    with np.load(FIXTURE) as f:
        return {k: f[k] for k in f.files}


def _product(qtype: GGMLType, w: np.ndarray, n: int) -> BlockProduct:
    blocks = np.ascontiguousarray(w).view(np.uint8).reshape(w.shape[0], -1)
    blocks.flags.writeable = False
    return BlockProduct(qtype, blocks, n)


def _equal(got: np.ndarray, want: np.ndarray, what: object) -> None:
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (what, np.abs(got - want).max())


@pytest.mark.parametrize("qtype", [GGMLType.F16, GGMLType.F32])
@pytest.mark.parametrize("n", [512, 200])
def test_f16_f32_products_equal_the_avx2_build(golden, qtype: GGMLType, n: int):
    name = qtype.name.lower()
    with isa.forced_bits("avx2"):
        product = _product(qtype, golden[f"w_{name}_{n}"], n)
        for m in (1, 2, 3, 8, 16):
            _equal(product(golden[f"x_{n}"][:m]), golden[f"y_{name}_{n}_{m}"], (name, n, m))


@pytest.mark.parametrize("qtype", [GGMLType.BF16, GGMLType.F16])
@pytest.mark.parametrize("rows", [24, 22])
@pytest.mark.parametrize("n", [512, 528])
def test_bf16_and_f16_rows_equal_the_avx2_build(golden, qtype: GGMLType, rows: int, n: int):
    """BF16 rows of 512 and 528 values (both in eights: tinyBLAS<8> for a batch of 24 weight rows, vec_dot for 22)."""
    name = qtype.name.lower()
    w, x = golden[f"w_{name}_{rows}_{n}"], golden[f"xr_{n}"]
    with isa.forced_bits("avx2"):
        product = _product(qtype, w, n)
        for m in (1, 2, 3, 8, 16):
            _equal(product(x[:m]), golden[f"y_{name}_{rows}_{n}_{m}"], (name, rows, n, m))


def test_the_numpy_reference_takes_the_avx2_bf16_order(golden):
    from engine.kernels.activations import quantize_bf16_ref  # noqa: PLC0415

    for n in (512, 528):
        w, x = golden[f"w_bf16_22_{n}"], golden[f"xr_{n}"]
        got = dot_ref(GGMLType.BF16, w.view(np.uint8).reshape(22, -1), quantize_bf16_ref(x), step=32)
        _equal(got, golden[f"y_bf16_22_{n}_16"], n)


def test_the_two_builds_differ_on_these_inputs(golden):
    """The AVX-512 build's BF16 and F16 products are not these bits, so the tests above can fail."""
    with np.load(AVX512) as f:
        theirs = {k: f[k] for k in f.files}
    for key in ("y_bf16_22_528_1", "y_bf16_24_512_16", "y_f16_512_16", "y_f32_200_1"):
        assert not np.array_equal(golden[key], theirs[key]), key
        assert np.allclose(golden[key], theirs[key], rtol=1e-4, atol=1e-5), key
