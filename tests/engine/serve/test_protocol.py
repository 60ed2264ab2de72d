"""Request parsing: OpenAI's fields checked by table, neutral values accepted, everything else refused with a 400."""
from __future__ import annotations

import pytest

from engine.serve.protocol import ApiError, parse_body, parse_chat, parse_completion

MSG = [{"role": "user", "content": "hi"}]


def refused(fn, data, param: str | None = None, status: int = 400) -> ApiError:  # noqa: ANN001
    with pytest.raises(ApiError) as info:
        fn(data)
    assert info.value.status == status
    if param is not None:
        assert info.value.param == param, info.value.message
    return info.value


def test_chat_fields_and_defaults() -> None:
    req = parse_chat({"model": "m", "messages": MSG, "temperature": 0, "max_tokens": 5, "stop": "x", "seed": 3,
                      "logprobs": True, "top_logprobs": 2, "top_k": 7, "min_p": 0.1, "n": 1, "presence_penalty": 0,
                      "stream": True, "stream_options": {"include_usage": True}})
    assert (req.kind, req.model, req.max_tokens, req.stop, req.seed) == ("chat", "m", 5, ("x",), 3)
    assert req.logprobs and req.top_logprobs == 2 and req.stream and req.include_usage
    s = req.sampler()
    assert (s.temperature, s.top_k, s.min_p, s.top_p) == (0.0, 7, 0.1, 1.0)
    plain = parse_chat({"messages": MSG})
    assert plain.model is None and plain.max_tokens is None and plain.temperature == 1.0 and not plain.stream
    assert parse_chat({"messages": MSG, "max_completion_tokens": 9, "max_tokens": 3}).max_tokens == 9


def test_content_parts_and_tool_calls_become_template_data() -> None:
    req = parse_chat({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "c1"}],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]})
    assert req.messages[0]["content"] == "ab"
    assert req.messages[1]["content"] == "" and req.messages[1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert req.tools is not None and req.tools[0]["function"]["name"] == "f"
    refused(parse_chat, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content")


@pytest.mark.parametrize(("data", "param"), [
    ({"messages": MSG, "max_tokens": "5"}, "max_tokens"),
    ({"messages": MSG, "max_tokens": True}, "max_tokens"),
    ({"messages": MSG, "max_tokens": 10**400}, "max_tokens"),
    ({"messages": MSG, "seed": -(10**400)}, "seed"),
    ({"messages": MSG, "temperature": 3}, "temperature"),
    ({"messages": MSG, "temperature": "hot"}, "temperature"),
    ({"messages": MSG, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"messages": MSG, "top_logprobs": 2}, "top_logprobs"),
    ({"messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": MSG, "stop": 5}, "stop"),
    ({"messages": MSG, "n": 2}, "n"),
    ({"messages": MSG, "n": True}, "n"),
    ({"messages": MSG, "frequency_penalty": 0.5}, "frequency_penalty"),
    ({"messages": MSG, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": MSG, "wibble": 1}, "wibble"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": MSG, "tools": [{"type": "function"}]}, "tools[0]"),
    ({}, "messages"),
])
def test_chat_refusals_name_the_parameter(data: dict, param: str) -> None:
    refused(parse_chat, data, param)


def test_completion_prompts_and_legacy_logprobs() -> None:
    req = parse_completion({"prompt": "hello", "logprobs": 0})
    assert req.prompt == "hello" and req.max_tokens == 16 and req.logprobs and req.top_logprobs == 0
    assert not parse_completion({"prompt": ["hi"]}).logprobs
    assert parse_completion({"prompt": [1, 2, 3]}).prompt == (1, 2, 3)
    assert parse_completion({"prompt": [[4, 5]]}).prompt == (4, 5)
    refused(parse_completion, {"prompt": ["a", "b"]}, "prompt")
    refused(parse_completion, {"prompt": "x", "logprobs": 6}, "logprobs")
    refused(parse_completion, {"prompt": "x", "echo": True}, "echo")
    refused(parse_completion, {"prompt": "x", "messages": MSG}, "messages")  # a chat field on the wrong route


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff\xfe", b'{"a": NaN}', b"[" * 100_000])
def test_bodies_that_are_not_a_json_object(raw: bytes) -> None:
    err = refused(parse_body, raw)
    assert err.code == "invalid_json" and err.body()["error"]["type"] == "invalid_request_error"


def test_error_object_is_openais_shape() -> None:
    err = ApiError(429, "full", code="queue_full")
    assert err.body() == {"error": {"message": "full", "type": "rate_limit_error", "param": None, "code": "queue_full"}}


def test_seed_minus_one_is_random_and_top_p_zero_is_greedy_enough() -> None:
    assert parse_chat({"messages": MSG, "seed": -1}).seed is None
    assert parse_chat({"messages": MSG, "seed": 2**64 - 1}).sampler().check().seed == (2**64 - 1) % 2**63
    assert 0 < parse_chat({"messages": MSG, "top_p": 0}).sampler().check().top_p < 1e-6
