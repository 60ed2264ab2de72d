"""Q8_0 one-row products through vpdpbusd across sixteen rows (q8_0_x16): llama.cpp's vec_dot, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from engine.kernels.legacy import family as legacy
from engine.kernels.activations import quantize_activation
from engine.kernels.dispatch import BlockProduct, compiled
from engine.quant import dequantize_rows, quantize
from engine.quant.types import GGMLType
from tests.engine.kernels.test_legacy_kernels import _describe, _golden, _same

T = GGMLType


def _x16():
    if not compiled():
        pytest.skip("the compiled kernels are not in use")
    from engine.kernels.legacy import q8_0_x16

    if not q8_0_x16.available():
        pytest.skip("no AVX512-VNNI on this CPU: the byte-plane kernel runs")
    return q8_0_x16


def _gemv(x16, w: np.ndarray, xq: np.ndarray) -> np.ndarray:
    quants, scales = x16.repack_q8_0_x16(w)
    out = np.full((len(xq), w.shape[0]), np.nan, np.float32)
    for i in range(len(xq)):
        x16.gemv_q8_0_x16(quants, scales, np.ascontiguousarray(xq[i]), out[i])
    return out


def test_x16_equals_llamacpp() -> None:
    """llama.cpp's dot products on quantized, random-byte and edge Q8_0 blocks (rows repeated to a multiple of 16)."""
    x16 = _x16()
    for case, c in _golden("Q8_0").items():
        reps = -(-16 // c["w"].shape[0]) * 2
        w = np.tile(c["w"], (reps, 1))[: 16 * (reps * c["w"].shape[0] // 16)]
        got = _gemv(x16, w, c["xq"])
        want = np.tile(c["dot"], (1, reps))[:, : w.shape[0]]
        assert _same(got, want), f"{case}: {_describe(got, want)}"


def test_x16_equals_the_plane_kernel_on_a_wide_matrix() -> None:
    x16 = _x16()
    rng = np.random.default_rng(5)
    w = quantize(rng.standard_normal((4096 + 16, 640)).astype(np.float32), T.Q8_0)
    xq = quantize_activation(T.Q8_0, rng.standard_normal((2, 640)).astype(np.float32) * np.float32(40))
    want = np.empty((2, w.shape[0]), np.float32)
    for i in range(2):
        legacy.GEMV[T.Q8_0](legacy.REPACK[T.Q8_0](w), xq[i], want[i])
    got = _gemv(x16, w, xq)
    assert _same(got, want), _describe(got, want)


def test_block_product_takes_x16_for_one_row_and_the_blocks_for_a_batch() -> None:
    _x16()
    rng = np.random.default_rng(6)
    w = quantize(rng.standard_normal((48, 256)).astype(np.float32), T.Q8_0)
    w.flags.writeable = False
    product = BlockProduct(T.Q8_0, w, 256)
    assert product.path == "q8_0_x16"
    x = rng.standard_normal((3, 256)).astype(np.float32)
    batch = product(x)
    rows = np.concatenate([product(x[i : i + 1]) for i in range(3)])
    assert _same(batch, rows), _describe(batch, rows)
    assert _same(product.rows([0, 47]), dequantize_rows(w, T.Q8_0)[[0, 47]])  # tied embeddings read the blocks
    with pytest.raises(ValueError, match="multiples of 16"):
        _x16().repack_q8_0_x16(w[:40])
