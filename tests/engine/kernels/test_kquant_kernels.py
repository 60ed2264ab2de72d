"""K-quant kernels: Q8_K activation bytes and Q2_K..Q6_K products bit for bit as llama.cpp's ggml-cpu.

Fixtures: tests/fixtures/kernels/kquant_*.npz, made by tools/make_kquant_kernel_fixtures.py from
llama-cpp-python's libggml-cpu (x86, AVX2 + AVX-512 build): quantize_row_q8_K bytes and
ggml_vec_dot_q*_K_q8_K results. Every product is checked three ways: the compiled gemv and gemm
against llama.cpp, the NumPy reference against llama.cpp, and the compiled kernels against the
reference on fresh random and edge blocks. Dequantization is checked against engine.quant.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from engine.kernels.kquant import family as K  # noqa: E402
from engine.kernels.kquant.ref import fma_f32, hsum8  # noqa: E402
from engine.kernels.q8k import (  # noqa: E402
    Q8K_BLOCK_BYTES,
    q8k_fields,
    quantize_q8_k,
    quantize_q8_k_ref,
)
from engine.quant import TYPES, GGMLType, dequantize_rows, quantize  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "kernels"
TYPE_NAMES = [t.name for t in K.KQUANT_TYPES]
FP16_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def assert_bits_equal(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    """Same shape, NaN where the other has NaN, and the same float32 bits everywhere else (-0 != +0)."""
    assert ours.shape == theirs.shape, what
    nan = np.isnan(theirs)
    assert np.array_equal(np.isnan(ours), nan), f"{what}: NaN positions differ"
    bad = np.flatnonzero(ours[~nan].view(np.uint32) != theirs[~nan].view(np.uint32))
    assert bad.size == 0, f"{what}: {bad.size} of {ours.size} differ, e.g. {ours[~nan][bad[:3]]} vs {theirs[~nan][bad[:3]]}"


def _load(name: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"kquant_{name}.npz") as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module", params=TYPE_NAMES)
def golden(request) -> tuple[GGMLType, dict[str, np.ndarray]]:
    return GGMLType[request.param], _load(request.param)


def _dot_cases(g: dict[str, np.ndarray]) -> list[tuple[str, str, str]]:
    return [(k, *k[4:].split("_")) for k in sorted(g) if k.startswith("dot_")]


def _gemv_rows(qtype: GGMLType, w: np.ndarray, xq: np.ndarray) -> np.ndarray:
    return np.stack([K.GEMV[qtype](w, row, np.empty(len(w), np.float32)) for row in xq])


def _gemm(qtype: GGMLType, w: np.ndarray, xq: np.ndarray) -> np.ndarray:
    return K.GEMM[qtype](w, xq, np.empty((len(xq), len(w)), np.float32))


def _few_rows(qtype: GGMLType, w: np.ndarray, xq: np.ndarray) -> np.ndarray | None:
    """MUL_MAT_ID's few rows of one expert in one call (Q5_K, Q6_K: engine.kernels.kquant.dot.gemv_rows_*)."""
    from engine.kernels.kquant import dot  # noqa: PLC0415

    fn = {GGMLType.Q5_K: dot.gemv_rows_q5_k, GGMLType.Q6_K: dot.gemv_rows_q6_k}.get(qtype)
    return None if fn is None else fn(w, np.ascontiguousarray(xq), np.empty((len(xq), len(w)), np.float32))


# ---- Q8_K activations


