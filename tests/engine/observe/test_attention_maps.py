"""Attention maps for display: batched rows match the Recorder, pooling matches a direct computation."""
from __future__ import annotations

import numpy as np
import pytest

import engine.models.registry  # noqa: F401 - import order: the models before engine.observe.recorder
from engine.observe import attention_maps as am
from engine.cache import KVCache
from engine.models.args import LayerAttentionSpec
from engine.observe.recorder import Recorder


def _run(n: int = 50, heads: int = 6, kv: int = 2, d: int = 8, window: int | None = None, seed: int = 0):
    rng = np.random.default_rng(seed)
    rec = Recorder()
    rec.specs = {0: LayerAttentionSpec(0.35, window, heads // kv, 1e4), 1: LayerAttentionSpec(0.35, None, heads // kv, 1e6)}
    rec.q = {i: rng.standard_normal((heads, n + 3, d)).astype(np.float32) for i in (0, 1)}
    rec.length = n
    cache = KVCache(2, kv, d, 4096)
    cache.reserve(n)
    for layer in (0, 1):
        k = rng.standard_normal((kv, n, d)).astype(np.float32)
        cache.write(layer, 0, k, np.zeros_like(k))
    cache.commit(list(range(n)))
    return rec, cache


def _full(rec, cache, layer):
    """(H, N, N) straight from the Recorder, one head at a time."""
    return np.stack([rec.attention(cache, layer, h) for h in range(rec.q[layer].shape[0])])


@pytest.mark.parametrize("window", [None, 7])
def test_attention_rows_match_the_recorder_and_sum_to_one(window) -> None:
    rec, cache = _run(window=window)
    rows = np.array([0, 3, 17, 49])
    w = am.attention_rows(rec, cache, 0, rows)
    assert w.shape == (6, 4, 50)
    np.testing.assert_allclose(w.sum(axis=2), 1.0, rtol=1e-5)
    for h in range(6):
        np.testing.assert_allclose(w[h], rec.attention(cache, 0, h, rows), rtol=1e-5, atol=1e-7)
    future = np.triu(np.ones((50, 50), bool), 1)[rows]  # (R, N) keys after the query
    assert np.all(w[:, future] == 0)  # causal
    one = am.attention_rows(rec, cache, 0, rows, heads=[4])
    np.testing.assert_allclose(one[0], w[4], rtol=1e-5, atol=1e-7)
    if window:
        assert np.all(w[:, 3, : 49 - window + 1] == 0)  # row 49 sees keys 43..49 only


def test_pooled_grid_matches_a_direct_computation() -> None:
    rec, cache = _run(n=50, window=None)
    rec.specs[0] = LayerAttentionSpec(0.35, 9, 3, 1e4)  # layer 0 local, layer 1 global
    g = am.attention_grid(rec, cache, [0, 1], thumb=8)
    starts = am.bin_starts(50, 8)
    assert g.max_pooled.shape == (2, 6, 8, 8) and g.rows.size == 50
    for layer in (0, 1):
        full = _full(rec, cache, layer)  # (H, N, N)
        window = rec.specs[layer].window
        allowed = am.allowed_mask(np.arange(50), 50, window)
        direct_max = np.maximum.reduceat(np.maximum.reduceat(full, starts, axis=1), starts, axis=2)
        counts = np.add.reduceat(np.add.reduceat(allowed.astype(float), starts, axis=0), starts, axis=1)
        sums = np.add.reduceat(np.add.reduceat(full, starts, axis=1), starts, axis=2)
        masked = counts == 0
        np.testing.assert_allclose(np.where(masked, np.nan, direct_max), g.max_pooled[layer], rtol=1e-5)
        np.testing.assert_allclose(np.where(masked, np.nan, sums / np.maximum(counts, 1)), g.mean_pooled[layer], rtol=1e-5)
        no0 = full.copy()
        no0[:, :, 0] = 0
        first = np.maximum.reduceat(no0[:, :, : starts[1]].max(axis=2), starts, axis=1)
        np.testing.assert_allclose(np.where(masked[:, 0], np.nan, first), g.nosink_pooled[layer][:, :, 0], rtol=1e-5)
        np.testing.assert_allclose(g.sink[layer], full[:, :, 0].mean(axis=1), rtol=1e-5)
        np.testing.assert_allclose(g.self_[layer], np.einsum("hii->hi", full).mean(axis=1), rtol=1e-5)
        prev = np.array([[full[h, i, i - 1] for i in range(1, 50)] for h in range(6)]).mean(axis=1)
        np.testing.assert_allclose(g.prev[layer], prev, rtol=1e-5)
    assert np.isnan(g.max_pooled[0][:, 7, 0]).all()  # the local layer's last rows cannot see the start


def test_sampled_rows_keep_every_bin_and_the_last_row() -> None:
    rows = am.sample_rows(2000, 32, 32)
    assert rows[-1] == 1999 and rows.size == 32
    bins = np.searchsorted(am.bin_starts(2000, 32), rows, side="right") - 1
    assert set(bins) == set(range(32))
    assert am.sample_rows(2000, 100, 32).size >= 90
    assert am.sample_rows(20, 32, 32).size == 20
    rec, cache = _run(n=60)
    g = am.attention_grid(rec, cache, [1], thumb=8, max_rows=8)
    assert g.rows.size == 8 and np.isfinite(np.diagonal(g.max_pooled[0], axis1=1, axis2=2)).all()


def test_aggregates_over_heads_and_layers() -> None:
    rec, cache = _run(n=30)
    full = [_full(rec, cache, layer) for layer in (0, 1)]
    rows = np.arange(10, 30)
    np.testing.assert_allclose(am.aggregate_attention(rec, cache, [0], "mean", rows), full[0][:, 10:].mean(0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(am.aggregate_attention(rec, cache, [1], "max", rows), full[1][:, 10:].max(0), rtol=1e-5)
    both = am.aggregate_attention(rec, cache, [0, 1], 2, rows, layer_how="max")
    np.testing.assert_allclose(both, np.maximum(full[0][2, 10:], full[1][2, 10:]), rtol=1e-5)
    mean_all = am.aggregate_attention(rec, cache, [0, 1], "mean", rows, layer_how="mean", chunk=7)
    np.testing.assert_allclose(mean_all.sum(axis=1), 1.0, rtol=1e-5)


def test_fit_side_max_pools_to_the_limit() -> None:
    w = np.arange(12 * 10, dtype=np.float32).reshape(12, 10)
    allowed = np.tril(np.ones((12, 10), bool))
    out, ok, rs, cs = am.fit_side(w, allowed, 5)
    assert (rs, cs) == (3, 2) and out.shape == (4, 5)
    assert out[0, 0] == w[:3, :2].max() and ok[0, 4] == allowed[:3, 8:].any()
    assert am.fit_side(w, allowed, 5, 20)[2:] == (3, 1)
    same = am.fit_side(w, allowed, 100)
    assert same[2:] == (1, 1) and same[0] is w


def test_empty_and_single_token_contexts() -> None:
    rec, cache = _run(n=1)
    g = am.attention_grid(rec, cache, [0, 1], thumb=32)
    assert g.max_pooled.shape == (2, 6, 1, 1) and np.allclose(g.max_pooled, 1.0)
    assert np.isnan(g.nosink_pooled).all()
    rec.length = 0
    cache.truncate(0)
    assert am.attention_grid(rec, cache, [0], thumb=32).rows.size == 0
