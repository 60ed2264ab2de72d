"""kquant_vnni: the AVX512-VNNI batches of Q4_K (repacked rows) and Q4_K / Q5_K / Q6_K (tiled) and IQ4_XS (tiled) give llama.cpp's bits.

The same fixtures as kquant_repack's and kquant_tiled's tests (llama.cpp's MUL_MAT outputs), and the NumPy
reference of the q4_K_8x8 numbers on random blocks with max scales and mins.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.kernels.activations import HAVE_NUMBA
from tests.engine.kernels import test_kquant_repack as repack_tests
from tests.engine.kernels import test_kquant_tiled as tiled_tests

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="compiled kernels only")


@pytest.fixture(scope="module")
def vnni():
    from engine.kernels import paths  # noqa: PLC0415

    if paths.q8_0_x16() is None:
        pytest.skip("numba's target has no AVX512-VNNI")
    from engine.kernels.kquant import vnni as kquant_vnni  # noqa: PLC0415

    return kquant_vnni


def _load(path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def _q4_k(vnni, weight: np.ndarray, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    from engine.kernels.kquant import repack as R  # noqa: PLC0415

    out = np.full((x.shape[0], weight.shape[0] * 8), np.nan, np.float32) if out is None else out
    vnni.gemm_q4_k_8x8_vnni(weight, R.quantize_q8_k_mat(x), out)
    return out


def test_q4_k_equals_llama_cpp(vnni) -> None:
    from engine.kernels.kquant import repack as R  # noqa: PLC0415

    golden = _load(repack_tests.FIXTURE)
    for key, wcase, m in repack_tests._cases(golden):
        w, x = repack_tests._inputs(golden, wcase, m)
        repack_tests.assert_bits_equal(_q4_k(vnni, R.repack_q4_k_8x8(w), x), golden[key], key)


@pytest.mark.parametrize("rows,nb,m", [(8, 1, 1), (16, 2, 5), (24, 3, 16), (8, 4, 19), (32, 1, 36), (40, 2, 67)])
def test_q4_k_equals_the_reference_on_random_blocks(vnni, rows: int, nb: int, m: int) -> None:
    """Max scales and mins, every quant 15, a zero block; tiles of 16 with a short last one and the gemv rows."""
    from engine.kernels.kquant import repack as R  # noqa: PLC0415
    from engine.kernels.kquant import repack_ref as ref  # noqa: PLC0415

    rng = np.random.default_rng(rows * 1000 + nb * 10 + m)
    w = repack_tests._random_q4_k(rng, rows, nb)
    x = (rng.standard_normal((m, nb * ref.QK_K)) * rng.uniform(0.01, 3, (m, 1))).astype(np.float32)
    x[0, :32] = 127.0  # the activation quants' extremes
    x[-1, 32:64] = -127.0
    repack_tests.assert_bits_equal(_q4_k(vnni, R.repack_q4_k_8x8(w), x), ref.matmul_q4_k_8x8_ref(w, x),
                                   f"{rows}x{nb} m={m}")


def test_q4_k_writes_strided_output(vnni) -> None:
    from engine.kernels.kquant import repack as R  # noqa: PLC0415

    rng = np.random.default_rng(9)
    weight = R.repack_q4_k_8x8(repack_tests._random_q4_k(rng, 16, 2))
    x = rng.standard_normal((21, 512)).astype(np.float32)
    wide = np.full((21, 40), np.float32(7.0))
    _q4_k(vnni, weight, x, wide[:, 8:24])
    repack_tests.assert_bits_equal(wide[:, 8:24], R.matmul_q4_k_8x8(weight, x), "strided")
    assert (wide[:, :8] == 7).all() and (wide[:, 24:] == 7).all()


@pytest.mark.parametrize("t", ["Q4_K", "Q5_K", "Q6_K"])
def test_tiled_equal_llama_cpp(vnni, t: str) -> None:
    """The tiled path's numbers; the fixture's weights have row counts that are not multiples of 8 (a short
    last band; Q4_K stays unrepacked there)."""
    golden = _load(tiled_tests.FIXTURE)
    w = golden[f"w_{t}"]
    assert len(w) % 8
    kernel = getattr(vnni, f"gemm_tiled_{t.lower()}_vnni")
    for m in tiled_tests.ROWS:
        if m < 8:
            continue  # below 8 rows llama.cpp takes vec_dot
        wide = np.full((m, len(w) + 12), np.float32(7.0))
        kernel(w, golden["xq"][:m], wide[:, 4 : 4 + len(w)])
        tiled_tests.assert_bits_equal(wide[:, 4 : 4 + len(w)], golden[f"y_{t}_{m}"], f"{t} m={m}")
        assert (wide[:, :4] == 7).all() and (wide[:, 4 + len(w) :] == 7).all()


@pytest.mark.parametrize("t,size,d_at", [("Q4_K", 144, (0, 2)), ("Q5_K", 176, (0, 2)), ("Q6_K", 210, (208,))])
def test_tiled_equal_the_plain_tiled_kernels_on_edge_blocks(vnni, t: str, size: int, d_at: tuple) -> None:
    """Random bytes (every code, scale, min and scale sign), a zero block, activations at the quantizer's extremes."""
    from engine.kernels.kquant import tiled as kquant_tiled  # noqa: PLC0415
    from engine.kernels.q8k import quantize_q8_k  # noqa: PLC0415

    rng = np.random.default_rng(5)
    w = rng.integers(0, 256, (19, 3, size), dtype=np.uint8)
    for at in d_at:
        w[..., at : at + 2] = (rng.standard_normal((19, 3, 1)) * 0.01).astype("<f2").view(np.uint8).reshape(19, 3, 2)
    w[3, 1] = 0
    w = w.reshape(19, 3 * size)
    x = (rng.standard_normal((37, 768)) * rng.uniform(0.01, 5, (37, 1))).astype(np.float32)
    x[2, :256] = 100.0
    xq = quantize_q8_k(x).reshape(37, -1)
    ours = getattr(vnni, f"gemm_tiled_{t.lower()}_vnni")(w, xq, np.full((37, 19), np.nan, np.float32))
    theirs = getattr(kquant_tiled, f"gemm_tiled_{t.lower()}")(w, xq, np.full((37, 19), np.nan, np.float32))
    tiled_tests.assert_bits_equal(ours, theirs, f"{t} edge blocks")


