"""The generation queue without HTTP: order, fresh caches, cancel, a full queue, loading and stopping, the pieces of
a streamed and of a plain request."""
from __future__ import annotations

import queue
import threading
from typing import Any

import pytest

from engine.serve.protocol import ApiError, parse_chat, parse_completion
from engine.serve.runner import Finished, Job, Piece, Runner
from tests.engine.serve.conftest import HANG_S, Gate, chat_ids, expected


class Events:
    """Collects one job's events; wait() returns (text, Finished or ApiError)."""

    def __init__(self) -> None:
        self.q: queue.Queue[object] = queue.Queue()

    def __call__(self, event: object) -> None:
        self.q.put(event)

    def wait(self) -> tuple[str, Any]:
        text = []
        while True:
            event = self.q.get(timeout=HANG_S)
            if isinstance(event, Piece):  # a streamed request's token
                text.append(event.text)
            else:  # a plain request's pieces come with Finished
                text += [p.text for p in getattr(event, "pieces", ())]
                return "".join(text), event


def job(runner: Runner, body: dict[str, Any]) -> tuple[Job, Events]:
    req = parse_completion(body) if "prompt" in body else parse_chat(body)
    events = Events()
    return Job(req, runner.prepare(req), events), events


def test_jobs_run_in_order_each_from_an_empty_cache(tiny_model: Any) -> None:
    """The same prompt after another gives the same greedy reply (no state carried between requests)."""
    gate = Gate()
    runner = Runner(tiny_model, model_id="tiny", generate=gate).start()
    try:
        prompts = ["the cat", "a dog sat", "the cat"]
        jobs = [job(runner, {"prompt": p, "max_tokens": 6, "temperature": 0}) for p in prompts]
        for i, (j, _) in enumerate(jobs):
            assert runner.submit(j) == i + 1  # the queue length with it: the running one counts
        assert runner.queue_length == 3
        gate.release()
        replies = [events.wait() for _, events in jobs]
        assert all(isinstance(done, Finished) and done.finish_reason in ("stop", "length") for _, done in replies)
        for (text, done), p in zip(replies, prompts):
            want, ids = expected(tiny_model, tiny_model.tokenizer.encode(p, add_special=True, parse_special=False), 6)
            assert text == want and done.completion_tokens == len(ids)
        assert replies[0][0] == replies[2][0]
        assert runner.queue_length == 0
    finally:
        runner.close()
        runner.join(HANG_S)


def test_full_queue_is_429_and_cancel_frees_a_place(tiny_model: Any) -> None:
    gate = Gate()
    runner = Runner(tiny_model, model_id="tiny", generate=gate, max_queue=2).start()
    try:
        (a, ea), (b, eb), (c, _) = (job(runner, {"prompt": "x", "max_tokens": 2}) for _ in range(3))
        runner.submit(a)
        assert gate.entered.wait(HANG_S)
        runner.submit(b)
        with pytest.raises(ApiError) as info:
            runner.submit(c)
        assert info.value.status == 429 and info.value.code == "queue_full"
        runner.cancel(b)  # a waiting job leaves the queue at once and hears that it was cancelled
        assert eb.wait()[1].finish_reason == "cancelled" and runner.queue_length == 1
        runner.submit(c)
        gate.release()
        assert isinstance(ea.wait()[1], Finished)
    finally:
        runner.close()
        runner.join(HANG_S)


def test_prompt_longer_than_the_context_is_400(tiny_model: Any) -> None:
    runner = Runner(tiny_model, model_id="tiny")
    with pytest.raises(ApiError) as info:
        runner.prepare(parse_completion({"prompt": "the cat " * 200}))
    assert info.value.status == 400 and info.value.code == "context_length_exceeded"
    with pytest.raises(ApiError) as info:
        runner.prepare(parse_completion({"prompt": [1, 2, 100_000]}))
    assert info.value.status == 400 and "outside the vocabulary" in info.value.message


def test_loading_is_503_then_ready(tiny_model: Any) -> None:
    loaded = threading.Event()

    def load() -> Any:
        assert loaded.wait(HANG_S)
        return tiny_model

    runner = Runner(load, model_id="tiny").start()
    try:
        assert runner.state == "loading"
        with pytest.raises(ApiError) as info:
            runner.prepare(parse_chat({"messages": [{"role": "user", "content": "hi"}]}))
        assert info.value.status == 503
        loaded.set()
        for _ in range(int(HANG_S * 100)):
            if runner.state == "ready":
                break
            threading.Event().wait(0.01)
        assert runner.state == "ready" and tiny_model.path.name in runner.aliases
    finally:
        runner.close()
        runner.join(HANG_S)


def test_failed_load_is_reported(tiny_model: Any) -> None:
    seen: list[BaseException] = []

    def load() -> Any:
        raise OSError("no such file")

    runner = Runner(load, model_id="tiny", on_failed=seen.append).start()
    runner.join(HANG_S)
    assert runner.state == "failed" and isinstance(seen[0], OSError)
    with pytest.raises(ApiError) as info:
        runner.check_ready()
    assert info.value.status == 503 and "no such file" in info.value.message


def test_close_answers_waiting_jobs_503_and_refuses_new_ones(tiny_model: Any) -> None:
    gate = Gate()
    runner = Runner(tiny_model, model_id="tiny", generate=gate).start()
    (a, ea), (b, eb) = (job(runner, {"prompt": "x", "max_tokens": 50}) for _ in range(2))
    runner.submit(a)
    assert gate.entered.wait(HANG_S)
    runner.submit(b)
    runner.close()
    gate.release()
    runner.join(HANG_S)
    assert eb.wait()[1].status == 503
    first = ea.wait()[1]  # cancelled at its first token by the stop
    assert isinstance(first, ApiError) and first.status == 503
    with pytest.raises(ApiError) as info:
        job(runner, {"prompt": "x"})
    assert info.value.status == 503 and runner.state == "stopping"


def test_exchange_hook_sees_request_and_reply(tiny_model: Any) -> None:
    seen: list[tuple[str, Any, Any]] = []
    runner = Runner(tiny_model, model_id="tiny", on_exchange=lambda *a: seen.append(a)).start()
    try:
        messages = [{"role": "user", "content": "the cat"}]
        j, events = job(runner, {"messages": messages, "max_tokens": 5, "temperature": 0})
        j.source = "test"
        runner.submit(j)
        text, done = events.wait()
        runner.close()
        runner.join(HANG_S)
        source, got, reply = seen[0]
        assert source == "test" and list(got) == messages and reply.text == text
        assert list(reply.prompt.ids) == chat_ids(tiny_model, messages)
        assert reply.finish_reason == done.finish_reason and len(reply.token_ids) == done.completion_tokens
    finally:
        runner.close()


def test_streamed_jobs_get_a_piece_per_token_plain_ones_all_at_the_end(tiny_model: Any) -> None:
    runner = Runner(tiny_model, model_id="tiny").start()
    try:
        streamed, se = job(runner, {"prompt": "the cat", "max_tokens": 5, "temperature": 0, "stream": True})
        plain, pe = job(runner, {"prompt": "the cat", "max_tokens": 5, "temperature": 0})
        runner.submit(streamed)
        runner.submit(plain)
        events = [se.q.get(timeout=HANG_S) for _ in range(6)]
        assert [type(e) for e in events] == [Piece] * 5 + [Finished] and events[-1].pieces == ()
        done = pe.q.get(timeout=HANG_S)
        assert isinstance(done, Finished) and done.pieces == tuple(events[:5])
    finally:
        runner.close()
        runner.join(HANG_S)
