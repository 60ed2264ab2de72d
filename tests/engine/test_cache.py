"""KVCache: growth, commit semantics, and F16 / Q8_0 / Q4_0 rows like llama.cpp's --cache-type-k/v."""
from __future__ import annotations

import numpy as np
import pytest

from engine.cache import KVCache
from engine.errors import ContextFullError, SettingError
from engine.quant import dequantize_rows, quantize
from engine.quant.types import GGMLType


def filled(cache_type: str) -> tuple[KVCache, np.ndarray]:
    c = KVCache(n_layers=2, n_kv_heads=3, head_dim=64, n_ctx=600, cache_type=cache_type)
    x = np.random.default_rng(0).standard_normal((3, 300, 64)).astype(np.float32)
    c.reserve(300)
    c.write(1, 0, x, -x)
    c.commit(list(range(300)))
    return c, x


@pytest.mark.parametrize("cache_type,row_bytes,tol", [("F32", 256, 0), ("F16", 128, 1e-3), ("Q8_0", 68, 0.03), ("Q4_0", 36, 0.3)])
def test_rows_round_trip_and_bytes(cache_type: str, row_bytes: int, tol: float) -> None:
    c, x = filled(cache_type)
    k = c.keys(1)
    assert k.dtype == np.float32 and k.shape == x.shape
    assert np.abs(k - x).max() <= tol * np.abs(x).max() + 1e-7
    np.testing.assert_array_equal(c.values(1), -k)
    # 2 x layers x tokens x kv_heads x bytes per head row
    assert c.nbytes == 2 * 2 * 300 * 3 * row_bytes
    assert c.bytes_for(600) == 2 * c.nbytes


def test_q8_0_rows_are_ggml_blocks() -> None:
    c, x = filled("Q8_0")
    blocks = quantize(x.reshape(-1, 64), GGMLType.Q8_0)
    np.testing.assert_array_equal(c.k[1][:, :300].reshape(-1, 68), blocks)
    np.testing.assert_array_equal(c.keys(1).reshape(-1, 64), dequantize_rows(blocks, GGMLType.Q8_0))


def test_growth_keeps_rows_and_context_limit() -> None:
    c, x = filled("F32")
    c.reserve(590)
    assert c.capacity >= 590
    np.testing.assert_array_equal(c.keys(1), x)
    with pytest.raises(ContextFullError, match="600"):
        c.reserve(601)


def test_commit_truncate_prefix() -> None:
    c, _ = filled("F32")
    assert c.common_prefix(list(range(10)) + [99]) == 10
    c.truncate(5)
    assert c.length == 5 and c.keys(1).shape[1] == 5


@pytest.mark.parametrize("bad", ["Q5_K", "bf17", ""])
def test_bad_cache_type(bad: str) -> None:
    with pytest.raises(SettingError):
        KVCache(1, 1, 64, 16, bad)
