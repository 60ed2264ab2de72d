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
