"""Reasoning models' replies taken apart, and the switches their chat templates offer.

A reasoning model writes its thinking before its answer, in one of two forms:

* `<think> ... </think>` then the answer (Qwen3, QwQ, DeepSeek-R1 and their distillations, SmolLM3, GLM). Some
  templates open the block in the generation prompt (DeepSeek-R1's prompt ends in `<think>\\n`), so the reply
  starts inside it: `split_reasoning(text, opened=True)`; `opens_thinking(prompt)` tells from the prompt's end.
* OpenAI's harmony format (gpt-oss): `<|channel|>analysis<|message|> ... <|end|>`, then
  `<|start|>assistant<|channel|>final<|message|> ... ` (and `<|return|>`). Other channels (commentary) count as
  reasoning.

`split_reasoning` is safe on partial text (a reply still streaming): `thinking` says the answer has not begun.
`template_switches` reads a template's source for the variables it switches reasoning with: Qwen3's
`enable_thinking` (true unless set false) and gpt-oss's `reasoning_effort` (low, medium, high).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_CHANNEL = re.compile(r"<\|channel\|>(\w+)(?:[^<]*)<\|message\|>")
_HARMONY_END = ("<|end|>", "<|return|>", "<|call|>")
EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True)
class Reasoning:
    """A reply as its reasoning and its answer."""

    reasoning: str  # the thinking ('' when the reply has none)
    answer: str  # what the reply says to the user
    thinking: bool = False  # the reply is still inside its reasoning (no answer has begun)
    style: str = ""  # 'think', 'harmony' or '' (no reasoning)


def opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt leaves a <think> block open (the reply starts inside it)."""
    tail = prompt.rstrip()
    i = tail.rfind(THINK_OPEN)
    return i >= 0 and tail.find(THINK_CLOSE, i) < 0


def split_reasoning(text: str, opened: bool = False) -> Reasoning:
    """The reasoning and the answer of a reply (see the module docstring); text without either form is all answer."""
    if "<|channel|>" in text:
        return _harmony(text)
    start = text.find(THINK_OPEN)
    if start < 0 and not opened:
        return Reasoning("", text)
    body_from = start + len(THINK_OPEN) if start >= 0 else 0
    if start > 0 and text[:start].strip():  # words before the tag: not a reasoning block at the start
        return Reasoning("", text)
    end = text.find(THINK_CLOSE, body_from)
    if end < 0:
        return Reasoning(text[body_from:].strip("\n"), "", thinking=True, style="think")
    return Reasoning(text[body_from:end].strip("\n"), text[end + len(THINK_CLOSE):].lstrip("\n"), style="think")


def _harmony(text: str) -> Reasoning:
    """Harmony messages: each `<|channel|>NAME...<|message|>` header starts one, which runs to its end marker (or
    to the next header, or the end of the text while it streams)."""
    heads = list(_CHANNEL.finditer(text))
    thoughts, answer, final, open_last = [], [], False, False
    for i, m in enumerate(heads):
        body = text[m.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        stops = [j for j in (body.find(e) for e in _HARMONY_END) if j >= 0]
        open_last = not stops and i + 1 == len(heads)
        part = body[: min(stops)] if stops else body.split("<|start|>")[0]
        if m.group(1) == "final":
            final = True
            answer.append(part)
        else:
            thoughts.append(part.strip("\n"))
    return Reasoning("\n\n".join(t for t in thoughts if t), "".join(answer), not final and open_last, "harmony")


@dataclass(frozen=True)
class Switch:
    """A template variable that switches reasoning: its name, the values it takes, and the template's default."""

    name: str
    values: tuple[object, ...]
    default: object
    label: str


def template_switches(source: str) -> list[Switch]:
    """The reasoning switches a chat template's source reads."""
    out = []
    if "enable_thinking" in source:
        out.append(Switch("enable_thinking", (True, False), True, "Thinking"))
    if "reasoning_effort" in source:
        out.append(Switch("reasoning_effort", EFFORTS, "medium", "Reasoning effort"))
    return out
