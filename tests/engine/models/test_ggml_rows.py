"""The compiled row kernels of RMSNorm and GeGLU give the NumPy statement's bits (ggml_ops), edge values included."""
from __future__ import annotations

import numpy as np
import pytest

from engine.kernels.dispatch import compiled
from engine.ops import ggml as ggml_ops

pytestmark = pytest.mark.skipif(not compiled(), reason="the compiled twins need numba")


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    nan = np.isnan(a) & np.isnan(b)
    return a.shape == b.shape and bool(np.all(nan | (a.view(np.uint32) == b.view(np.uint32))))


def _rows(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((9, 640)) * rng.uniform(1e-3, 1e3, (9, 1))).astype(np.float32)
    x[1] = 0.0
    x[2, 5] = np.inf
    x[3, 7] = np.nan
    x[4] = np.float32(3e38)  # squares overflow float32
    x[5] = np.float32(1e-40)  # subnormals
    return x


def test_rms_norm_rows_equal_the_numpy_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = _rows(1), np.random.default_rng(2).standard_normal(640).astype(np.float32)
    fast = [ggml_ops.rms_norm(x, w, 1e-6), ggml_ops.rms_norm(x, None, 1e-5)]
    monkeypatch.setattr(ggml_ops, "_compiled", lambda: False)
    with np.errstate(all="ignore"):  # the overflowing and NaN rows, as ggml computes them
        slow = [ggml_ops.rms_norm(x, w, 1e-6), ggml_ops.rms_norm(x, None, 1e-5)]
    assert all(_same(a, b) for a, b in zip(fast, slow))


def test_geglu_rows_equal_the_numpy_statement(monkeypatch: pytest.MonkeyPatch) -> None:
    g = np.concatenate([_rows(3), np.linspace(-12, 12, 9 * 640, dtype=np.float32).reshape(9, 640)])
    u = np.random.default_rng(4).standard_normal(g.shape).astype(np.float32)
    fast = ggml_ops.geglu(g, u)
    monkeypatch.setattr(ggml_ops, "_compiled", lambda: False)
    with np.errstate(all="ignore"):
        assert _same(fast, ggml_ops.geglu(g, u))
