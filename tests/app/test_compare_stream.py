"""Compare streams (issue 43 item 4): A and B run in step a chunk at a time, each chunk's rows go into the statistics
and are dropped, and every number equals a whole-run computation (both runs' full logits, as the job did before).
The chunk follows the vocabulary (fewer rows for a big one, as the CLI's compare), the recordings wait in scratch
files between chunks, and the top tokens hold one block of indices at a time. The models are closed when the job ends;
the heads and the logit lens of the comparison still answer. On a tiny llama built in code."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine.generate as engine_generate
import engine.quality.compare as quality
from app.data.overrides import OverrideSpec
from app.jobs import compare as jobs
from app.jobs import reference
from app.jobs.compare import CompareWorkspace, compare_job, head_job
from app.jobs.logit_lens import logit_pair_job
from app.records.compare import TOP_K, CompareOptions, CompareRecord, HeadPair, top_union
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


def chunk_rows_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows of each chunk the statistics are given, in order (TokenStats.add spied on)."""
    rows: list[int] = []
    real_add = quality.TokenStats.add

    def add(self: Any, base: np.ndarray, other: np.ndarray) -> None:
        rows.append(base.shape[0])
        return real_add(self, base, other)

    monkeypatch.setattr(quality.TokenStats, "add", add)
    return rows


def whole_run(model: Any, ids: list[int], cache_type: str, step: int | None = None) -> tuple[np.ndarray, Recorder]:
    """The log-probabilities of all of `ids` in one (N, n_vocab) array, prefilled `step` (else chunk_rows) at a time
    (the old run_model)."""
    rec = Recorder(capture_q=True, capture_hidden=True)
    cache = model.new_cache(max(len(ids), 16), cache_type)
    logits = np.empty((len(ids), int(model.args.n_vocab)), np.float32)
    step = step or jobs.chunk_rows(int(model.args.n_vocab))
    for r0 in range(0, len(ids), step):
        logits[r0 : r0 + step] = run_checked(model, ids[r0 : r0 + step], cache, rec, all_logits=True)
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
    """Every batch of rows the statistics get is one block of both runs (never all N positions at once), taken from
    the residual stream of a forward chunk, and a block's logits are gone before the next block's are made."""
    monkeypatch.setattr(reference, "CHUNK", 32)  # the logit block (chunk_rows); the forward chunk stays 128
    rows = chunk_rows_seen(monkeypatch)
    live: list[Any] = []
    real = engine_generate.logits_checked

    def checked(model: Any, hidden: np.ndarray) -> np.ndarray:
        import weakref

        assert sum(r() is not None for r in live) <= 1, "an earlier block's logits are still alive"
        out = real(model, hidden)
        live.append(weakref.ref(out))
        return out

    monkeypatch.setattr(engine_generate, "logits_checked", checked)
    ws = CompareWorkspace()
    try:
        compare(ws, tiny, CompareOptions(b_source="preset", b_preset="Q8_0", text=TEXT, max_tokens=N), None)
    finally:
        ws.close()
    assert rows == [32, 32, 32, 32, 22] and len(live) == 10


def test_the_chunk_follows_the_vocabulary() -> None:
    """As many rows as the CLI's logit budget holds (48 MiB a side), 128 at most, 16 at least: Gemma 3's 262,144-token
    vocabulary gets 48 rows, the CLI's lockstep chunk; a 49,152-token one (SmolLM2) keeps 128."""
    assert jobs.chunk_rows(262_144) == 48 == quality.lockstep_chunk(262_144)
    assert jobs.chunk_rows(151_936) == 82 == quality.lockstep_chunk(151_936)
    assert jobs.chunk_rows(49_152) == reference.CHUNK == 128
    assert jobs.chunk_rows(4_000_000) == reference.MIN_CHUNK
    sizes = [jobs.chunk_rows(v) for v in (32_000, 128_256, 151_936, 262_144, 1 << 20)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]


