"""Generation on a tiny model: chunked prefill, cache reuse, stops, cancel, numerical faults."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ContextFullError, InferenceError, SettingError
from engine.generate import GenerationConfig, Step, _StopMatcher, generate, prefill
from engine.model import load_model
from engine.observe.recorder import Recorder
from engine.sampler import SamplerSettings
from tests.tiny_models import make_tiny_llama

GREEDY = SamplerSettings(temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    path = make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf", n_ctx=64)
    model = load_model(path)
    yield model
    model.close()


def run(model, prompt, **kw) -> list[Step]:
    cfg = GenerationConfig(sampler=GREEDY, **{k: v for k, v in kw.items() if k in ("max_tokens", "stop", "chunk_size")})
    rest = {k: v for k, v in kw.items() if k not in ("max_tokens", "stop", "chunk_size")}
    return list(generate(model, prompt, cfg, **rest))


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory: pytest.TempPathFactory):
    """The tiny model with float32 numerics, where every path computes the same sums (no 8-bit rounding to flip)."""
    path = make_tiny_llama(tmp_path_factory.mktemp("tiny32") / "tiny.gguf", n_ctx=64)
    model = load_model(path, numerics="float32")
    yield model
    model.close()


def test_incremental_decode_equals_full_forward(tiny_f32) -> None:
    tiny = tiny_f32
    ids = list(range(3, 40))
    full = prefill(tiny, ids, tiny.new_cache(), all_logits=True)
    cache = tiny.new_cache()
    rows = [prefill(tiny, ids[:5], cache, all_logits=True, chunk_size=2)]
    for t in ids[5:]:
        rows.append(tiny.forward([t], cache))
        cache.commit([t])
    np.testing.assert_allclose(np.concatenate(rows), full, rtol=1e-4, atol=1e-4)


def test_max_tokens_and_records(tiny) -> None:
    steps = run(tiny, [5, 6, 7], max_tokens=6)
    assert len(steps) == 6 and steps[-1].finish_reason == "length"
    assert all(s.finish_reason is None for s in steps[:-1])
    assert [s.index for s in steps] == list(range(6))
    for s in steps:
        assert len(s.top) == 10 and s.top[0][1] >= s.top[-1][1]
        assert s.logprob <= 0.0 and s.token_id >= 0
    assert steps[-1].prompt_tokens == 3


def test_greedy_is_deterministic_and_cache_reuse_only_runs_new_tokens(tiny) -> None:
    cache = tiny.new_cache()
    a = run(tiny, [5, 6, 7], max_tokens=4, cache=cache)
    first = [s.token_id for s in a]
    prompt2 = [5, 6, 7] + first + [9]
    b = run(tiny, prompt2, max_tokens=3, cache=cache)
    # the cache holds the prompt and every generated token but the last: only [last, 9] run again
    assert b[0].prefilled_tokens == 2
    fresh = run(tiny, prompt2, max_tokens=3)
    assert [s.token_id for s in b] == [s.token_id for s in fresh]


def test_eos_stops(tiny, monkeypatch) -> None:
    eos = tiny.tokenizer.eos_id
    real = tiny.net.forward

    def forward(tokens, cache, recorder=None, all_logits=False):
        out = real(tokens, cache, recorder, all_logits)
        out[-1, eos] = 1e4
        return out

    monkeypatch.setattr(tiny.net, "forward", forward)
    steps = run(tiny, [5, 6], max_tokens=10)
    assert len(steps) == 1 and steps[0].finish_reason == "eos" and steps[0].token_id == eos


def test_stop_matcher_holds_back_and_cuts() -> None:
    m = _StopMatcher(["</s>", "STOP"])
    out = []
    for piece in ["hel", "lo <", "/", "s> more"]:
        text, hit = m.feed(piece)
        out.append(text)
        if hit:
            break
    assert "".join(out) == "hello " and hit


def test_cancel_before_prefill_and_between_tokens(tiny) -> None:
    ev = threading.Event()
    ev.set()
    steps = run(tiny, list(range(3, 30)), max_tokens=5, cancel=ev, chunk_size=4)
    assert [s.finish_reason for s in steps] == ["cancelled"] and steps[0].token_id == -1
    ev2 = threading.Event()
    got = []
    for s in generate(tiny, [4, 5], GenerationConfig(max_tokens=50, sampler=GREEDY), cancel=ev2):
        got.append(s)
        if len(got) == 2:
            ev2.set()
    assert got[-1].finish_reason == "cancelled" and len(got) == 3
    # the next request works at once
    assert run(tiny, [4, 5], max_tokens=2)[-1].finish_reason == "length"


def test_nan_logits_stop_without_touching_the_cache(tiny, monkeypatch) -> None:
    cache = tiny.new_cache()
    run(tiny, [4, 5, 6], max_tokens=2, cache=cache)
    before = list(cache.tokens)
    real = tiny.net.forward

    def forward(tokens, c, recorder=None, all_logits=False):
        out = real(tokens, c, recorder, all_logits)
        out[-1, 3] = np.nan
        return out

    monkeypatch.setattr(tiny.net, "forward", forward)
    with pytest.raises(InferenceError, match="NaN"):
        run(tiny, before + [7], max_tokens=2, cache=cache)
    assert cache.tokens == before[: len(cache.tokens)] and len(cache.tokens) <= len(before)


def test_memory_error_becomes_inference_error(tiny, monkeypatch) -> None:
    def forward(*a, **k):
        raise MemoryError

    monkeypatch.setattr(tiny.net, "forward", forward)
    with pytest.raises(InferenceError, match="ran out of memory"):
        run(tiny, [4, 5], max_tokens=2)


def test_context_full(tiny) -> None:
    with pytest.raises(ContextFullError, match="context is 64"):
        run(tiny, list(range(3, 80)), max_tokens=2)
    steps = run(tiny, list(range(3, 60)), max_tokens=50)
    assert steps[-1].finish_reason == "context"


def test_recorder_attention_rows_sum_to_one(tiny) -> None:
    rec, cache = Recorder(), tiny.new_cache()
    run(tiny, [4, 5, 6, 7], max_tokens=3, cache=cache, recorder=rec)
    w = rec.attention(cache, layer=1, head=3)
    assert w.shape == (cache.length, cache.length)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    assert np.allclose(np.triu(w, 1), 0.0)


@pytest.mark.parametrize("bad", [dict(max_tokens=-1), dict(chunk_size=0)])
def test_bad_config(tiny, bad) -> None:
    with pytest.raises(SettingError):
        list(generate(tiny, [4], GenerationConfig(**bad)))


def test_empty_prompt_refused(tiny) -> None:
    with pytest.raises(SettingError):
        run(tiny, [], max_tokens=2)


def test_unused_path_is_not_needed(tmp_path: Path) -> None:
    # a tiny model without output.weight uses the tied embedding; with one, it uses it
    p = make_tiny_llama(tmp_path / "untied.gguf", tied=False)
    m = load_model(p)
    assert m.net.output.weight.name == "output.weight"
    m.close()
