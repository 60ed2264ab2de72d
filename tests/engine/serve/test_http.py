"""The endpoint through real clients nobody here wrote: the `openai` package, httpx for raw cases, and curl."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from engine.serve.server import Server
from tests.engine.serve.conftest import HANG_S, chat_ids, expected, serving

MSG = [{"role": "user", "content": "the cat sat on"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def exchanges() -> list[tuple[str, Any, Any]]:
    return []


@pytest.fixture(scope="module")
def server(tiny_model: Any, exchanges: list) -> Iterator[Server]:
    with serving(tiny_model, on_exchange=lambda *a: exchanges.append(a)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=HANG_S)


def test_models(client: openai.OpenAI, tiny_model: Any) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve(tiny_model.path.name).id == "tiny"  # the file's name is an alias
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_chat_greedy_equals_the_engine_with_logprobs(client: openai.OpenAI, tiny_model: Any) -> None:
    ids = chat_ids(tiny_model, MSG)
    want, want_ids = expected(tiny_model, ids, 8)
    r = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=8, logprobs=True,
                                       top_logprobs=3)
    choice = r.choices[0]
    assert choice.message.content == want and choice.message.role == "assistant"
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == len(want_ids)
    assert r.usage.total_tokens == len(ids) + len(want_ids)
    assert choice.finish_reason == ("length" if len(want_ids) == 8 else "stop")
    content = choice.logprobs.content
    assert [bytes(c.bytes) for c in content] == [tiny_model.tokenizer.token_bytes(t) for t in want_ids]
    for c in content:
        assert len(c.top_logprobs) == 3 and c.logprob <= 0
        assert c.top_logprobs[0].token == c.token and c.top_logprobs[0].logprob == pytest.approx(c.logprob)
        assert c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob >= c.top_logprobs[2].logprob


def test_chat_stream_is_the_same_reply(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=10)
    chunks = list(client.chat.completions.create(model="tiny", messages=MSG, temperature=0, max_tokens=10,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1


def test_raw_stream_is_server_sent_events_ending_in_done(server: Server) -> None:
    body = {"messages": MSG, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/chat/completions", json=body, timeout=HANG_S) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert int(r.headers["x-queue-length"]) >= 1
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    objects = [json.loads(e[6:]) for e in events[:-1]]
    assert {o["object"] for o in objects} == {"chat.completion.chunk"}


def test_completions_with_legacy_logprobs(client: openai.OpenAI, tiny_model: Any) -> None:
    ids = tiny_model.tokenizer.encode("the cat", add_special=True, parse_special=False)
    want, want_ids = expected(tiny_model, ids, 6)
    r = client.completions.create(model="tiny", prompt="the cat", max_tokens=6, temperature=0, logprobs=2)
    choice = r.choices[0]
    assert choice.text == want and r.usage.completion_tokens == len(want_ids) and r.usage.prompt_tokens == len(ids)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(want_ids)
    assert all(len(top) <= 2 for top in lp.top_logprobs) and lp.text_offset == sorted(lp.text_offset)
    streamed = client.completions.create(model="tiny", prompt="the cat", max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == want


def test_stop_string_cuts_the_reply(client: openai.OpenAI) -> None:
    full = client.completions.create(model="tiny", prompt="the cat", max_tokens=12, temperature=0).choices[0].text
    assert full
    stop = full[len(full) // 2]
    r = client.completions.create(model="tiny", prompt="the cat", max_tokens=12, temperature=0, stop=[stop, "zzz"])
    assert r.choices[0].text == full[: full.index(stop)] and r.choices[0].finish_reason == "stop"


def test_seeded_sampling_repeats(client: openai.OpenAI) -> None:
    def ask(seed: int) -> str:
        return client.completions.create(model="tiny", prompt="the", max_tokens=12, temperature=1.5, seed=seed,
                                         extra_body={"top_k": 0, "min_p": 0.0}).choices[0].text
    assert ask(7) == ask(7)
    assert len({ask(s) for s in range(4)}) > 1  # a seed changes the draw


def test_tools_reach_the_template_and_the_hook(client: openai.OpenAI, tiny_model: Any, exchanges: list) -> None:
    before = len(exchanges)
    r = client.chat.completions.create(model="tiny", messages=MSG, tools=TOOLS, temperature=0, max_tokens=3)
    assert r.usage.prompt_tokens == len(chat_ids(tiny_model, MSG, TOOLS)) > len(chat_ids(tiny_model, MSG))
    deadline = time.monotonic() + HANG_S  # the hook runs on the worker just after the reply is sent
    while len(exchanges) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    source, messages, reply = exchanges[-1]
    assert source.startswith("127.0.0.1:") and list(messages) == MSG
    assert "Tools: get_weather" in reply.prompt.text and reply.text == r.choices[0].message.content
    assert r.choices[0].message.tool_calls is None  # tool-call markup, if any, stays in the text


def test_errors_are_openai_errors_and_the_server_goes_on(client: openai.OpenAI, server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as bad_type:
        client.chat.completions.create(model="tiny", messages=MSG, max_tokens="many")  # type: ignore[arg-type]
    assert bad_type.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(model="tiny", messages=MSG, extra_body={"mirostat": 2})
    assert unknown.value.body["code"] == "unknown_parameter"
    with pytest.raises(openai.NotFoundError) as no_model:
        client.chat.completions.create(model="gpt-4o", messages=MSG)
    assert no_model.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "the cat " * 300}])
    assert too_long.value.body["code"] == "context_length_exceeded"
    raw = httpx.post(f"{server.url}/chat/completions", content=b"{not json", timeout=HANG_S)
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"
    big = httpx.post(f"{server.url}/completions", content=b"x" * ((1 << 20) + 1), timeout=HANG_S)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts the bytes as they come
        for _ in range(20):
            yield b" " * 65536
    chunked = httpx.post(f"{server.url}/completions", content=chunks(), timeout=HANG_S)
    assert chunked.status_code == 413
    nowhere = httpx.get(f"{server.url}/engines", timeout=HANG_S)
    assert nowhere.status_code == 404 and "error" in nowhere.json()
    wrong_method = httpx.get(f"{server.url}/chat/completions", timeout=HANG_S)
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    assert client.completions.create(model="tiny", prompt="ok", max_tokens=1).usage.completion_tokens <= 1


def test_health(server: Server) -> None:
    r = httpx.get(server.url.removesuffix("/v1") + "/health", timeout=HANG_S)
    assert r.status_code == 200 and r.json() == {"status": "ok", "model": "tiny", "queue_length": 0, "max_queue": 64}


def test_curl(server: Server, tiny_model: Any) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    want, _ = expected(tiny_model, chat_ids(tiny_model, MSG), 5)
    body = json.dumps({"model": "tiny", "messages": MSG, "max_tokens": 5, "temperature": 0})
    out = subprocess.run([curl, "-sS", "--max-time", str(int(HANG_S)), f"{server.url}/chat/completions",
                          "-H", "Content-Type: application/json", "-d", body], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out)["choices"][0]["message"]["content"] == want
    streamed = subprocess.run([curl, "-sS", "-N", "--max-time", str(int(HANG_S)), f"{server.url}/chat/completions",
                               "-H", "Content-Type: application/json",
                               "-d", json.dumps({**json.loads(body), "stream": True})],
                              capture_output=True, text=True, check=True).stdout
    events = [line[6:] for line in streamed.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1])
    assert text == want
