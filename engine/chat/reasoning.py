"""Reasoning models' replies taken apart, and the switches their chat templates offer.

A reasoning model writes its thinking before its answer, in one of two forms:

* `<think> ... </think>` then the answer (Qwen3, QwQ, DeepSeek-R1 and their distillations, SmolLM3, GLM). Some
  templates open the block in the generation prompt (DeepSeek-R1's prompt ends in `<think>\\n`), so the reply
  starts inside it: `split_reasoning(text, opened=True)`; `opens_thinking(prompt)` tells from the prompt's end.
* OpenAI's harmony format (gpt-oss): `<|channel|>analysis<|message|> ... <|end|>`, then
  `<|start|>assistant<|channel|>final<|message|> ... ` (and `<|return|>`). Other channels (commentary) count as
  reasoning.

`split_reasoning` is safe on partial text (a reply still streaming): `thinking` says the answer has not begun.
`token_spans` finds the same parts in a chat's tokens, for the lenses to select a reply's reasoning or its answer.
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


END_OF_TURN = ("<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>",
               "</s>", "<|start|>")


@dataclass(frozen=True)
class Span:
    """Tokens [start, stop) of a chat that are one reply's reasoning or its answer."""

    kind: str  # 'reasoning' or 'answer'
    start: int
    stop: int


def token_spans(token_texts: list[str] | tuple[str, ...]) -> list[Span]:
    """The reasoning and answer parts of every reply in a chat's tokens (their texts, special tokens as written), in
    order: the tokens inside `<think>`...`</think>` and from there to the end of the turn; or each harmony message's
    body by its channel (final: the answer, any other: reasoning). The markers themselves belong to neither.
    A chat without reasoning has no spans (all of a reply is its answer: nothing to choose between)."""
    starts, at = [], 0
    for t in token_texts:
        starts.append(at)
        at += len(t)
    text = "".join(token_texts)
    bounds = starts + [len(text)]

    def span(kind: str, a: int, b: int) -> Span | None:  # characters [a, b) -> the tokens that start inside
        first, last = _first_at(bounds, a), _first_at(bounds, b)
        return Span(kind, first, last) if last > first else None

    found: list[Span | None] = []
    for m in _CHANNEL.finditer(text):
        end = min([j for j in (text.find(e, m.end()) for e in _HARMONY_END) if j >= 0] or [len(text)])
        found.append(span("answer" if m.group(1) == "final" else "reasoning", m.end(), end))
    i = text.find(THINK_OPEN)
    while i >= 0:
        close = text.find(THINK_CLOSE, i)
        body_end = close if close >= 0 else len(text)
        found.append(span("reasoning", i + len(THINK_OPEN), body_end))
        if close >= 0:
            after = close + len(THINK_CLOSE)
            turn = min([j for j in (text.find(e, after) for e in END_OF_TURN) if j >= 0] or [len(text)])
            found.append(span("answer", after, turn))
        i = text.find(THINK_OPEN, body_end)
    return sorted((s for s in found if s is not None), key=lambda s: s.start)


def _first_at(bounds: list[int], char: int) -> int:
    """The index of the first token starting at or after character `char` (bounds: each token's start, then the end)."""
    import bisect  # noqa: PLC0415

    return min(bisect.bisect_left(bounds, char), len(bounds) - 1)


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
