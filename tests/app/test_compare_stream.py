"""Compare streams (issue 43 item 4): A and B run in step a chunk at a time, each chunk's rows go into the statistics
and are dropped, and every number equals a whole-run computation (both runs' full logits, as the job did before).
The models are closed when the job ends; the heads and the logit lens of the comparison still answer.
On a tiny llama built in code."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine.quality.compare as quality
from app.data.overrides import OverrideSpec
from app.jobs import compare as jobs
from app.jobs import reference
from app.jobs.compare import CompareWorkspace, compare_job, head_job
from app.jobs.logit_lens import logit_pair_job
from app.records.compare import CompareOptions, CompareRecord, HeadPair, top_union
from engine.generate import run_checked
from engine.observe.recorder import Recorder
from engine.quality.compare import layer_divergence, log_softmax_rows, token_stats
from tests.tiny_models import make_tiny_llama

TEXT = "the cat sat on the mat and the dog sat on the log, while 12 birds sang in the old tree by the river " * 4
N = 150  # tokens: two chunks of 128, the second one short


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", dim=256, n_heads=4, n_kv_heads=2,
                           hidden=512, n_ctx=512, tied=False)


@pytest.fixture(autouse=True)
def no_shared_references() -> Any:
    reference.forget_references()
    yield
    reference.forget_references()


def whole_run(model: Any, ids: list[int], cache_type: str) -> tuple[np.ndarray, Recorder]:
    """The log-probabilities of all of `ids` in one (N, n_vocab) array, prefilled CHUNK at a time (the old run_model)."""
    rec = Recorder(capture_q=True, capture_hidden=True)
    cache = model.new_cache(max(len(ids), 16), cache_type)
    logits = np.empty((len(ids), int(model.args.n_vocab)), np.float32)
    for r0 in range(0, len(ids), jobs.CHUNK):
        logits[r0 : r0 + jobs.CHUNK] = run_checked(model, ids[r0 : r0 + jobs.CHUNK], cache, rec, all_logits=True)
    return log_softmax_rows(logits, out=logits), rec


def compare(ws: CompareWorkspace, tiny: Path, opts: CompareOptions, spec: OverrideSpec | None) -> list[object]:
    return [i for i in compare_job(ws, str(tiny), opts, spec, threading.Event(), lambda item: None)]


@pytest.mark.parametrize("b_source, b_cache", [("preset", "F32"), ("file", "Q8_0")])
def test_streamed_statistics_equal_a_whole_run_computation(tiny: Path, b_source: str, b_cache: str) -> None:
    """The record's statistics, top tokens and per-layer curve, and the reference rows the sweep reuses, equal those of
    two whole runs (B: the Q4_0 preset, or the file itself with a Q8_0 cache: one model on two caches in step)."""
    ws, ref_ws = CompareWorkspace(), CompareWorkspace()
    try:
        opts = CompareOptions(b_source=b_source, b_preset="Q4_0", b_cache=b_cache, text=TEXT, max_tokens=N)
        items = compare(ws, tiny, opts, None)
        rec = next(i for i in items if isinstance(i, CompareRecord))
        assert ws.a is None and ws.b is None  # closed with the job
        ref_ws.use(str(tiny))
        a = ref_ws.model_a(lambda *_: None)
        b = ref_ws.model_b(OverrideSpec("Q4_0"), lambda *_: None, threading.Event())[0] if b_source == "preset" else a
        ids = [int(i) for i in rec.token_ids]
        assert len(ids) == N
        la, ra = whole_run(a, ids, "F32")
        lb, rb = whole_run(b, ids, b_cache)
        want = token_stats(la, lb, ids, logp=True)
        got = rec.stats.as_dict()
        for key, value in want.items():
            assert got[key] == (list(value) if isinstance(value, tuple) else value), key
        assert rec.stats.per_layer == layer_divergence(ra.hidden, rb.hidden, N)
        top_ids, top_a, top_b = top_union(la, lb)
        np.testing.assert_array_equal(rec.top_ids, top_ids)
        np.testing.assert_array_equal(rec.top_logp_a, top_a)
        np.testing.assert_array_equal(rec.top_logp_b, top_b)
        shared = reference.find_reference(a, ids)  # A read with an F32 cache: the file's reference run, kept
        assert shared is not None
        np.testing.assert_array_equal(shared.rows(0, N), la)
    finally:
        ws.close()
        ref_ws.close()


def test_no_whole_run_of_logits_is_ever_held(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch of rows the statistics get is one chunk of both runs (never all N positions at once), and
    the runs' logits of a chunk are gone before the next chunk runs."""
    monkeypatch.setattr(jobs, "CHUNK", 32)
    rows: list[int] = []
    live: list[Any] = []
    real_add = quality.TokenStats.add

    def add(self: Any, base: np.ndarray, other: np.ndarray) -> None:
        rows.append(base.shape[0])
        return real_add(self, base, other)

    def checked(model: Any, ids: Any, cache: Any, recorder: Any, all_logits: bool = False) -> np.ndarray:
        import weakref

        assert sum(r() is not None for r in live) <= 1, "an earlier chunk's logits are still alive"
        out = run_checked(model, ids, cache, recorder, all_logits=all_logits)
        live.append(weakref.ref(out))
        return out

    monkeypatch.setattr(quality.TokenStats, "add", add)
    monkeypatch.setattr("engine.generate.run_checked", checked)
    ws = CompareWorkspace()
    try:
        compare(ws, tiny, CompareOptions(b_source="preset", b_preset="Q8_0", text=TEXT, max_tokens=N), None)
    finally:
        ws.close()
    assert rows == [32, 32, 32, 32, 22] and len(live) == 10


def test_heads_and_the_logit_lens_answer_after_the_models_are_closed(tiny: Path) -> None:
    """The heads of the finished comparison are read from its recorded queries and keys (in scratch files), equal to
    those the job itself sent; the logit lens loads both models again and closes them after."""
    ws = CompareWorkspace()
    try:
        opts = CompareOptions(b_source="preset", b_preset="Q4_0", text=TEXT, max_tokens=N, layer=1, head=2)
        first = next(i for i in compare(ws, tiny, opts, None) if isinstance(i, HeadPair))
        assert ws.a is None and ws.b is None and ws.last is not None
        again = next(head_job(ws, 1, 2))
        np.testing.assert_array_equal(again.a.weights, first.a.weights)
        np.testing.assert_array_equal(again.b.weights, first.b.weights)
        assert not np.array_equal(again.a.weights, again.b.weights)
        pair = next(logit_pair_job(ws, 40, 8))
        assert pair.a.n_tokens == pair.b.n_tokens == N and pair.a.label == "A" and pair.b.label == "B"
        assert ws.a is None and ws.b is None  # closed again
    finally:
        ws.close()
