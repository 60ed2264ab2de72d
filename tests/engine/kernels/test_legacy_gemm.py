"""The integer batch kernel of legacy_gemm: llama.cpp's vec_dot for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from engine.kernels.legacy import family as legacy
from engine.kernels.activations import HAVE_NUMBA, quantize_activation
from engine.kernels.dispatch import BlockProduct, compiled
from engine.quant import quantize
from engine.quant.types import GGMLType
from tests.engine.kernels.test_legacy_kernels import QUANTS, _describe, _golden, _same

pytestmark = pytest.mark.skipif(not HAVE_NUMBA or not compiled(), reason="the integer kernels need numba")


KERNELS = ("gemm_int", "gemm_int_vnni")  # legacy_gemm's (sign trick), legacy_gemm_vnni's (unsigned codes)


def kernel(which: str):
    """The batch kernel by name; skips where the VNNI one cannot run."""
    if which == "gemm_int":
        from engine.kernels.legacy.gemm import gemm_int  # noqa: PLC0415

        return gemm_int
    from engine.kernels import paths  # noqa: PLC0415

    if paths.q8_0_x16() is None:
        pytest.skip("numba's target has no AVX512-VNNI")
    from engine.kernels.legacy.gemm_vnni import gemm_int_vnni  # noqa: PLC0415

    return gemm_int_vnni


def _gemm_int(name: str, w: np.ndarray, xq: np.ndarray, which: str = "gemm_int") -> np.ndarray:
    out = np.full((len(xq), w.shape[0]), np.nan, np.float32)
    kernel(which)(int(GGMLType[name]), np.ascontiguousarray(w), np.ascontiguousarray(xq), out)
    return out


@pytest.mark.parametrize("which", KERNELS)
@pytest.mark.parametrize("name", QUANTS)
def test_integer_batches_equal_llamacpp(name: str, which: str) -> None:
    """llama.cpp's dot products on quantized, random-byte and edge blocks against normal and edge activations."""
    for case, c in _golden(name).items():
        got = _gemm_int(name, c["w"], c["xq"], which)
        assert _same(got, c["dot"]), f"{name} {case}: {_describe(got, c['dot'])}"


@pytest.mark.parametrize("which", KERNELS)
@pytest.mark.parametrize("name", QUANTS)
def test_integer_batches_equal_the_plane_kernels_across_tiles(name: str, which: str) -> None:
    """33 activations (two full tiles of 16 and one more) against 70 rows (a task boundary) equal gemm_<type>;
    the VNNI kernel's tile pairs end in a padded one here."""
    qtype = GGMLType[name]
    rng = np.random.default_rng(7)
    w = quantize(rng.standard_normal((70, 320)).astype(np.float32), qtype)
    x = (rng.standard_normal((33, 320)) * rng.uniform(0.01, 30, (33, 1))).astype(np.float32)
    xq = quantize_activation(qtype, x)
    ref = np.empty((33, 70), np.float32)
    legacy.GEMM[qtype](legacy.REPACK[qtype](w), xq, ref)
    got = _gemm_int(name, w, xq, which)
    assert _same(got, ref), _describe(got, ref)


@pytest.mark.parametrize("name", QUANTS)
def test_block_products_take_the_integer_kernel_for_batches(name: str) -> None:
    """A stacked (q/k/v-like) product of three weights runs each part's blocks; the rows land in order."""
    qtype = GGMLType[name]
    rng = np.random.default_rng(11)
    parts = [quantize(rng.standard_normal((n, 256)).astype(np.float32), qtype) for n in (64, 16, 16)]
    fused = BlockProduct.fused(qtype, parts, 256)
    assert fused.batch is not None and len(fused.raw_parts) == 3
    x = rng.standard_normal((5, 256)).astype(np.float32)
    got = fused(x)
    ref = np.concatenate([np.concatenate([BlockProduct(qtype, p, 256)(x[i : i + 1]) for p in parts], axis=1)
                          for i in range(5)])
    assert _same(got, ref), _describe(got, ref)