def test_iq4_xs_equals_llama_cpp(vnni) -> None:
    """IQ4_XS through the band kernel: llama.cpp's tiled MUL_MAT of 9 rows, and iquant_tiled's on random blocks."""
    from engine.kernels.iquant.tiled import KINDS, gemm_tiled  # noqa: PLC0415
    from engine.kernels.q8k import quantize_q8_k  # noqa: PLC0415

    golden = _load(tiled_tests.FIXTURE.parent / "iquant_dot.npz")
    w, xq = golden["w_IQ4_XS"], golden["xq_Q8_K_768"][:9]
    ours = vnni.gemm_tiled_iq4_xs_vnni(w, xq, np.full((9, len(w)), np.nan, np.float32))
    tiled_tests.assert_bits_equal(ours, golden["mul_mat_IQ4_XS_9"], "IQ4_XS 9 rows")
    rng = np.random.default_rng(8)
    w = rng.integers(0, 256, (21, 2, 136), dtype=np.uint8)  # every nibble, scale and scale sign
    w[..., 0:2] = (rng.standard_normal((21, 2, 1)) * 0.01).astype("<f2").view(np.uint8).reshape(21, 2, 2)
    w[4, 1] = 0
    w = w.reshape(21, 272)
    x = (rng.standard_normal((35, 512)) * rng.uniform(0.01, 5, (35, 1))).astype(np.float32)
    xq = quantize_q8_k(x).reshape(35, -1)
    ours = vnni.gemm_tiled_iq4_xs_vnni(w, xq, np.full((35, 21), np.nan, np.float32))
    theirs = gemm_tiled(KINDS["IQ4_XS"], w, xq, np.full((35, 21), np.nan, np.float32))
    tiled_tests.assert_bits_equal(ours, theirs, "IQ4_XS random blocks")
