"""Reasoning models' replies taken apart, and the switches their chat templates offer.

A reasoning model writes its thinking before its answer, in one of three forms:

* `<think> ... </think>` then the answer (Qwen3, Qwen3.5/3.6, QwQ, DeepSeek-R1 and their distillations, SmolLM3,
  GLM). Some templates open the block in the generation prompt (DeepSeek-R1's and Qwen3.5's prompts end in
  `<think>\\n`), so the reply starts inside it: `split_reasoning(text, opened=True)`; `opens_thinking(prompt)`
  tells from the prompt's end.
* Gemma 4's channels: `<|channel>thought\\n ... <channel|>` then the answer (the template asks for thinking with
  `<|think|>` in the system turn; with thinking off its prompt ends in an empty, closed block,
  `<|channel>thought\\n<channel|>`).
* OpenAI's harmony format (gpt-oss): `<|channel|>analysis<|message|> ... <|end|>`, then
  `<|start|>assistant<|channel|>final<|message|> ... ` (and `<|return|>`). Other channels (commentary) count as
  reasoning.

Tool calls (Qwen's `<tool_call>...</tool_call>`, Gemma 4's `<|tool_call>call:...<tool_call|>`) are part of the
answer: they stay as text. `split_reasoning` is safe on partial text (a reply still streaming): `thinking` says the
answer has not begun. `token_spans` finds the same parts in a chat's tokens, for the lenses to select a reply's
reasoning or its answer. `template_switches` reads a template's source for the variables it switches reasoning
with: `enable_thinking` (Qwen3's and Gemma 4's) and gpt-oss's `reasoning_effort` (low, medium, high);
`thinking_default` tells, by rendering, whether a template thinks when enable_thinking is not passed (Qwen3: yes,
Gemma 4 and DeepSeek-V3.1: no).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
GEMMA_OPEN, GEMMA_CLOSE = "<|channel>", "<channel|>"  # Gemma 4: <|channel>thought\n ... <channel|>
_GEMMA_HEAD = re.compile(r"<\|channel>\w*\n?")  # the opening marker, the channel's name and its newline
_CHANNEL = re.compile(r"<\|channel\|>(\w+)(?:[^<]*)<\|message\|>")
_HARMONY_END = ("<|end|>", "<|return|>", "<|call|>")
EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True)
class Reasoning:
    """A reply as its reasoning and its answer."""

    reasoning: str  # the thinking ('' when the reply has none)
    answer: str  # what the reply says to the user
    thinking: bool = False  # the reply is still inside its reasoning (no answer has begun)
    style: str = ""  # 'think', 'channel' (Gemma 4), 'harmony' or '' (no reasoning)


def opens_thinking(prompt: str) -> bool:
    """Whether the rendered prompt leaves a <think> block open (the reply starts inside it)."""
    tail = prompt.rstrip()
    i = tail.rfind(THINK_OPEN)
    return i >= 0 and tail.find(THINK_CLOSE, i) < 0


def split_reasoning(text: str, opened: bool = False) -> Reasoning:
    """The reasoning and the answer of a reply (see the module docstring); text without either form is all answer."""
    if "<|channel|>" in text:
        return _harmony(text)
    if GEMMA_OPEN in text:
        return _gemma_channels(text)
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


def _gemma_channels(text: str) -> Reasoning:
    """Gemma 4: each `<|channel>NAME\\n ... <channel|>` block is reasoning (to the end of the text while it streams),
    the rest is the answer, as the template's strip_thinking takes a reply apart. A block must open the reply (or
    follow another block or a tool call's end), or the text is all answer: words that merely mention the marker."""
    lead = text[: text.find(GEMMA_OPEN)]
    if lead.strip():
        return Reasoning("", text)
    thoughts, answer, at = [], [], 0
    while True:
        m = _GEMMA_HEAD.search(text, at)
        if m is None:
            answer.append(text[at:])
            break
        answer.append(text[at: m.start()])
        end = text.find(GEMMA_CLOSE, m.end())
        if end < 0:  # still thinking
            thoughts.append(text[m.end():].strip("\n"))
            rest = "".join(answer).strip()
            return Reasoning("\n\n".join(t for t in thoughts if t), rest, thinking=not rest, style="channel")
        thoughts.append(text[m.end(): end].strip("\n"))
        at = end + len(GEMMA_CLOSE)
    return Reasoning("\n\n".join(t for t in thoughts if t), "".join(answer).lstrip("\n"), style="channel")


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
               "</s>", "<|start|>", "<turn|>")


