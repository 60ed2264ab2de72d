"""The recurrent layers' maps as the lenses use them: rows in the recording's coordinates, pooled thumbnails, the
memo of decomposed layers, and head roles scored on read maps (engine.observe.recurrent_maps, recurrent_roles).

The recordings are synthetic: random L2-normalised q, k, values, decays and write strengths put into a Recorder
as a DeltaNet layer would (Recorder.record_recurrent), so every number can be checked against the exact
decomposition (engine.observe.recurrent) it is built from.
"""
from __future__ import annotations

import numpy as np
import pytest

from engine.observe.attention_maps import bin_starts, sample_rows
from engine.observe.head_roles import ROLES, HeadRoles, Sink
from engine.observe.recorder import Recorder
from engine.observe.recurrent import delta_rule_outputs
from engine.observe.recurrent_maps import ReadsMemo, layer_reads, reads_grid, recurrent_layers
from engine.observe.recurrent_roles import merge_roles, recurrent_head_roles

N, KH, VH, S = 40, 2, 4, 8


def _recorder(n: int = N, seed: int = 0, layers: tuple[int, ...] = (0, 2)) -> Recorder:
    rng = np.random.default_rng(seed)
    rec = Recorder()
    rec.begin(0, n)
    for layer in layers:
        q = rng.standard_normal((n, KH, S))
        k = rng.standard_normal((n, KH, S))
        q /= np.linalg.norm(q, axis=-1, keepdims=True)
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        v = rng.standard_normal((n, VH, S))
        g = -rng.uniform(0.0, 0.5, (n, VH))
        beta = rng.uniform(0.1, 0.9, (n, VH))
        rec.record_recurrent(layer, 0, q, k, v, g, beta)
    rec.commit()
    return rec


def test_full_rows_rebuild_each_output_and_put_keys_where_they_are() -> None:
    rec = _recorder()
    reads = layer_reads(rec, 0, window=16)
    assert reads is not None and reads.start == N - 16 and reads.stop == N
    rows = np.array([3, N - 16, N - 5, N - 1])
    shares, signed, earlier = reads.full_rows(rows, N)
    assert shares.shape == signed.shape == (VH, 4, N) and earlier.shape == (VH, 4)
    assert np.isnan(shares[:, 0]).all() and np.isnan(earlier[:, 0]).all()  # a row before the window: not decomposed
    inside = shares[:, 1:]
    assert (inside[..., : N - 16] == 0).all()  # keys before the window are the earlier context, not a key's share
    np.testing.assert_allclose(inside.sum(-1) + earlier[:, 1:], 1.0, atol=1e-5)  # each row's shares sum to 1
    for j, t in enumerate(rows[1:], start=1):
        assert (shares[:, j, t + 1 :] == 0).all()  # causal: nothing read from later tokens
    # the signed weights and the earlier part rebuild the recurrence's outputs exactly
    got = rec.recurrent_inputs(0)
    heads = np.arange(VH) % KH
    q, k, v = got["q"][:, heads], got["k"][:, heads], got["v"]
    out, _ = delta_rule_outputs(q, k, v, got["g"], got["beta"])
    t = N - 1
    rebuilt = np.einsum("hs,shd->hd", np.nan_to_num(signed[:, 3]), v.astype(np.float64)) + reads.reads.initial[:, -1]
    np.testing.assert_allclose(rebuilt, out[t], atol=2e-5)


