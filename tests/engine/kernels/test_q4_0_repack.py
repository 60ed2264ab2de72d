"""Q4_0 weights with rows in eights: llama.cpp's repacked q4_0_8x8 numbers (fixtures from its MUL_MAT, made by
tools/make_q4_0_repack_fixtures.py), through both legacy kernels and through BlockProduct; other row counts:
vec_dot's."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.kernels.activations import quantize_q8_0
from engine.kernels.dispatch import BlockProduct, compiled
from engine.quant.types import GGMLType

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "kernels" / "q4_0_repack.npz"
pytestmark = pytest.mark.skipif(not compiled(), reason="needs the compiled (numba) kernels")


@pytest.fixture(scope="module")
def golden():
    with np.load(FIXTURE) as f:
        return {k: f[k] for k in f.files}


def _cases(golden, *, repacked: bool):
    for key in golden:
        if key.startswith("y_"):
            wcase, m = key[2:].rsplit("_", 1)
            w = golden[f"w_{wcase}"]
            if (w.shape[0] % 8 == 0) == repacked:
                yield wcase, int(m), w, golden[key]


@pytest.mark.parametrize("which", ["gemm_int", "gemm_int_vnni"])
def test_kernels_equal_llamacpp_bit_for_bit(golden, which):
    from engine.kernels.legacy.family import kind_gemv  # noqa: PLC0415
    from engine.kernels.legacy.dot import Q4_0_X8  # noqa: PLC0415
    from engine.kernels.legacy.repack import repack  # noqa: PLC0415
    from engine.kernels.legacy.gemv_int import GEMV_INT  # noqa: PLC0415
    from tests.engine.kernels.test_legacy_gemm import kernel  # noqa: PLC0415

    gemm_int = kernel(which)

    x = golden["x"]
    n = 0
    for wcase, m, w, want in _cases(golden, repacked=True):
        xq = quantize_q8_0(x[:m])
        out = np.full((m, w.shape[0]), np.nan, np.float32)
        gemm_int(Q4_0_X8, w, xq, out)  # prompts: integer tiles on the GGUF blocks
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (wcase, m)
        if m == 1:  # decode: the byte-plane kernel
            one = np.full(w.shape[0], np.nan, np.float32)
            kind_gemv(Q4_0_X8)(repack(GGMLType.Q4_0, w), xq[0], one)
            assert np.array_equal(one.view(np.uint32), want[0].view(np.uint32)), wcase
            one[:] = np.nan  # ...and the integer one on the GGUF blocks (legacy.gemv_int)
            GEMV_INT[Q4_0_X8](_read_only(w), _read_only(xq[0]), one)
            assert np.array_equal(one.view(np.uint32), want[0].view(np.uint32)), (wcase, "gemv_int")
            odd = np.full(w.shape[0] - 3, np.nan, np.float32)  # rows not in eights: two rows a step, same numbers
            GEMV_INT[Q4_0_X8](_read_only(w[:-3]), _read_only(xq[0]), odd)
            assert np.array_equal(odd.view(np.uint32), want[0, :-3].view(np.uint32)), (wcase, "gemv_int pairs")
        n += 1
    assert n >= 3 * 7


def test_block_product_takes_the_repacked_numbers_where_llamacpp_does(golden):
    x = golden["x"]
    for repacked in (True, False):
        seen = 0
        for wcase, m, w, want in _cases(golden, repacked=repacked):
            blocks = w.copy()
            blocks.flags.writeable = False
            product = BlockProduct(GGMLType.Q4_0, blocks, x.shape[1])
            assert (product.path == "q4_0_x8") == repacked
            got = product(x[:m])
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (wcase, m, product.path)
            seen += 1
        assert seen >= 7


def test_vec_dot_numbers_differ_from_the_repacked_ones(golden):
    """The two paths really differ on these inputs (else the tests above could not tell them apart)."""
    from engine.kernels.legacy.gemm import gemm_int  # noqa: PLC0415

    w, x = golden["w_quantized"], golden["x"][:16]
    out = np.empty((16, w.shape[0]), np.float32)
    gemm_int(int(GGMLType.Q4_0), w, quantize_q8_0(x), out)
    assert not np.array_equal(out, golden["y_quantized_16"])
    assert np.allclose(out, golden["y_quantized_16"], rtol=1e-4, atol=1e-5)


def _read_only(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a).copy()
    a.flags.writeable = False
    return a