def test_a_big_vocabulary_runs_fewer_rows_at_a_time_with_the_same_numbers(tiny: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With a logit budget of 40 rows of the tiny vocabulary (as 48 MiB is for Gemma 3's), both runs' logits, the
    statistics and the sweep's reference go 40 rows at a time (within forward chunks of 128), and every number equals
    the whole runs prefilled 128 at a time."""
    ref_ws = CompareWorkspace()
    ref_ws.use(str(tiny))
    a = ref_ws.model_a(lambda *_: None)
    n_vocab = int(a.args.n_vocab)
    monkeypatch.setattr(quality, "LOGIT_ROWS_BYTES", 4 * n_vocab * 40)
    assert jobs.chunk_rows(n_vocab) == 40
    rows = chunk_rows_seen(monkeypatch)
    ws = CompareWorkspace()
    try:
        items = compare(ws, tiny, CompareOptions(b_source="preset", b_preset="Q4_0", text=TEXT, max_tokens=N), None)
        rec = next(i for i in items if isinstance(i, CompareRecord))
        assert rows == [40, 40, 48, 22]  # engine.generate.head_blocks: 8 rows join the block before them
        ids = [int(i) for i in rec.token_ids]
        b = ref_ws.model_b(OverrideSpec("Q4_0"), lambda *_: None, threading.Event())[0]
        la, ra = whole_run(a, ids, "F32", step=128)
        lb, rb = whole_run(b, ids, "F32", step=128)
        got = rec.stats.as_dict()
        for key, value in token_stats(la, lb, ids, logp=True).items():
            assert got[key] == (list(value) if isinstance(value, tuple) else value), key
        assert rec.stats.per_layer == layer_divergence(ra.hidden, rb.hidden, N)
        np.testing.assert_array_equal(rec.top_ids, top_union(la, lb)[0])
        shared = reference.find_reference(a, ids)
        assert shared is not None
        np.testing.assert_array_equal(shared.rows(0, N), la)
    finally:
        ws.close()
        ref_ws.close()


def test_a_quantized_cache_keeps_the_chunk_its_numbers_are_of(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantized cache's numbers depend on the prefill chunk (a chunk reads its own keys before they are stored
    quantized): with B on a Q8_0 cache the forward passes keep CHUNK positions however small the logit budget, and
    only the logits go a few rows at a time (16 here)."""
    monkeypatch.setattr(quality, "LOGIT_ROWS_BYTES", 4 * 40)  # 16 rows (MIN_CHUNK) for any vocabulary
    rows = chunk_rows_seen(monkeypatch)
    passes: list[int] = []
    real = engine_generate.run_hidden_checked

    def spy(model: Any, ids: Any, cache: Any, recorder: Any) -> Any:
        passes.append(len(ids))
        return real(model, ids, cache, recorder)

    monkeypatch.setattr(engine_generate, "run_hidden_checked", spy)
    ws = CompareWorkspace()
    try:
        compare(ws, tiny, CompareOptions(b_source="file", b_cache="Q8_0", text=TEXT, max_tokens=N), None)
    finally:
        ws.close()
    assert passes == [reference.CHUNK] * 2 + [N - reference.CHUNK] * 2
    assert rows == [reference.MIN_CHUNK] * 8 + [N - reference.CHUNK]


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


def test_top_tokens_hold_one_block_of_indices_at_a_time() -> None:
    """top_union takes each block of rows' top ids out of argpartition's (rows, n_vocab) int64 indices and lets them
    go: over 64 rows of a 65,536-token vocabulary (eight 4 MiB blocks) its peak stays near one block, where keeping
    views of the blocks held all eight (32 MiB) until the end. The ids equal a whole-matrix argpartition's."""
    import tracemalloc

    rng = np.random.default_rng(3)
    logp = rng.standard_normal((64, 65_536)).astype(np.float32)
    tracemalloc.start()
    try:
        ids, la, _ = top_union(logp, logp)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 * 2**20, f"top_union peaked at {peak / 2**20:.1f} MiB"
    want = np.sort(np.argpartition(-logp, TOP_K, axis=-1)[:, :TOP_K], axis=-1)
    np.testing.assert_array_equal(ids[:, :TOP_K], want)  # both sides the same: the union is A's top ids
    assert (ids[:, TOP_K:] == -1).all()
    np.testing.assert_array_equal(la[:, :TOP_K], np.take_along_axis(logp, want, axis=-1))


def _resident_kib(arr: np.ndarray) -> int:
    """Rss of the mapping that holds arr's data (/proc/self/smaps)."""
    addr = arr.__array_interface__["data"][0]
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError("no mapping holds the array")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps")
def test_recordings_wait_in_scratch_files_between_chunks() -> None:
    """to_scratch moves a recorder's hidden states into a scratch file sized for the whole run; the next chunk's rows
    are written in place, every row keeps its value, and the file's pages are not resident after each chunk."""
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal((100, 4096)).astype(np.float32) for _ in range(3)]
    rec = Recorder(capture_q=True, capture_hidden=True)
    rec.record_hidden(0, 0, rows[0])
    jobs.to_scratch(rec, 300)
    first = rec.hidden[0]
    assert isinstance(first, np.memmap) and first.shape == (300, 4096)
    assert _resident_kib(first) == 0
    for i in (1, 2):
        rec.record_hidden(0, 100 * i, rows[i])
        jobs.to_scratch(rec, 300)
        assert rec.hidden[0] is first and _resident_kib(first) == 0
    np.testing.assert_array_equal(rec.hidden[0], np.concatenate(rows))
