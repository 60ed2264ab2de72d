"""The OpenAI request bodies the server accepts, parsed into one frozen dataclass, and OpenAI's error objects.

Each field is checked against a table (its JSON type and range); a field the table does not know is refused as
OpenAI refuses it ("Unrecognized request argument supplied"), so a client learns at once that a setting it
relies on does nothing here. Fields OpenAI clients send by habit with their neutral value (`presence_penalty: 0`,
`n: 1`, `logit_bias: {}`) are accepted; any other value of them is refused, never silently ignored.

Defaults are OpenAI's where it has one (temperature 1, top_p 1, /v1/completions' max_tokens 16) and llama.cpp's
for what OpenAI lacks (top_k 40, min_p 0.05), the meanings those of engine.sampler.
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

from engine.sampler import SamplerSettings

MAX_STOP = 4  # stop strings per request, as OpenAI
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs, as OpenAI
MAX_LEGACY_LOGPROBS = 5  # /v1/completions' logprobs, as OpenAI
ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """An error the client caused or must hear about, sent as OpenAI's {"error": {...}} with an HTTP status."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
             500: "server_error", 503: "unavailable_error"}

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """OpenAI's error object."""
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 naming the offending parameter."""
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class GenRequest:
    """A /v1/chat/completions or /v1/completions request, checked."""

    kind: str  # 'chat' | 'completion'
    model: str | None  # the model the client named (None: the one served)
    messages: tuple[dict[str, Any], ...] = ()  # chat: the conversation, content as plain text
    tools: tuple[dict[str, Any], ...] | None = None  # chat: function definitions for the template
    prompt: str | tuple[int, ...] = ""  # completion: text, or token ids run as they are
    max_tokens: int | None = None  # None: until the end of the context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False  # log-probabilities of the chosen tokens
    top_logprobs: int = 0  # and of this many most likely tokens at each step
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage counts
    reasoning_effort: str | None = None  # chat: a template variable (gpt-oss reads it)

    def sampler(self) -> SamplerSettings:
        """The sampler settings this request asks for (temperature 0 is greedy)."""
        return SamplerSettings(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                               repeat_penalty=self.repeat_penalty, seed=self.seed)


# --- the field table ---------------------------------------------------------------------------------------------

Check = Callable[[str, Any], Any]  # (name, value) -> the value to keep; raises ApiError


def _number(lo: float, hi: float, *, integer: bool = False) -> Check:
    def check(name: str, value: Any) -> Any:
        if value is None:
            return None
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise bad(f"'{name}' must be {'an integer' if integer else 'a number'}, got {_kind(value)}", name)
        if isinstance(value, float) and not math.isfinite(value) or not lo <= value <= hi:  # ints of any size
            raise bad(f"'{name}' = {value!r} is out of range: must be between {lo:g} and {hi:g}", name)
        return int(value) if integer else float(value)
    return check


def _boolean(name: str, value: Any) -> Any:
    if value is not None and not isinstance(value, bool):
        raise bad(f"'{name}' must be a boolean, got {_kind(value)}", name)
    return value


def _string(name: str, value: Any) -> Any:
    if value is not None and not isinstance(value, str):
        raise bad(f"'{name}' must be a string, got {_kind(value)}", name)
    return value


def _neutral(*allowed: Any) -> Check:
    """A field accepted only with a value that changes nothing (what OpenAI clients send by default)."""
    def check(name: str, value: Any) -> Any:
        if value is None or any(_same(value, a) for a in allowed):
            return value
        raise bad(f"'{name}' = {_short(value)} is not supported by this server (only {allowed[0]!r})", name)
    return check


def _same(value: Any, allowed: Any) -> bool:
    """value == allowed as JSON means it: 1 and 1.0 alike, true never 1."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return value is allowed
    if isinstance(allowed, (int, float)):
        return isinstance(value, (int, float)) and value == allowed
    return type(value) is type(allowed) and value == allowed