@pytest.mark.parametrize("quantizer", [quantize_q8_k, quantize_q8_k_ref], ids=["compiled", "numpy"])
def test_q8k_bytes_match_llama_cpp(quantizer):
    g = _load("q8k")
    cases = sorted(k[2:] for k in g if k.startswith("x_"))
    assert {"normal", "edge", "nonfinite", "long"} <= set(cases)
    for case in cases:
        x, theirs = g[f"x_{case}"], g[f"xq_{case}"]
        ours = quantizer(x)
        assert ours.shape == theirs.shape == (len(x), x.shape[1] // 256 * Q8K_BLOCK_BYTES), case
        bad = np.flatnonzero((ours.reshape(-1, 292) != theirs.reshape(-1, 292)).any(axis=1))
        assert bad.size == 0, f"{case}: Q8_K blocks {bad[:5]} differ"
        for i in range(len(x)):  # one row at a time: the decode path
            assert np.array_equal(quantizer(x[i]), theirs[i]), f"{case} row {i}"


def test_q8k_fields_and_edges():
    x = np.zeros((3, 512), np.float32)
    x[1, 10] = -3.0  # the largest magnitude always quantizes to -127; here d > 0
    x[2, 300] = 1e4
    x[2, 301] = 1.0
    d, qs, bsums = q8k_fields(quantize_q8_k(x))
    assert d[0].tolist() == [0.0, 0.0] and not qs[0].any() and not bsums[0].any()
    assert d[1, 0] == np.float32(1.0) / (np.float32(-127.0) / np.float32(-3.0)) and qs[1, 0, 10] == -127
    assert qs[2, 1, 44] == -127 and qs[2, 1, 45] == 0  # the huge value leaves nothing for its neighbour
    assert np.array_equal(bsums, qs.reshape(3, 2, 16, 16).astype(np.int32).sum(axis=-1))


def test_q8k_compiled_equals_reference_on_random_rows():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((20, 1024)) * rng.uniform(1e-3, 1e3, (20, 1))).astype(np.float32)
    x[3, :256] = 0.0
    x[4, 5] = np.nan
    assert np.array_equal(quantize_q8_k(x), quantize_q8_k_ref(x))  # the threaded batch path
    assert np.array_equal(quantize_q8_k(x[:3]), quantize_q8_k_ref(x[:3]))  # the serial one


def test_q8k_rejects_partial_blocks():
    with pytest.raises(ValueError, match="multiple of Q8_K block size"):
        quantize_q8_k(np.zeros(640, np.float32))


# ---- products against llama.cpp


def test_fixture_cases_cover_the_edges(golden):
    _, g = golden
    keys = {key for key, _, _ in _dot_cases(g)}
    for wcase in ("quantized", "random", "edge"):
        for xcase in ("normal", "edge"):
            assert f"dot_{wcase}_{xcase}" in keys
    assert "dot_long_long" in keys
    assert not g["w_edge"][0].any()  # an all-zero weight row
    assert not g["xq_edge"][0].any()  # an all-zero activation


def test_gemv_and_gemm_match_llama_cpp(golden):
    qtype, g = golden
    for key, wcase, xcase in _dot_cases(g):
        w, xq = g[f"w_{wcase}"], g[f"xq_{xcase}"]
        assert_bits_equal(_gemv_rows(qtype, w, xq), g[key], f"{qtype.name} gemv {key}")
        assert_bits_equal(_gemm(qtype, w, xq), g[key], f"{qtype.name} gemm {key}")
        few = _few_rows(qtype, w, xq)
        if few is not None:
            assert_bits_equal(few, g[key], f"{qtype.name} few rows {key}")


def test_reference_matches_llama_cpp(golden):
    qtype, g = golden
    for key, wcase, xcase in _dot_cases(g):
        assert_bits_equal(K.matmul_ref(qtype, g[f"w_{wcase}"], g[f"xq_{xcase}"]), g[key], f"{qtype.name} ref {key}")


def test_matmul_from_floats_matches_llama_cpp(golden):
    qtype, g = golden
    for xcase in ("normal", "edge"):
        x = g[f"x_{xcase}"]
        assert_bits_equal(K.matmul(qtype, g["w_quantized"], x), g[f"dot_quantized_{xcase}"], f"{qtype.name} {xcase}")
        assert_bits_equal(K.matmul(qtype, g["w_quantized"], x[1]), g[f"dot_quantized_{xcase}"][1], qtype.name)


def test_reference_float_order_is_not_arbitrary(golden):
    """The dequantized weights times the activation values, summed in float64, miss llama.cpp's bits."""
    qtype, g = golden
    w, xq, theirs = g["w_long"], g["xq_long"], g["dot_long_long"]
    values = dequantize_rows(w, qtype).astype(np.float64)
    d, qs, _ = q8k_fields(xq)
    xv = (qs.astype(np.float64) * d[..., None]).reshape(len(xq), -1)
    naive = (xv @ values.T).astype(np.float32)
    assert np.allclose(naive, theirs, rtol=1e-3, atol=1e-3)
    assert not np.array_equal(naive, theirs)