@dataclass(frozen=True)
class Span:
    """Tokens [start, stop) of a chat that are one reply's reasoning or its answer."""

    kind: str  # 'reasoning' or 'answer'
    start: int
    stop: int


def token_spans(token_texts: list[str] | tuple[str, ...]) -> list[Span]:
    """The reasoning and answer parts of every reply in a chat's tokens (their texts, special tokens as written), in
    order: the tokens inside `<think>`...`</think>` (or Gemma 4's `<|channel>thought`...`<channel|>`) and from there
    to the end of the turn; or each harmony message's body by its channel (final: the answer, any other:
    reasoning). The markers themselves (and Gemma 4's channel name) belong to neither.
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
    found += _block_spans(text, span, re.compile(re.escape(THINK_OPEN)), THINK_CLOSE)
    found += _block_spans(text, span, _GEMMA_HEAD, GEMMA_CLOSE)
    return sorted((s for s in found if s is not None), key=lambda s: s.start)


def _block_spans(text: str, span: Any, head: re.Pattern[str], close_marker: str) -> list[Span | None]:
    """Each block's body (from the end of its opening marker to its close, or to the end of the text) as reasoning,
    and what follows its close up to the end of the turn as the answer."""
    out: list[Span | None] = []
    m = head.search(text)
    while m is not None:
        close = text.find(close_marker, m.end())
        body_end = close if close >= 0 else len(text)
        out.append(span("reasoning", m.end(), body_end))
        if close >= 0:
            after = close + len(close_marker)
            turn = min([j for j in (text.find(e, after) for e in END_OF_TURN) if j >= 0] or [len(text)])
            nxt = head.search(text, after)  # Gemma 4 may think again before its turn ends (after a tool call)
            out.append(span("answer", after, min(turn, nxt.start()) if nxt is not None else turn))
        m = head.search(text, body_end)
    return out


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
    """The reasoning switches a chat template's source reads. enable_thinking's default here is Qwen3's (on); a
    template's own one (Gemma 4's is off) is what `thinking_default` finds by rendering."""
    out = []
    if "enable_thinking" in source:
        out.append(Switch("enable_thinking", (True, False), True, "Thinking"))
    if "reasoning_effort" in source:
        out.append(Switch("reasoning_effort", EFFORTS, "medium", "Reasoning effort"))
    return out


_PROBES = ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
           [{"role": "user", "content": "Hi"}])
_SWITCH_VALUES: tuple[Mapping[str, Any], ...] = ({}, {"enable_thinking": True}, {"enable_thinking": False})


def thinking_default(chat: Any) -> bool | None:
    """Whether a chat template (engine.chat.template.ChatTemplate) thinks when enable_thinking is not passed: True
    when its prompt then equals the one for enable_thinking=True (Qwen3, Qwen3.5/3.6), False when it equals the one
    for False (Gemma 4, DeepSeek-V3.1, Apertus); None when the template does not read the switch, renders the same
    both ways, leaves it unset as a third mode of its own, or refuses the probe conversations."""
    if getattr(chat, "is_builtin", False) or "enable_thinking" not in str(getattr(chat, "source", "")):
        return None
    for messages in _PROBES:
        try:
            unset, on, off = (chat.render_text(messages, add_generation_prompt=True, **v)
                              for v in _SWITCH_VALUES)
        except Exception:  # noqa: BLE001 (a template that refuses the probe: try the next, or do not know)
            continue
        if on == off:
            return None
        return True if unset == on else False if unset == off else None
    return None