def _anything(name: str, value: Any) -> Any:
    return value


def _stop(name: str, value: Any) -> Any:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad(f"'{name}' must be a string or a list of strings, got {_kind(value)}", name)
    if len(stops) > MAX_STOP:
        raise bad(f"'{name}' has {len(stops)} strings: at most {MAX_STOP}", name)
    return tuple(s for s in stops if s)


def _stream_options(name: str, value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, dict) or not set(value) <= {"include_usage", "include_obfuscation"}:
        raise bad(f"'{name}' must be an object with 'include_usage'", name)
    return _boolean(f"{name}.include_usage", value.get("include_usage"))


def _response_format(name: str, value: Any) -> Any:
    if value is not None and value != {"type": "text"}:
        raise bad(f"'{name}' = {_short(value)} is not supported by this server (only {{'type': 'text'}})", name)
    return value


_SAMPLING: dict[str, Check] = {
    "model": _string,
    "max_tokens": _number(0, 1 << 20, integer=True),
    "temperature": _number(0.0, 2.0),
    "top_p": _number(0.0, 1.0),
    "top_k": _number(0, 1_000_000, integer=True),
    "min_p": _number(0.0, 1.0),
    "repeat_penalty": _number(0.0, 10.0),  # llama.cpp's server takes it too
    "seed": _number(-(2**63), 2**64 - 1, integer=True),
    "stop": _stop,
    "stream": _boolean,
    "stream_options": _stream_options,
    "n": _neutral(1),
    "presence_penalty": _neutral(0.0),
    "frequency_penalty": _neutral(0.0),
    "logit_bias": _neutral({}),
    "user": _string,
}
_CHAT: dict[str, Check] = {
    **_SAMPLING,
    "messages": _anything,  # checked by _messages
    "max_completion_tokens": _number(0, 1 << 20, integer=True),
    "logprobs": _boolean,
    "top_logprobs": _number(0, MAX_TOP_LOGPROBS, integer=True),
    "tools": _anything,  # checked by _tools
    "tool_choice": _anything,  # the template decides; tool-call markup comes back as text
    "parallel_tool_calls": _boolean,
    "response_format": _response_format,
    "reasoning_effort": _string,  # handed to templates that read it (gpt-oss)
    "store": _neutral(False),
    "metadata": _anything,
}
_COMPLETION: dict[str, Check] = {
    **_SAMPLING,
    "prompt": _anything,  # checked by _prompt
    "logprobs": _number(0, MAX_LEGACY_LOGPROBS, integer=True),
    "echo": _neutral(False),
    "suffix": _neutral(""),
    "best_of": _neutral(1),
}


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object; 400 for anything else (NaN and Infinity included)."""
    def no_constants(text: str) -> Any:
        raise ValueError(f"{text} is not JSON")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise bad(f"the body is not valid JSON: {str(exc)[:200]}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad(f"the body must be a JSON object, got {_kind(data)}", code="invalid_json")
    return data


def _fields(data: Mapping[str, Any], table: Mapping[str, Check]) -> dict[str, Any]:
    unknown = [k for k in data if k not in table]
    if unknown:
        raise bad(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0], "unknown_parameter")
    return {k: table[k](k, v) for k, v in data.items()}


def _sampling(f: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of GenRequest common to both routes."""
    seed = f.get("seed")
    if seed is not None:
        seed = None if seed < 0 else seed % (2**63)  # -1 (any negative): a random draw, as llama.cpp's server
    out = {"model": f.get("model"), "stop": f.get("stop") or (), "stream": bool(f.get("stream")),
           "include_usage": bool(f.get("stream_options")), "seed": seed}
    for name in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty"):
        if f.get(name) is not None:
            out[name] = f[name]
    if out.get("top_p") == 0.0:
        out["top_p"] = 1e-9  # OpenAI takes 0 for "only the most likely"; the sampler's range is (0, 1]
    if out.get("repeat_penalty") == 0.0:
        raise bad("'repeat_penalty' must be above 0", "repeat_penalty")
    return out