# ---- compiled kernels against the NumPy reference on fresh blocks


def _random_blocks(rng: np.random.Generator, qtype: GGMLType, n_rows: int, n_cols: int) -> np.ndarray:
    ts = TYPES[qtype].type_size
    b = rng.integers(0, 256, (n_rows, n_cols // 256, ts), dtype=np.uint8)
    for off in FP16_FIELDS[qtype.name]:
        scales = rng.standard_normal(b.shape[:2]) * 10.0 ** rng.uniform(-4, 1, b.shape[:2])
        b[..., off : off + 2] = scales.astype("<f2").view(np.uint8).reshape(*b.shape[:2], 2)
    return b.reshape(n_rows, -1)


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_kernels_equal_reference_on_random_blocks(name):
    qtype = GGMLType[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    w = np.concatenate([_random_blocks(rng, qtype, 37, 1536),
                        quantize((rng.standard_t(4, (11, 1536)) * 0.03).astype(np.float32), qtype)])
    x = rng.standard_normal((5, 1536)).astype(np.float32)
    x[1] = 0.0  # x all zero
    x[2, 700] = 3e4  # one huge value
    x[3, :256] *= 1e-30
    xq = quantize_q8_k(x)
    ref = K.matmul_ref(qtype, w, xq)
    assert_bits_equal(_gemm(qtype, w, xq), ref, f"{name} gemm")
    assert_bits_equal(_gemv_rows(qtype, w, xq), ref, f"{name} gemv")
    few = _few_rows(qtype, w, xq)
    if few is not None:
        assert_bits_equal(few, ref, f"{name} few rows")
    assert not ref[1].any()  # a zero activation gives exact zeros


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_gemm_tiles_and_row_tasks(name):
    """More activations than one tile and rows in several tasks, from a read-only memory map."""
    qtype = GGMLType[name]
    rng = np.random.default_rng(3)
    w = quantize((rng.standard_normal((45, 512)) * 0.02).astype(np.float32), qtype)
    xq = quantize_q8_k(rng.standard_normal((70, 512)).astype(np.float32))
    ro = w.copy()
    ro.flags.writeable = False
    assert_bits_equal(_gemm(qtype, ro, xq), K.matmul_ref(qtype, w, xq), name)


def test_kernels_read_a_memmap_in_place(tmp_path):
    rng = np.random.default_rng(5)
    w = quantize((rng.standard_normal((24, 1024)) * 0.02).astype(np.float32), GGMLType.Q4_K)
    path = tmp_path / "w.bin"
    header = b"\0" * 144  # the tensor starts past a header, as in a GGUF file
    path.write_bytes(header + w.tobytes())
    mm = np.memmap(path, dtype=np.uint8, mode="r")[len(header):].reshape(w.shape)
    xq = quantize_q8_k(rng.standard_normal(1024).astype(np.float32))
    out = K.gemv_q4_k(mm, xq, np.empty(24, np.float32))
    assert_bits_equal(out, K.matmul_ref(GGMLType.Q4_K, w, xq[None])[0], "memmap")


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_kernels_reject_mismatched_shapes(name):
    qtype = GGMLType[name]
    w = np.zeros((4, TYPES[qtype].row_bytes(512)), np.uint8)
    xq = quantize_q8_k(np.ones(512, np.float32))
    with pytest.raises(ValueError):
        K.GEMV[qtype](w, xq[:292], np.empty(4, np.float32))
    with pytest.raises(ValueError):
        K.GEMV[qtype](w, xq, np.empty(3, np.float32))
    with pytest.raises(ValueError):
        K.GEMM[qtype](w, xq[None], np.empty((1, 5), np.float32))
    with pytest.raises(ValueError):
        K.GEMV[qtype](w[:, 1:], xq, np.empty(4, np.float32))


# ---- dequantization


@pytest.mark.parametrize("name", TYPE_NAMES)
def test_dequantize_rows_bit_identical_with_engine_quant(name):
    qtype = GGMLType[name]
    rng = np.random.default_rng(11)
    w = np.concatenate([
        quantize((rng.standard_normal((6, 768)) * 0.05).astype(np.float32), qtype),
        rng.integers(0, 256, (6, TYPES[qtype].row_bytes(768)), dtype=np.uint8),  # NaN / inf scales too
        np.zeros((1, TYPES[qtype].row_bytes(768)), np.uint8),
    ])
    expected = dequantize_rows(w, qtype)
    for r0, r1 in ((0, len(w)), (3, 9), (12, 13), (5, 5)):
        out = K.DEQUANTIZE_ROWS[qtype](w, r0, r1, np.full((r1 - r0, 768), np.nan, np.float32))
        assert_bits_equal(out, expected[r0:r1], f"{name} rows {r0}:{r1}")
    with pytest.raises(ValueError):
        K.DEQUANTIZE_ROWS[qtype](w, 0, 2, np.empty((3, 768), np.float32))


# ---- the portable code path (no AVX2, no F16C), in a fresh process


PORTABLE_CHECK = r"""
import numpy as np
from numba.core.registry import cpu_target
from engine.kernels.kquant import family as K
from engine.kernels.simd import target_features
from engine.quant import GGMLType, dequantize_rows
assert "+avx2" not in target_features(cpu_target.target_context), target_features(cpu_target.target_context)
def same(a, b):
    nan = np.isnan(b)
    return np.array_equal(np.isnan(a), nan) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))
g = np.load("tests/fixtures/kernels/kquant_q8k.npz")
assert all(np.array_equal(K.quantize_q8_k(g["x_" + c][:4]), g["xq_" + c][:4]) for c in ("normal", "edge", "nonfinite"))
for t in K.KQUANT_TYPES:
    g = np.load(f"tests/fixtures/kernels/kquant_{t.name}.npz")
    for key in [k for k in g.files if k.startswith("dot_")]:
        wcase, xcase = key[4:].split("_")
        w, xq = g["w_" + wcase], g["xq_" + xcase]
        ours = np.stack([K.GEMV[t](w, row, np.empty(len(w), np.float32)) for row in xq])
        assert same(ours, g[key]), (t.name, key)
    w = g["w_random"]
    out = K.DEQUANTIZE_ROWS[t](w, 0, len(w), np.empty((len(w), 512), np.float32))  # rows of 512 weights
    assert same(out, dequantize_rows(w, t)), t.name
print("portable ok")
"""


def test_portable_path_without_avx2(tmp_path):
    """NUMBA_CPU_NAME=generic: plain vector IR instead of the x86 intrinsics, integer fp16 decoding; same bits."""
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CPU_FEATURES": "", "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", PORTABLE_CHECK], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0 and "portable ok" in done.stdout, done.stderr[-3000:]


# ---- the reference's float helpers


def test_fma_f32_rounds_once():
    a = np.float32(1.0 + 2.0**-12)
    # a * a = 1 + 2^-11 + 2^-24: a separate product rounds the 2^-24 away, the fused one keeps it
    assert fma_f32(a, a, np.float32(-1.0)) == np.float32(2.0**-11 + 2.0**-24)
    assert np.float32(a * a) - np.float32(1.0) == np.float32(2.0**-11)
    if np.finfo(np.longdouble).nmant < 63:
        return  # no x87 extended precision to check against
    rng = np.random.default_rng(2)
    x, y, z = (rng.standard_normal(100000).astype(np.float32) for _ in range(3))
    # in 64-bit-mantissa arithmetic x * y is exact and one more rounding to float32 is correct
    exact = (x.astype(np.longdouble) * y + z).astype(np.float32)
    assert np.array_equal(fma_f32(x, y, z), exact)


def test_hsum8_order():
    a = np.array([1e8, 1, -1e8, 1, 1, 1, 1, 1], np.float32)
    # ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): the ones added to 1e8 are lost
    assert hsum8(a) == np.float32(4.0)
