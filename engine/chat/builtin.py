"""The built-in chat templates (ChatML, Gemma's turns) and the system prompt folded into the first user turn.

A model without a usable template, or whose template fails, is rendered with one of these; each is given as
Jinja source (shown in the Model lens) and as a plain Python renderer that produces the same text (tested).
Gemma has no system role, so its built-in template opens the first user turn with the system prompt;
`fold_system` does the same to a conversation for a model's own template that refuses a system message.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

CHATML_SOURCE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Gemma's turn format; Gemma has no system role, so the system prompt opens the first user turn
GEMMA_SOURCE = (
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set prefix = messages[0]['content'] + '\\n\\n' %}{% set turns = messages[1:] %}"
    "{% if not turns %}{% set turns = [{'role': 'user', 'content': ''}] %}{% endif %}"
    "{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + (prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n", "gemma-embedding"})


def content_text(content: Any) -> str:
    """Message content as text: strings as they are, lists of {'type': 'text', 'text': ...} parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return str(content)


def _plain(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Messages reduced to {'role', 'content'} strings, for the built-in templates."""
    return [{"role": str(m.get("role", "")), "content": content_text(m.get("content"))} for m in messages]


def render_chatml(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """ChatML: <|im_start|>role\\ncontent<|im_end|>\\n per message (same output as CHATML_SOURCE)."""
    out = [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in _plain(messages)]
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def render_gemma(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
    """Gemma turns, system prompt folded into the first turn (same output as GEMMA_SOURCE)."""
    plain = _plain(messages)
    prefix, turns = "", plain
    if plain and plain[0]["role"] == "system":
        prefix, turns = plain[0]["content"] + "\n\n", plain[1:] or [{"role": "user", "content": ""}]
    out = []
    for i, m in enumerate(turns):
        role = "model" if m["role"] == "assistant" else m["role"]
        body = (prefix if i == 0 else "") + m["content"].strip()
        out.append(f"<start_of_turn>{role}\n{body}<end_of_turn>\n")
    if add_generation_prompt:
        out.append("<start_of_turn>model\n")
    return "".join(out)


_Builtin = Callable[[Sequence[Mapping[str, Any]], bool], str]


def builtin_for(arch: str) -> tuple[str, _Builtin]:
    """The built-in template (Jinja source, renderer) for an architecture: Gemma's for gemma*, else ChatML."""
    if arch in _GEMMA_ARCHS:
        return GEMMA_SOURCE, render_gemma
    return CHATML_SOURCE, render_chatml


def has_system(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any message has the system role."""
    return any(m.get("role") == "system" for m in messages)


def fold_system(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The conversation without system messages: their text opens the first user message, as GEMMA_SOURCE does.

    The system prompts (joined by a blank line) and the first user message's text are joined by a blank line;
    a conversation with no user message before the first reply gets a user message holding only the system text.
    """
    system = "\n\n".join(content_text(m.get("content")) for m in messages if m.get("role") == "system")
    rest = [dict(m) for m in messages if m.get("role") != "system"]
    if not system:
        return rest
    if rest and rest[0].get("role") == "user":
        first = rest[0]
        content = first.get("content")
        if isinstance(content, str) or content is None:
            first["content"] = system + "\n\n" + (content or "")
        else:  # a list of parts: the system text becomes the first text part
            first["content"] = [{"type": "text", "text": system + "\n\n"}, *content]
        return rest
    return [{"role": "user", "content": system}, *rest]