def parse_chat(data: Mapping[str, Any]) -> GenRequest:
    """A /v1/chat/completions body as a GenRequest; ApiError(400) naming the first bad field."""
    f = _fields(data, _CHAT)
    if "messages" not in f:
        raise bad("'messages' is required", "messages")
    top = f.get("top_logprobs")
    if top and not f.get("logprobs"):
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    max_tokens = f.get("max_completion_tokens") if f.get("max_completion_tokens") is not None else f.get("max_tokens")
    return GenRequest(kind="chat", messages=_messages(f["messages"]), tools=_tools(f.get("tools")),
                      max_tokens=max_tokens, logprobs=bool(f.get("logprobs")), top_logprobs=top or 0,
                      reasoning_effort=f.get("reasoning_effort"), **_sampling(f))


def parse_completion(data: Mapping[str, Any]) -> GenRequest:
    """A /v1/completions body as a GenRequest; ApiError(400) naming the first bad field."""
    f = _fields(data, _COMPLETION)
    if "prompt" not in f:
        raise bad("'prompt' is required", "prompt")
    logprobs = f.get("logprobs")
    max_tokens = f.get("max_tokens")
    return GenRequest(kind="completion", prompt=_prompt(f["prompt"]),
                      max_tokens=16 if max_tokens is None else max_tokens,
                      logprobs=logprobs is not None, top_logprobs=logprobs or 0, **_sampling(f))


def _messages(value: Any) -> tuple[dict[str, Any], ...]:
    """Messages with their content as plain text (text parts joined) and tool-call arguments as objects."""
    if not isinstance(value, list) or not value:
        raise bad("'messages' must be a non-empty list of message objects", "messages")
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"'{where}' must be an object, got {_kind(m)}", where)
        role = m.get("role")
        if role not in ROLES:
            raise bad(f"'{where}.role' = {_short(role)}: must be one of {', '.join(ROLES)}", f"{where}.role")
        msg = {k: v for k, v in m.items() if v is not None}
        msg["content"] = _content(m.get("content"), f"{where}.content", role == "assistant" and "tool_calls" in m)
        if "tool_calls" in msg:
            msg["tool_calls"] = _tool_calls(msg["tool_calls"], f"{where}.tool_calls")
        out.append(msg)
    return tuple(out)


def _content(value: Any, where: str, may_be_empty: bool) -> str:
    if isinstance(value, str):
        return value
    if value is None and may_be_empty:
        return ""
    if isinstance(value, list):
        parts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else _kind(part)
                raise bad(f"'{where}': only text parts are supported, got {_short(kind)}", where)
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"'{where}' must be a string or a list of text parts, got {_kind(value)}", where)


def _tool_calls(value: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI sends a call's arguments as a JSON string; templates (as transformers' examples) expect an object."""
    if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
        raise bad(f"'{where}' must be a list of objects", where)
    calls = []
    for call in value:
        fn = call.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                fn = {**fn, "arguments": json.loads(fn["arguments"])}
            except ValueError:
                pass  # not JSON: the template gets the string as sent
            call = {**call, "function": fn}
        calls.append(call)
    return calls


def _tools(value: Any) -> tuple[dict[str, Any], ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad(f"'tools' must be a list, got {_kind(value)}", "tools")
    for i, tool in enumerate(value):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise bad(f"'tools[{i}]' must be {{'type': 'function', 'function': {{'name': ...}}}}", f"tools[{i}]")
    return tuple(value) if value else None


def _prompt(value: Any) -> str | tuple[int, ...]:
    """A prompt: a string, one string in a list, or token ids (a list of integers, or one such list in a list)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return tuple(value)
    raise bad("'prompt' must be a string or a list of token ids (one prompt per request)", "prompt")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