def test_a_short_recording_has_no_earlier_context() -> None:
    rec = _recorder(n=12)
    reads = layer_reads(rec, 2)
    shares, _signed, earlier = reads.full_rows(np.arange(12), 12)
    assert reads.start == 0 and (earlier == 0).all()
    np.testing.assert_allclose(shares.sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("max_rows", [None, 12])
def test_the_grid_pools_the_shares_like_the_attention_grid(max_rows: int | None) -> None:
    rec = _recorder()
    reads = [layer_reads(rec, i) for i in recurrent_layers(rec)]
    g = reads_grid(reads, N, thumb=8, max_rows=max_rows, hidden=(0,))
    assert g.max_pooled.shape == (2, VH, 8, 8) and g.start == 0
    rows = sample_rows(N, max_rows, 8)
    np.testing.assert_array_equal(g.rows, rows)
    shares, _s, _e = reads[1].full_rows(rows, N)
    starts = bin_starts(N, 8)
    row_bins = np.searchsorted(starts, rows, side="right") - 1
    col = np.maximum.reduceat(shares, starts, axis=2)  # (H, R, T)
    for b in range(8):
        picked = col[:, row_bins == b]
        want = picked.max(axis=1)
        got = g.max_pooled[1, :, b]
        upper = np.arange(8) > b  # bins wholly after the row bin are masked
        assert np.isnan(got[:, upper]).all()
        np.testing.assert_allclose(got[:, ~upper], want[:, ~upper], atol=1e-6)
    np.testing.assert_allclose(g.self_[1], shares[:, np.arange(len(rows)), rows].mean(axis=1), atol=1e-6)
    later = row_bins > 0  # the first key bin (keys 0-4) without the hidden key 0: the max of keys 1-4
    no_sink = shares[:, :, 1 : starts[1]].max(axis=2)  # (H, R)
    for b in range(1, 8):
        np.testing.assert_allclose(g.nosink_pooled[1, :, b, 0], no_sink[:, row_bins == b].max(axis=1), atol=1e-6)
    assert later.any()


def test_rows_before_the_window_are_masked_in_the_grid() -> None:
    rec = _recorder()
    reads = [layer_reads(rec, 0, window=10)]
    g = reads_grid(reads, N, thumb=8)
    assert g.start == N - 10
    first_bin_in = int(np.searchsorted(bin_starts(N, 8), N - 10, side="right") - 1)
    assert np.isnan(g.max_pooled[0, :, :first_bin_in]).all()  # rows wholly before the window
    assert np.isnan(g.max_pooled[0, :, :, :first_bin_in]).all()  # keys wholly before it
    assert (g.earlier[0] > 0).all()


def test_the_memo_decomposes_a_layer_once_per_recording_and_forgets_a_changed_one() -> None:
    rec = _recorder()
    memo = ReadsMemo()
    a = memo.get(rec, 0)
    assert memo.get(rec, 0) is a and memo.computed == 1
    assert memo.get(rec, 1) is None  # not a recurrent layer
    rec.truncate(N - 1)  # a regenerated last token: other gates at the same length
    rng = np.random.default_rng(9)
    got = rec.recurrent_inputs(0)
    rec.begin(N - 1, 1)
    rec.record_recurrent(0, N - 1, got["q"][-1:], got["k"][-1:], rng.standard_normal((1, VH, S)),
                         -rng.uniform(0, 0.5, (1, VH)), rng.uniform(0.1, 0.9, (1, VH)))
    rec.commit()
    b = memo.get(rec, 0)
    assert b is not a and memo.computed == 2
    small = ReadsMemo(budget=1)  # never more than the newest layer
    small.get(rec, 0)
    small.get(rec, 2)
    assert len(small._items) == 1


def test_recurrent_heads_are_scored_on_their_reads_and_merged_with_attention_heads() -> None:
    rec = _recorder()
    tokens = list(range(N))
    reads = {i: layer_reads(rec, i) for i in recurrent_layers(rec)}
    roles = recurrent_head_roles(reads, tokens, N)
    assert roles is not None and roles.layers == (0, 2)
    shares, _s, _e = reads[0].full_rows(roles.rows, N)
    prev = shares[:, np.arange(len(roles.rows)), np.maximum(roles.rows - 1, 0)][:, roles.rows >= 1].mean(axis=1)
    np.testing.assert_allclose(roles.scores["previous"][0], prev, atol=1e-5)
    attn = HeadRoles((1,), {r: np.full((1, 2), 0.5, np.float32) for r in ROLES}, np.zeros((1, 2, N), np.float32),
                     np.ones((1, N), np.float32), (Sink(0, 2, 0.6, 1, 0, 9.0),), roles.rows, N)
    both = merge_roles(attn, roles)
    assert both.layers == (0, 1, 2) and both.scores["self"].shape == (3, VH)
    assert np.isnan(both.scores["self"][1, 2:]).all() and (both.scores["self"][1, :2] == 0.5).all()
    np.testing.assert_array_equal(both.scores["self"][2], roles.scores["self"][1])
    assert both.sinks == attn.sinks  # sinks stay the attention layers' own
    late = recurrent_head_roles({0: layer_reads(rec, 0, window=10)}, tokens, N)
    assert late is not None and late.rows.min() >= N - 10 and late.received.shape[-1] == N


def test_the_grid_is_the_same_a_few_rows_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.observe.recurrent_maps as maps

    rec = _recorder()
    reads = [layer_reads(rec, i, window=30) for i in recurrent_layers(rec)]
    whole = reads_grid(reads, N, thumb=8, hidden=(0, 5))
    monkeypatch.setattr(maps, "GRID_SCRATCH", 4 * VH * N * 3)  # three rows per step
    parts = reads_grid(reads, N, thumb=8, hidden=(0, 5))
    for name in ("max_pooled", "mean_pooled", "nosink_pooled", "nosink_mean", "sink", "prev", "self_", "earlier"):
        np.testing.assert_allclose(getattr(parts, name), getattr(whole, name), atol=1e-6, err_msg=name)


def _grow(rec: Recorder, extra: int, seed: int) -> None:
    """Append `extra` positions to every recurrent layer of `rec`."""
    rng = np.random.default_rng(seed)
    n = rec.length
    rec.begin(n, extra)
    for layer in recurrent_layers(rec):
        q = rng.standard_normal((extra, KH, S))
        k = rng.standard_normal((extra, KH, S))
        q /= np.linalg.norm(q, axis=-1, keepdims=True)
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
        rec.record_recurrent(layer, n, q, k, rng.standard_normal((extra, VH, S)), -rng.uniform(0, 0.5, (extra, VH)),
                             rng.uniform(0.1, 0.9, (extra, VH)))
    rec.commit()


def test_a_growing_recording_carries_the_state_before_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.observe.recurrent_maps as maps

    monkeypatch.setattr(maps, "PREFIX_CHUNK", 7)  # several chunks even for these short prefixes
    rec = _recorder()
    memo = ReadsMemo(window=12)
    memo.get(rec, 0)
    first = memo._carry[(id(rec), 0, 12)]
    assert first.pos == N - 12
    ran: list[int] = []
    real = maps.delta_rule_outputs

    def counted(q, *args, **kw):
        ran.append(len(q))
        return real(q, *args, **kw)

    monkeypatch.setattr(maps, "delta_rule_outputs", counted)
    _grow(rec, 9, seed=3)
    carried = memo.get(rec, 0)
    assert sum(ran) == 9  # only the new positions ran through the recurrence
    fresh = layer_reads(rec, 0, window=12)  # from zero, one chunk after another
    assert carried.start == fresh.start == N + 9 - 12
    np.testing.assert_array_equal(carried.reads.weights, fresh.reads.weights)
    np.testing.assert_array_equal(carried.reads.initial, fresh.reads.initial)
    rec.truncate(N - 20)  # cut back before the carried position, then grown again with other tokens
    _grow(rec, 25, seed=4)
    ran.clear()
    again = memo.get(rec, 0)
    assert sum(ran) == again.start  # the carried state was not this recording's: run from zero
    np.testing.assert_array_equal(again.reads.initial, layer_reads(rec, 0, window=12).reads.initial)
    tight = ReadsMemo(window=12, carry_budget=1)
    tight.get(rec, 0)
    assert tight._carry == {}
