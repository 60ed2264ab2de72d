"""The hybrid cache of a DeltaNet model (engine.hybrid_cache): a state that cannot be cut back, snapshots that let
regenerate, edit, branch and continue resume, and memory that does not grow with the context."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.generate import GenerationConfig, generate, prefill
from engine.hybrid_cache import MAX_SNAPSHOTS, HybridCache
from engine.model import load_model
from engine.sampler import SamplerSettings
from tools.make_arch_models import token_ids, write_arch


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory):
    path = write_arch(tmp_path_factory.mktemp("hybrid") / "qwen35.F32.gguf", "qwen35")
    m = load_model(path, numerics="ggml")
    yield m
    m.close()


def fresh(model, ids: list[int]) -> np.ndarray:
    """The logits of the last position of `ids` run from an empty cache in one batch."""
    return prefill(model, ids, model.new_cache(512))


def same(a: np.ndarray, b: np.ndarray) -> None:
    """The same logits up to the rounding that the batch's shape changes (ggml's products take other kernels
    for another number of rows, as llama.cpp's do); a state resumed from the wrong place moves them by far more."""
    assert float(np.abs(a - b).max()) < 2e-3


def test_the_cache_holds_kv_rows_for_attention_layers_only_and_a_constant_state(model) -> None:
    cache = model.new_cache(512)
    assert isinstance(cache, HybridCache)
    assert cache.recurrent == frozenset({0, 1, 2}) and cache.kv_layers == frozenset({3})
    ids = token_ids()
    prefill(model, ids[:20], cache)
    state_20, kv_20 = cache.state_bytes, cache.bytes_for(20)
    prefill(model, ids[:120], cache)
    assert cache.state_bytes == state_20  # the recurrent layers' memory does not grow with the context
    assert cache.bytes_for(120) == 6 * kv_20  # only the attention layer's rows do
    assert cache.k[0].shape[1] == 0 and cache.k[3].shape[1] >= 120


def test_regenerate_resumes_from_the_snapshot_before_the_prompts_last_token(model) -> None:
    ids = token_ids()[:60]
    cache = model.new_cache(512)
    cfg = GenerationConfig(max_tokens=8, sampler=SamplerSettings(temperature=0.0))
    first = [s.token_id for s in generate(model, ids, cfg, cache=cache)]
    assert cache.length > len(ids)
    again = [s.token_id for s in generate(model, ids, cfg, cache=cache)]  # regenerate: the same prompt
    assert cache.restored_from == len(ids) - 1  # resumed one token back, not from the start
    assert again == first


def test_continue_edit_and_branch_give_the_logits_of_a_fresh_run(model) -> None:
    ids = token_ids()
    cache = model.new_cache(512)
    prefill(model, ids[:50], cache)
    for tok in ids[50:55]:  # decode steps
        model.forward([tok], cache)
        cache.commit([tok])
    # continue: the cache's tokens plus more
    got = prefill(model, ids[:70], cache)
    assert cache.restored_from is None
    same(got, fresh(model, ids[:70]))
    # one step back (the state before the last token is kept without a copy)
    got = prefill(model, ids[:70], cache)
    assert cache.restored_from == 69
    same(got, fresh(model, ids[:70]))
    # an edit at position 30: no snapshot there, so the cache starts again from the latest one before it (0 here)
    edited = ids[:30] + [5, 6, 7] + ids[33:60]
    got = prefill(model, edited, cache)
    assert cache.restored_from == 0
    same(got, fresh(model, edited))


def test_an_edit_after_a_kept_prompt_resumes_there(model) -> None:
    ids = token_ids()
    cache = model.new_cache(512)
    prefill(model, ids[:40], cache)  # a first turn
    prefill(model, ids[:90], cache)  # a second turn: snapshots at 39, 40, 89, 90
    edited = ids[:60] + [9, 9] + ids[62:80]  # the second turn edited after 60
    got = prefill(model, edited, cache)
    assert cache.restored_from == 40
    same(got, fresh(model, edited))


def test_snapshots_are_bounded(model) -> None:
    ids = token_ids()
    cache = model.new_cache(512)
    for n in range(10, 10 + 12 * 5, 5):
        prefill(model, ids[:n], cache)
    assert len(cache.snapshots) <= MAX_SNAPSHOTS + 2
    one = sum(s.nbytes for s in cache.states.values())
    assert cache.snapshot_bytes <= (MAX_SNAPSHOTS + 1) * one


def test_a_failed_step_leaves_the_state_as_it_was(model) -> None:
    ids = token_ids()
    cache = model.new_cache(512)
    prefill(model, ids[:30], cache)
    before = {i: s.ssm.copy() for i, s in cache.states.items()}
    model.forward(ids[30:34], cache)  # run but never committed (as a step with NaN logits or a cancel)
    cache.truncate(cache.length)
    for i, s in cache.states.items():
        np.testing.assert_array_equal(s.ssm, before[i])
    got = prefill(model, ids[:40], cache)
    same(got, fresh(model, ids[:40]))


def test_the_float32_reference_runs_the_same_cache(tmp_path: Path) -> None:
    path = write_arch(tmp_path / "qwen35.F32.gguf", "qwen35")
    m = load_model(path, numerics="float32")
    try:
        ids = token_ids()[:64]
        cache = m.new_cache(256)
        a = prefill(m, ids, cache, chunk_size=16)  # a prompt split across batches
        b = prefill(m, ids, m.new_cache(256), chunk_size=64)
        np.testing.assert_allclose(a, b, atol=2e-4)
    finally:
        m.close()


def test_the_memory_preflight_counts_what_the_hybrid_cache_holds(model) -> None:
    from engine.memory import kv_cache_bytes

    cache = model.new_cache(512)
    prefill(model, token_ids()[:100], cache)
    assert kv_cache_bytes(model.net.args, 100, "F16") == cache.bytes_for(100) + cache.state_bytes


def test_the_compiled_decode_step_gives_the_ops_bits(model, monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode step's DeltaNet layers in one compiled call (engine.ops.delta_rule.step) or op by op: the same bits,
    the same state and the same recorded inputs."""
    from engine.observe.recorder import Recorder
    from engine.ops import delta_rule

    def steps() -> tuple[np.ndarray, HybridCache, Recorder]:
        ids, rec = token_ids()[:40], Recorder()
        cache = model.new_cache(128)
        prefill(model, ids[:30], cache, recorder=rec)
        rows = []
        for tok in ids[30:]:
            rows.append(model.forward([tok], cache, rec))
            cache.commit([tok])
            rec.commit()
        return np.concatenate(rows), cache, rec

    fast, cache_a, rec_a = steps()
    monkeypatch.setattr(delta_rule, "step_available", lambda: False)
    slow, cache_b, rec_b = steps()
    np.testing.assert_array_equal(fast, slow)
    for i in cache_a.recurrent:
        np.testing.assert_array_equal(cache_a.states[i].ssm, cache_b.states[i].ssm)
        np.testing.assert_array_equal(cache_a.states[i].conv, cache_b.states[i].conv)
        for name in ("q", "k", "v", "g", "beta"):
            np.testing.assert_array_equal(rec_a.recurrent_inputs(i)[name], rec_b.recurrent_inputs(i)[name])
