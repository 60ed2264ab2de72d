"""Reads of a growing recording extended by their new rows (engine.observe.recurrent_extend, ReadsMemo): the same
numbers as a fresh decomposition of the whole window, a window start that moves in strides, a regenerated reply
told from one that streamed on, and only the new positions computed."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

import engine.observe.recurrent_maps as maps
from engine.observe.recorder import Recorder
from engine.observe.recurrent import _head_reads, delta_rule_outputs, delta_rule_reads
from engine.observe.recurrent_extend import delta_rule_rows, extend_reads, window_start, window_stride
from engine.observe.recurrent_maps import ReadsMemo, layer_reads

KH, VH, S = 2, 4, 8


def _l2(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _inputs(n: int, h: int, s: int, seed: int, gate: float = 0.1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"q": _l2(rng.normal(size=(n, h, s))), "k": _l2(rng.normal(size=(n, h, s))), "v": rng.normal(size=(n, h, s)),
            "g": -rng.uniform(0.0, gate, (n, h)), "beta": rng.uniform(0.1, 0.9, (n, h))}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    b = np.asarray(b, np.float64)
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-300))


def _grow(rec: Recorder, extra: int, seed: int, layers: tuple[int, ...] = (0, 2)) -> None:
    """Append `extra` positions to each recurrent layer (a fresh recorder when it has none yet)."""
    rng = np.random.default_rng(seed)
    n = rec.length
    rec.begin(n, extra)
    for layer in layers:
        x = {
            "q": _l2(rng.normal(size=(extra, KH, S))), "k": _l2(rng.normal(size=(extra, KH, S))),
            "v": rng.normal(size=(extra, VH, S)), "g": -rng.uniform(0.0, 0.1, (extra, VH)),
            "beta": rng.uniform(0.1, 0.9, (extra, VH)),
        }
        rec.record_recurrent(layer, n, x["q"], x["k"], x["v"], x["g"], x["beta"])
    rec.commit()


def _same(a: maps.LayerReads, b: maps.LayerReads) -> None:
    assert a.start == b.start and a.stop == b.stop
    assert _rel(a.reads.weights, b.reads.weights) < 1e-6
    assert _rel(a.reads.initial, b.reads.initial) < 1e-6
    np.testing.assert_array_equal(a.reads.wrote, b.reads.wrote)
    np.testing.assert_array_equal(a.reads.kept, b.reads.kept)
    np.testing.assert_array_equal(a.v_power, b.v_power)


@pytest.mark.parametrize("first", [0, 1, 37, 49])
def test_rows_carried_back_are_the_triangular_solves_rows(first: int) -> None:
    x = _inputs(50, 3, 16, seed=first)
    s0 = np.random.default_rng(7).normal(size=(3, 16, 16))
    w, init = delta_rule_rows(**x, state0=s0, first=first)
    assert w.shape == (3, 50 - first, 50) and init.shape == (3, 50 - first, 16)
    scale = 1.0 / math.sqrt(16)
    for h in range(3):
        full = _head_reads(x["q"][:, h], x["k"][:, h], x["g"][:, h], x["beta"][:, h], scale)  # float64 (T, T)
        assert _rel(w[h], full[first:]) < 1e-10
        e = np.exp(np.cumsum(x["g"][:, h]))[:, None]
        want = e * (x["q"][:, h] @ s0[h]) * scale - full @ (e * (x["k"][:, h] @ s0[h]))
        assert _rel(init[h], want[first:]) < 1e-10
    out, _ = delta_rule_outputs(**x, state0=s0)  # the rows rebuild the recurrence's outputs
    rebuilt = np.einsum("hts,shj->thj", w, x["v"]) + init.transpose(1, 0, 2)
    assert _rel(rebuilt, out[first:]) < 1e-10
    w0, init0 = delta_rule_rows(**x, state0=None, first=first)
    np.testing.assert_array_equal(w0, w)
    assert (init0 == 0).all()


@pytest.mark.parametrize("shift", [0, 5])
def test_extended_reads_are_a_fresh_decomposition(shift: int) -> None:
    x = _inputs(60, 3, 16, seed=3)
    s0 = np.random.default_rng(8).normal(size=(3, 16, 16))
    old = delta_rule_reads(**{n: a[:40] for n, a in x.items()}, state0=s0)
    _, s1 = delta_rule_outputs(**{n: a[:shift] for n, a in x.items()}, state0=s0)
    later = {n: a[shift:] for n, a in x.items()}
    grown = extend_reads(old, shift, **later, state0=s1)
    fresh = delta_rule_reads(**later, state0=s1)
    assert _rel(grown.weights, fresh.weights) < 1e-6 and _rel(grown.initial, fresh.initial) < 1e-6
    np.testing.assert_array_equal(grown.weights[:, : 40 - shift, : 40 - shift], old.weights[:, shift:, shift:])
    with pytest.raises(ValueError):
        extend_reads(old, 40, **later, state0=s1)  # nothing kept: not a continuation


def test_the_window_start_moves_in_strides() -> None:
    for window in (1, 10, 16, 512):
        step = window_stride(window)
        assert 1 <= step <= 64 and (window < 512 or step == 64)
        starts = [window_start(n, window) for n in range(3 * window + 200)]
        for n, start in enumerate(starts):
            if n <= window:
                assert start == 0
            else:
                assert start % step == 0 and window <= n - start < window + step
        moves = [n for n in range(1, len(starts)) if starts[n] != starts[n - 1]]
        assert all(b - a == step for a, b in zip(moves, moves[1:]))


def test_a_streaming_recording_is_extended_and_equals_a_fresh_decomposition(monkeypatch: pytest.MonkeyPatch) -> None:
    window = 24  # stride 3: the start moves every third position past 24
    rec = Recorder()
    _grow(rec, 20, seed=0)
    memo = ReadsMemo(window=window)
    first = memo.get(rec, 0)
    assert memo.computed == 1 and memo.extended == 0 and first.start == 0
    solves: list[int] = []
    real = maps.delta_rule_reads
    monkeypatch.setattr(maps, "delta_rule_reads", lambda *a, **kw: solves.append(1) or real(*a, **kw))
    starts = []
    for step in range(12):  # 20 -> 56 positions, 3 at a time: the start moves from 0 to 30
        before = memo.get(rec, 0)
        _grow(rec, 3 if step % 2 else 2, seed=10 + step)
        grown = memo.get(rec, 0)
        assert memo.computed == 1 and memo.extended == step + 1 and not solves  # new rows only, no solve
        assert memo.get(rec, 0) is grown  # the same recording: found again
        kept = before.stop - grown.start
        shift = grown.start - before.start
        np.testing.assert_array_equal(grown.reads.weights[:, :kept, :kept], before.reads.weights[:, shift:, shift:])
        starts.append(grown.start)
        monkeypatch.setattr(maps, "delta_rule_reads", real)
        _same(grown, layer_reads(rec, 0, window))
        monkeypatch.setattr(maps, "delta_rule_reads", lambda *a, **kw: solves.append(1) or real(*a, **kw))
    assert starts[0] == 0 and len(set(starts)) > 3 and (np.abs(grown.reads.initial).max() > 1e-3)


def test_a_regenerated_reply_is_decomposed_again() -> None:
    rec = Recorder()
    _grow(rec, 40, seed=1)
    memo = ReadsMemo(window=16)
    memo.get(rec, 0)
    rec.truncate(37)  # the last tokens regenerated, then the reply goes on: other gates from 37
    _grow(rec, 6, seed=2)
    again = memo.get(rec, 0)
    assert memo.computed == 2 and memo.extended == 0
    _same(again, layer_reads(rec, 0, 16))
    _grow(rec, 2, seed=3)  # that one streams on: extended
    _same(memo.get(rec, 0), layer_reads(rec, 0, 16))
    assert memo.computed == 2 and memo.extended == 1


def test_a_layer_whose_reads_were_not_kept_is_decomposed_whole() -> None:
    rec = Recorder()
    _grow(rec, 30, seed=4)
    memo = ReadsMemo(window=16, budget=1)  # the newest layer only
    memo.get(rec, 0)
    memo.get(rec, 2)
    _grow(rec, 2, seed=5)
    _same(memo.get(rec, 0), layer_reads(rec, 0, 16))  # layer 0 went: whole
    assert memo.computed == 3 and memo.extended == 0
    no_carry = ReadsMemo(window=16, carry_budget=1)  # no starting state kept: run from zero, still exact
    no_carry.get(rec, 2)
    _grow(rec, 3, seed=6)
    _same(no_carry.get(rec, 2), layer_reads(rec, 2, 16))
    assert no_carry.extended == 1


def test_timing_of_an_extension_against_a_full_decomposition() -> None:
    """Printed, never asserted: a refresh after four new positions, extended and decomposed whole."""
    x = _inputs(204, 8, 64, seed=5)
    t0 = time.perf_counter()
    old = delta_rule_reads(**{n: a[:200] for n, a in x.items()})
    t1 = time.perf_counter()
    extend_reads(old, 0, **x)
    t2 = time.perf_counter()
    print(f"\n8 heads, S 64, 200 -> 204 positions: full {1e3 * (t1 - t0):.1f} ms, extended {1e3 * (t2 - t1):.1f} ms")
