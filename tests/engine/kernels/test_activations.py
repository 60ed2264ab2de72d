"""Activation quantizers: the bytes of ggml-cpu's from_float (x86 AVX2/AVX-512 build), from llama.cpp fixtures.

Fixtures: tests/fixtures/kernels/activations.npz, made by tools/make_kernel_fixtures.py from
llama-cpp-python's libggml-cpu. Every quantizer is checked in its compiled form and its NumPy twin.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from engine.kernels import activations as A
from engine.quant import quantize
from engine.quant.types import GGMLType

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kernels" / "activations.npz"
QUANTIZERS = {
    "Q8_0": (A.quantize_q8_0, A.quantize_q8_0_ref, 34),
    "Q8_1": (A.quantize_q8_1, A.quantize_q8_1_ref, 36),
    "F16": (A.quantize_f16, A.quantize_f16_ref, 2),
    "BF16": (A.quantize_bf16, A.quantize_bf16_ref, 2),
}


@pytest.fixture(scope="module")
def golden() -> dict[str, np.ndarray]:
    with np.load(FIXTURES) as f:
        return {k: f[k] for k in f.files}


def _cases(golden: dict[str, np.ndarray]) -> list[str]:
    return sorted(k[2:] for k in golden if k.startswith("x_"))


def _first_bad_block(ours: np.ndarray, theirs: np.ndarray, size: int) -> str:
    bad = np.flatnonzero((ours.reshape(-1, size) != theirs.reshape(-1, size)).any(axis=1))
    return f"{len(bad)} blocks differ, first {bad[:5]}" if len(bad) else ""


@pytest.mark.parametrize("name", list(QUANTIZERS))
@pytest.mark.parametrize("which", ["compiled", "numpy"])
def test_bytes_match_llama_cpp(golden, name, which):
    fn, ref, size = QUANTIZERS[name]
    quantizer = fn if which == "compiled" else ref
    for case in _cases(golden):
        ours = quantizer(golden[f"x_{case}"])
        theirs = golden[f"{name}_{case}"]
        assert ours.shape == theirs.shape, case
        assert np.array_equal(ours, theirs), f"{name} {case}: {_first_bad_block(ours, theirs, size)}"


def test_fixtures_exercise_the_x86_rounding(golden):
    """The tie cases round half to even (x86), unlike quantize_row_q8_0_ref (roundf), so the fixture has teeth."""
    x = golden["x_edge"]
    reference = quantize(x, GGMLType.Q8_0)  # engine.quant: quantize_row_q8_0_ref
    assert not np.array_equal(reference, golden["Q8_0_edge"])
    assert np.array_equal(A.quantize_q8_0(x), golden["Q8_0_edge"])


def test_nonfinite_rows_follow_the_x86_lanes(golden):
    """NaN and inf rows (maxps lane order, packs saturation, F16C NaN payload) match ggml byte for byte."""
    x = golden["x_nonfinite"]
    assert np.isnan(x).any() and np.isinf(x).any()
    for name, (fn, ref, _) in QUANTIZERS.items():
        assert np.array_equal(fn(x), golden[f"{name}_nonfinite"]), name
        assert np.array_equal(ref(x), golden[f"{name}_nonfinite"]), name


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_compiled_equals_numpy_on_random_and_hostile_rows(name):
    fn, ref, _ = QUANTIZERS[name]
    rng = np.random.default_rng(5)
    scale = rng.choice(np.array([1e-38, 1e-3, 1.0, 1e4, 1e37], np.float32), (40, 1))
    with np.errstate(over="ignore"):  # heavy tails times 1e37 overflow to inf on purpose
        x = rng.standard_t(2.0, (40, 320)).astype(np.float32) * scale
    u = rng.random(x.shape)
    x[u < 0.003] = np.nan
    x[u > 0.997] = np.inf
    x[(u > 0.5) & (u < 0.503)] = -np.inf
    x[3] = 0.0
    x[4, ::3] = -0.0
    assert np.array_equal(fn(x), ref(x))


def test_q8_1_sum_is_d_times_the_quants():
    """block_q8_1.s = fp16(d * sum(qs)) with d = amax / 127 in float32 (before d itself is rounded to fp16)."""
    x = np.random.default_rng(2).standard_normal((3, 128)).astype(np.float32)
    b = A.quantize_q8_1(x).reshape(-1, 36)
    d32 = (np.abs(x).reshape(-1, 32).max(axis=1) / np.float32(127)).astype(np.float32)
    s = b[:, 2:4].copy().view("<f2").astype(np.float32)[:, 0]
    total = b[:, 4:].view(np.int8).astype(np.int64).sum(axis=1)
    assert np.array_equal(s, (d32 * total.astype(np.float32)).astype(np.float16).astype(np.float32))
    assert np.array_equal(b[:, :2], A.quantize_q8_0(x).reshape(-1, 34)[:, :2])


def test_row_and_batch_shapes_agree():
    x = np.random.default_rng(3).standard_normal((4, 96)).astype(np.float32)
    for fn, _, size in QUANTIZERS.values():
        batch = fn(x)
        assert batch.shape == (4, 96 // (32 if size > 2 else 1) * size)
        assert np.array_equal(fn(x[2]), batch[2])
    assert A.quantize_f32(x).view(np.float32).tolist() == x.tolist()


def test_rows_must_be_whole_blocks():
    with pytest.raises(ValueError, match="multiple of the Q8 block size"):
        A.quantize_q8_0(np.zeros(40, np.float32))
    with pytest.raises(ValueError, match="row"):
        A.quantize_q8_1(np.zeros((2, 2, 32), np.float32))


def test_vec_dot_types_and_dispatch():
    assert A.VEC_DOT_TYPE[GGMLType.Q4_1] == GGMLType.Q8_1
    assert A.VEC_DOT_TYPE[GGMLType.Q5_0] == GGMLType.Q8_0
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    assert np.array_equal(A.quantize_activation(GGMLType.Q5_1, x), A.quantize_q8_1(x))
    assert np.array_equal(A.quantize_activation(GGMLType.F16, x), A.quantize_f16(x))
    with pytest.raises(ValueError, match="Q4_K"):
        A.quantize_activation(GGMLType.Q4_K, x)


def test_kernel_lock_is_one_shared_lock():
    assert isinstance(A.KERNEL_LOCK, type(threading.Lock()))
    with A.KERNEL_LOCK:
        assert A.KERNEL_LOCK.locked()
