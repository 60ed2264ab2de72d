"""The band kernels of repacked Q4_K (activations in the lanes: kquant_avx2_band on ymm, kquant_vnni on zmm) give
llama.cpp's bits: its MUL_MAT outputs (q4k_repack.npz, from tools/make_q4k_repack_fixtures.py), the NumPy
reference of the q4_K_8x8 numbers, and kquant_repack's gemm and gemv on random bytes (every scale, min, code
and fp16 d / dmin, subnormals among them), and MUL_MAT_ID's rows of one expert (a gemv per row).
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.kernels.activations import HAVE_NUMBA
from tests.engine.kernels import test_kquant_repack as repack_tests

pytestmark = pytest.mark.skipif(not HAVE_NUMBA, reason="compiled kernels only")


def _avx2():
    from engine.kernels import isa  # noqa: PLC0415

    if isa.target() not in ("avx2", "avx512"):
        pytest.skip("numba's target has no AVX2")
    from engine.kernels.kquant import avx2_band  # noqa: PLC0415

    return avx2_band.gemm_q4_k_8x8_avx2, avx2_band.gemv_rows_q4_k_8x8_avx2


def _vnni():
    from engine.kernels import paths  # noqa: PLC0415

    if paths.q8_0_x16() is None:
        pytest.skip("numba's target has no AVX512-VNNI")
    from engine.kernels.kquant import vnni  # noqa: PLC0415

    return vnni.gemm_q4_k_8x8_vnni, vnni.gemv_rows_q4_k_8x8_vnni


@pytest.fixture(scope="module", params=["avx2", "vnni"])
def band(request):
    return _avx2() if request.param == "avx2" else _vnni()


def _q8k(x: np.ndarray) -> np.ndarray:
    from engine.kernels.q8k import quantize_q8_k  # noqa: PLC0415

    return np.stack([quantize_q8_k(row) for row in x])


def _random_bytes(rng: np.random.Generator, rows: int, nb: int) -> np.ndarray:
    """Random Q4_K bytes: every code, six-bit scale and min; d and dmin small normals, a few subnormal; a zero block."""
    w = rng.integers(0, 256, (rows, nb, 144), dtype=np.uint8)
    d = (rng.standard_normal((rows, nb, 2)) * 0.01).astype("<f2")
    d[0, 0] = np.array([3e-6, -5e-7], "<f2")  # fp16 subnormals
    w[..., :4] = d.view(np.uint8).reshape(rows, nb, 4)
    w[1, nb - 1] = 0
    return w.reshape(rows, nb * 144)


def test_gemm_equals_llama_cpp(band) -> None:
    from engine.kernels.kquant import repack as R  # noqa: PLC0415

    gemm, _ = band
    golden = dict(np.load(repack_tests.FIXTURE))
    for key, wcase, m in repack_tests._cases(golden):
        w, x = repack_tests._inputs(golden, wcase, m)
        out = np.full((m, len(w)), np.nan, np.float32)
        repack_tests.assert_bits_equal(gemm(R.repack_q4_k_8x8(w), R.quantize_q8_k_mat(x), out), golden[key], key)


@pytest.mark.parametrize("rows,nb,m", [(8, 1, 8), (16, 2, 9), (24, 3, 16), (8, 4, 19), (32, 1, 36), (40, 2, 67)])
def test_gemm_equals_the_reference(band, rows: int, nb: int, m: int) -> None:
    """Max scales and mins, every quant 15, a zero block; whole and short tiles, and the gemv rows past them."""
    from engine.kernels.kquant import repack as R  # noqa: PLC0415
    from engine.kernels.kquant import repack_ref as ref  # noqa: PLC0415

    gemm, _ = band
    rng = np.random.default_rng(rows * 1000 + nb * 10 + m)
    w = repack_tests._random_q4_k(rng, rows, nb)
    x = (rng.standard_normal((m, nb * ref.QK_K)) * rng.uniform(0.01, 3, (m, 1))).astype(np.float32)
    x[0, :32] = 127.0  # the activation quants' extremes
    x[-1, 32:64] = -127.0
    out = np.full((m, rows), np.nan, np.float32)
    gemm(R.repack_q4_k_8x8(w), R.quantize_q8_k_mat(x), out)
    repack_tests.assert_bits_equal(out, ref.matmul_q4_k_8x8_ref(w, x), f"{rows}x{nb} m={m}")


def test_gemm_equals_kquant_repack_on_random_bytes(band) -> None:
    from engine.kernels.kquant import repack as R  # noqa: PLC0415

    gemm, _ = band
    rng = np.random.default_rng(11)
    weight = R.repack_q4_k_8x8(_random_bytes(rng, 24, 3))
    x = (rng.standard_normal((37, 768)) * rng.uniform(0.01, 5, (37, 1))).astype(np.float32)
    xq = R.quantize_q8_k_mat(x)
    ours = gemm(weight, xq, np.full((37, 24), np.nan, np.float32))
    repack_tests.assert_bits_equal(ours, R.gemm_q4_k_8x8(weight, xq, np.full((37, 24), np.nan, np.float32)), "bytes")


@pytest.mark.parametrize("m", [2, 8, 16, 17, 40])
def test_gemv_rows_are_llama_cpps_gemv(band, m: int) -> None:
    """Each row the fixture's gemv bits (its rows below 4, repeated past a register of rows), and kquant_repack's
    gemv on random bytes, row by row."""
    from engine.kernels.kquant import repack as R  # noqa: PLC0415

    _, rows = band
    golden = dict(np.load(repack_tests.FIXTURE))
    for key, wcase, n in repack_tests._cases(golden):
        if n >= 4:
            continue
        w, x = repack_tests._inputs(golden, wcase, n)
        reps = -(-m // n)
        out = np.full((n * reps, len(w)), np.nan, np.float32)
        rows(R.repack_q4_k_8x8(w), np.concatenate([_q8k(x)] * reps), out)
        repack_tests.assert_bits_equal(out, np.concatenate([golden[key]] * reps), f"{key} (gemv rows x{reps})")
    rng = np.random.default_rng(m)
    weight = R.repack_q4_k_8x8(_random_bytes(rng, 24, 2))
    xq = _q8k((rng.standard_normal((m, 512)) * rng.uniform(0.01, 3, (m, 1))).astype(np.float32))
    out = rows(weight, xq, np.full((m, 24), np.nan, np.float32))
    for a in range(m):
        repack_tests.assert_bits_equal(out[a], R.gemv_q4_k_8x8(weight, xq[a], np.empty(24, np.float32)), f"row {a}")


def test_the_expert_rows_path_gives_the_gemv_for_every_row_count() -> None:
    """paths.q4_k_rows (what MUL_MAT_ID runs for an expert's rows) below and above its band kernel's threshold."""
    from engine.kernels import paths  # noqa: PLC0415
    from engine.kernels.kquant import repack as R  # noqa: PLC0415

    rng = np.random.default_rng(3)
    weight = R.repack_q4_k_8x8(_random_bytes(rng, 16, 2))
    kernel = paths.q4_k_rows()
    for m in (2, 7, 8, 15, 16, 20):
        xq = _q8k(rng.standard_normal((m, 512)).astype(np.float32))
        out = np.full((m, 16), np.nan, np.float32)
        kernel(weight, xq, out)
        repack_tests.assert_bits_equal(out, R.gemv_rows_q4_k_8x8(weight, xq, np.empty((m, 16), np.float32)), f"m={m}")
