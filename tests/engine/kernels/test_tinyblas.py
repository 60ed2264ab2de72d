"""F16 and F32 weights: batches in llamafile's tinyBLAS order, single rows through vec_dot, bit for bit with
llama.cpp's MUL_MAT (fixtures from tools/make_float_gemm_fixtures.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.kernels.dispatch import BlockProduct, compiled
from engine.quant.types import GGMLType

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "kernels" / "float_gemm.npz"
pytestmark = pytest.mark.skipif(not compiled(), reason="needs the compiled (numba) kernels")


@pytest.fixture(scope="module")
def golden():
    with np.load(FIXTURE) as f:
        return {k: f[k] for k in f.files}


@pytest.mark.parametrize("qtype", [GGMLType.F16, GGMLType.F32])
@pytest.mark.parametrize("n", [512, 200])
def test_products_equal_llamacpp_bit_for_bit(golden, qtype: GGMLType, n: int):
    name = qtype.name.lower()
    w = golden[f"w_{name}_{n}"]
    blocks = np.ascontiguousarray(w).view(np.uint8).reshape(w.shape[0], -1)
    blocks.flags.writeable = False
    product = BlockProduct(qtype, blocks, n)
    for m in (1, 2, 3, 8, 16):
        want = golden[f"y_{name}_{n}_{m}"]
        got = product(golden[f"x_{n}"][:m])
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, n, m)


def test_the_two_orders_differ_on_these_inputs(golden):
    """A batch through vec_dot (row by row) does not give tinyBLAS's bits here, so the test above can fail."""
    w = golden["w_f16_512"]
    blocks = np.ascontiguousarray(w).view(np.uint8).reshape(w.shape[0], -1)
    product = BlockProduct(GGMLType.F16, blocks, 512)
    x = golden["x_512"][:16]
    rows = np.concatenate([product(x[i : i + 1]) for i in range(16)])
    assert not np.array_equal(rows, golden["y_f16_512_16"])
    assert np.allclose(rows, golden["y_f16_512_16"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("qtype", [GGMLType.BF16, GGMLType.F16])
@pytest.mark.parametrize("rows", [24, 22])
@pytest.mark.parametrize("n", [512, 528])
def test_weight_rows_and_widths_choose_the_kernel_as_llamacpp(golden, qtype: GGMLType, rows: int, n: int):
    """tinyBLAS takes a weight's rows in fours only (22 rows: vec_dot), BF16 rows in 32s only (528: vec_dot);
    BF16 batches run VDPBF16PS itself where the CPU has AVX512_BF16, denormals read as zero included."""
    from engine.kernels.floats import tinyblas  # noqa: PLC0415

    if qtype == GGMLType.BF16 and rows == 24 and n == 512 and not tinyblas.bf16_available():
        pytest.skip("BF16 batches need AVX512_BF16 (without it they are not llama.cpp's AVX512_BF16 numbers)")
    name = qtype.name.lower()
    w = golden[f"w_{name}_{rows}_{n}"]
    blocks = np.ascontiguousarray(w).view(np.uint8).reshape(w.shape[0], -1)
    blocks.flags.writeable = False
    product = BlockProduct(qtype, blocks, n)
    for m in (1, 2, 3, 8, 16):
        want = golden[f"y_{name}_{rows}_{n}_{m}"]
        got = product(golden[f"xr_{n}"][:m])
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, rows, n, m)


def test_bf16_orders_differ_on_these_inputs(golden):
    """vec_dot's BF16 order (two accumulators, 64 a step, double sums) is not tinyBLAS's here."""
    w = golden["w_bf16_24_512"]
    blocks = np.ascontiguousarray(w).view(np.uint8).reshape(w.shape[0], -1)
    product = BlockProduct(GGMLType.BF16, blocks, 512)
    x = golden["xr_512"][:16]
    rows = np.concatenate([product(x[i : i + 1]) for i in range(16)])
    assert not np.array_equal(rows, golden["y_bf16_24_512_16"])
    assert np.allclose(rows, golden["y_bf16_24_512_16"], rtol=1e-4, atol=1e-5)
