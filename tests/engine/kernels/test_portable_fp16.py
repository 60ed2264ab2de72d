"""fp16 conversions and activation quantization on a target without F16C (NUMBA_CPU_NAME=generic): integer
arithmetic with the bits of vcvtps2ph / vcvtph2ps (LLVM's fp16 helper calls would crash numba's JIT)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.kernels.dispatch import compiled

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.skipif(not compiled(), reason="needs the compiled (numba) kernels")

CHECK = r"""
import sys
import numpy as np
from engine.kernels.activations import f16_to_f32, f32_to_f16, njit, quantize_q8_0, quantize_q8_1, quantize_f16
@njit
def to32(h, out):
    for i in range(h.shape[0]):
        out[i] = f16_to_f32(h[i])
@njit
def to16(x, out):
    for i in range(x.shape[0]):
        out[i] = f32_to_f16(x[i])
x = np.load(sys.argv[1])
h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
a, b = np.empty(65536, np.float32), np.empty(x.shape[0], np.uint16)
to32(h, a); to16(x, b)
rows = x[: (x.shape[0] // 256) * 256].reshape(-1, 256)
rows = np.where(np.isfinite(rows), rows, 0).astype(np.float32)
np.savez(sys.argv[2], to32=a, to16=b, q80=quantize_q8_0(rows), q81=quantize_q8_1(rows), f16=quantize_f16(rows))
"""


def _floats() -> np.ndarray:
    rng = np.random.default_rng(5)
    edges = np.array([0.0, -0.0, 1.0, 65504.0, 65519.99, 65520.0, 65536.0, 1e9, 6e-8, 5.96e-8, 2.98e-8, 2.99e-8,
                      6.1e-5, 6.103e-5, 1e-45, np.inf, -np.inf, np.nan], np.float32)
    bits = rng.integers(0, 2**32, 200000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    halfway = (np.arange(1, 65535, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
               .view(np.uint32) + np.uint32(0x1000)).view(np.float32)  # ties between fp16 neighbours
    return np.concatenate([edges, bits, halfway, (rng.standard_normal(60000) * 3).astype(np.float32)])


def _run(tmp_path, x_path, name: str, generic: bool) -> dict[str, np.ndarray]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / f"nb_{name}")}
    if generic:
        env.update(NUMBA_CPU_NAME="generic", NUMBA_CPU_FEATURES="")
    out = tmp_path / f"{name}.npz"
    done = subprocess.run([sys.executable, "-c", CHECK, str(x_path), str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as f:
        return {k: f[k] for k in f.files}


def test_fp16_conversions_and_quantizers_match_f16c(tmp_path):
    """Every fp16 value to float32, 260k floats to fp16, and the Q8_0 / Q8_1 / F16 quantizers: the same bytes
    on the generic target as on this machine's (F16C)."""
    np.save(tmp_path / "x.npy", _floats())
    native = _run(tmp_path, tmp_path / "x.npy", "native", False)
    generic = _run(tmp_path, tmp_path / "x.npy", "generic", True)
    for key, value in native.items():
        assert np.array_equal(generic[key].view(np.uint8), value.view(np.uint8)), key
