"""Reasoning replies taken apart and the templates' reasoning switches, on real chat templates from the models'
repositories (tests/fixtures/templates): Qwen3's enable_thinking, gpt-oss's reasoning_effort, a DeepSeek-R1
template that opens the <think> block in its generation prompt, Qwen3.5/3.6's (which opens it too, and keeps the
tool calls as text) and Gemma 4's <|channel>thought ... <channel|> blocks, thinking only when asked."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from engine.chat.reasoning import (
    opens_thinking,
    split_reasoning,
    template_switches,
    thinking_default,
    token_spans,
)
from engine.chat.template import ChatTemplate

TEMPLATES = Path(__file__).resolve().parents[2] / "fixtures" / "templates"
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / name).read_text(encoding="utf-8"), is_builtin=False, bos_token="<s>",
                        eos_token="</s>")


def test_qwen3_enable_thinking_switches_the_empty_think_block() -> None:
    source = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    assert [s.name for s in template_switches(source)] == ["enable_thinking"]
    t = template("Qwen-Qwen3-0.6B.jinja")
    on = t.render(MESSAGES).text
    off = t.render(MESSAGES, variables={"enable_thinking": False}).text
    assert on.endswith("<|im_start|>assistant\n") and off == on + "<think>\n\n</think>\n\n"
    assert not opens_thinking(on) and not opens_thinking(off)
    # an earlier reply's thinking is left out of the next prompt by the template itself
    history = MESSAGES + [{"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
                          {"role": "user", "content": "And 3 + 3?"}]
    assert "add them" not in t.render(history).text


def test_gpt_oss_reasoning_effort_goes_into_its_system_message() -> None:
    source = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
    assert [s.name for s in template_switches(source)] == ["reasoning_effort"]
    t = template("openai-gpt-oss-120b.jinja")
    assert "Reasoning: medium" in t.render(MESSAGES).text
    high = t.render(MESSAGES, variables={"reasoning_effort": "high"}).text
    assert "Reasoning: high" in high and high.endswith("<|start|>assistant")


def test_a_deepseek_r1_prompt_opens_the_think_block() -> None:
    prompt = template("llama-cpp-deepseek-r1.jinja").render(MESSAGES).text
    assert prompt.endswith("<｜Assistant｜><think>\n") and opens_thinking(prompt)
    r = split_reasoning("Two and two.\n</think>\n\nFour.", opened=opens_thinking(prompt))
    assert (r.reasoning, r.answer, r.thinking) == ("Two and two.", "Four.", False)


@pytest.mark.parametrize("text, reasoning, answer, thinking, style", [
    ("<think>\nadd them\n</think>\n\nIt is 4.", "add them", "It is 4.", False, "think"),
    ("<think>\nstill adding", "still adding", "", True, "think"),
    ("<think></think>Four", "", "Four", False, "think"),
    ("It is 4.", "", "It is 4.", False, ""),
    ("Use <think> tags like this.", "", "Use <think> tags like this.", False, ""),
    ("<|channel|>analysis<|message|>Simple sum.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>",
     "Simple sum.", "4", False, "harmony"),
    ("<|channel|>analysis<|message|>Simple", "Simple", "", True, "harmony"),
    ("<|channel|>analysis<|message|>Sum.<|end|><|start|>assistant<|channel|>final<|message|>Fo", "Sum.", "Fo", False,
     "harmony"),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary to=f <|message|>b<|call|>",
     "a\n\nb", "", False, "harmony"),
    # Gemma 4
    ("<|channel>thought\nAdd them.<channel|>It is 4.", "Add them.", "It is 4.", False, "channel"),
    ("<|channel>thought\nStill add", "Still add", "", True, "channel"),
    ("<|channel>thought\n<channel|>Four", "", "Four", False, "channel"),
    ("Gemma writes <|channel> for its thoughts.", "", "Gemma writes <|channel> for its thoughts.", False, ""),
])
def test_split_reasoning(text: str, reasoning: str, answer: str, thinking: bool, style: str) -> None:
    r = split_reasoning(text)
    assert (r.reasoning, r.answer, r.thinking, r.style) == (reasoning, answer, thinking, style)


def test_templates_without_switches_get_none_and_render_as_before() -> None:
    name = "HuggingFaceTB-SmolLM2-135M-Instruct.jinja"
    source = (TEMPLATES / name).read_text(encoding="utf-8")
    assert template_switches(source) == []
    t = template(name)
    assert t.render(MESSAGES).text == t.render(MESSAGES, variables={}).text


# ---- the same parts found in a chat's tokens (the lenses select them)

THINK_CHAT = ["<|im_start|>", "user", "\n", "Hi", "<|im_end|>", "<|im_start|>", "assistant", "\n", "<think>", "\n",
              "Let", " me", " think", "</think>", "\n\n", "Hello", "!", "<|im_end|>", "<|im_start|>", "user", "\n", "Again",
              "<|im_end|>", "<|im_start|>", "assistant", "\n", "<th", "ink>", "Hm", "</think>", "Yes"]
HARMONY_CHAT = ["<|start|>", "user", "<|message|>", "Hi", "<|end|>", "<|start|>", "assistant", "<|channel|>", "analysis",
                "<|message|>", "User", " greets", ".", "<|end|>", "<|start|>", "assistant", "<|channel|>", "final",
                "<|message|>", "Hello", "!", "<|return|>"]


def test_token_spans_of_think_blocks() -> None:
    """Each reply's <think> body and what follows it to the end of the turn (or of the text, while it streams); a
    marker split over two tokens still counts, and the markers belong to neither part."""
    spans = token_spans(THINK_CHAT)
    assert [(s.kind, s.start, s.stop) for s in spans] == [
        ("reasoning", 9, 13), ("answer", 14, 17), ("reasoning", 28, 29), ("answer", 30, 31)]
    assert "".join(THINK_CHAT[9:13]) == "\nLet me think" and "".join(THINK_CHAT[14:17]) == "\n\nHello!"


def test_token_spans_of_harmony_channels() -> None:
    spans = token_spans(HARMONY_CHAT)
    assert [(s.kind, s.start, s.stop) for s in spans] == [("reasoning", 10, 13), ("answer", 19, 21)]
    streaming = token_spans(HARMONY_CHAT[:12])  # still reasoning: the open message runs to the end
    assert [(s.kind, s.start, s.stop) for s in streaming] == [("reasoning", 10, 12)]


def test_a_chat_without_reasoning_has_no_spans() -> None:
    assert token_spans(["<|im_start|>", "assistant", "\n", "Hello", "<|im_end|>"]) == [] and token_spans([]) == []


# ---- Qwen3.5 / Qwen3.6 (qwen35, qwen35moe) and Gemma 4 (gemma4): their own templates, rendered and taken apart

QWEN_TOOL_CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n</function>\n"
                  "</tool_call>")
GEMMA_TOOL_CALL = '<|tool_call>call:get_weather{city:<|"|>Zürich<|"|>}<tool_call|>'


@pytest.mark.parametrize("name", ["Qwen3.5-4B.jinja", "Qwen-Qwen3.6-27B.jinja"])
def test_qwen35_reply_splits_into_its_thinking_and_answer(name: str) -> None:
    """Qwen3.5/3.6's prompt opens the <think> block (thinking is on unless enable_thinking=False), so the reply
    starts inside it; the answer after </think> is what the chat shows, and the next prompt drops the thinking."""
    t = template(name)
    assert [s.name for s in template_switches(t.source)] == ["enable_thinking"] and thinking_default(t) is True
    prompt = t.render(MESSAGES).text
    assert prompt.endswith("<|im_start|>assistant\n<think>\n") and opens_thinking(prompt)
    off = t.render(MESSAGES, variables={"enable_thinking": False}).text
    assert off.endswith("<think>\n\n</think>\n\n") and not opens_thinking(off)
    reply = "Two and two.\n</think>\n\nIt is 4."
    r = split_reasoning(reply, opened=opens_thinking(prompt))
    assert (r.reasoning, r.answer, r.thinking, r.style) == ("Two and two.", "It is 4.", False, "think")
    streaming = split_reasoning("Two and", opened=True)
    assert (streaming.reasoning, streaming.answer, streaming.thinking) == ("Two and", "", True)
    history = MESSAGES + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And 3 + 3?"}]
    assert "Two and two." not in t.render(history).text and "It is 4.<|im_end|>" in t.render(history).text


@pytest.mark.parametrize("name", ["Qwen3.5-4B.jinja", "Qwen-Qwen3.6-27B.jinja"])
def test_qwen35_tool_call_markup_stays_in_the_answer(name: str) -> None:
    r = split_reasoning("I should look it up.\n</think>\n\n" + QWEN_TOOL_CALL, opened=True)
    assert (r.reasoning, r.answer, r.style) == ("I should look it up.", QWEN_TOOL_CALL, "think")
    # the template writes a tool call in the same markup, so what the chat shows is what the model wrote
    conv = [MESSAGES[0], {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]},
        {"role": "tool", "content": "4 °C"}]
    assert QWEN_TOOL_CALL in template(name).render(conv).text


def test_qwen36_preserve_thinking_keeps_earlier_thinking() -> None:
    t = template("Qwen-Qwen3.6-27B.jinja")
    history = MESSAGES + [{"role": "assistant", "content": "It is 4.", "reasoning_content": "Two and two."},
                          {"role": "user", "content": "And 3 + 3?"}]
    assert "Two and two." not in t.render(history).text
    kept = t.render(history, variables={"preserve_thinking": True}).text
    assert "<|im_start|>assistant\n<think>\nTwo and two.\n</think>\n\nIt is 4.<|im_end|>" in kept


@pytest.mark.parametrize("name", ["google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja"])
def test_gemma4_thinks_only_when_asked_and_its_reply_splits(name: str) -> None:
    """Gemma 4's template does not think unless enable_thinking is true (<|think|> in the system turn); its prompt
    otherwise ends in an empty, closed thought channel. A thinking reply is <|channel>thought ... <channel|> and
    the answer; the next prompt strips the thought (the template's strip_thinking)."""
    t = template(name)
    assert [s.name for s in template_switches(t.source)] == ["enable_thinking"] and thinking_default(t) is False
    assert t.render(MESSAGES).text.endswith("<|turn>model\n<|channel>thought\n<channel|>")
    on = t.render(MESSAGES, variables={"enable_thinking": True}).text
    assert on.startswith("<s><|turn>system\n<|think|>") and on.endswith("<|turn>model\n")
    reply = "<|channel>thought\nTwo and two.<channel|>It is 4."
    r = split_reasoning(reply)
    assert (r.reasoning, r.answer, r.thinking, r.style) == ("Two and two.", "It is 4.", False, "channel")
    streaming = split_reasoning("<|channel>thought\nTwo and")
    assert (streaming.reasoning, streaming.answer, streaming.thinking, streaming.style) == ("Two and", "", True,
                                                                                            "channel")
    history = MESSAGES + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And 3 + 3?"}]
    text = t.render(history, variables={"enable_thinking": True}).text
    assert "Two and two." not in text and "<|turn>model\nIt is 4.<turn|>" in text


def test_gemma4_tool_call_markup_stays_in_the_answer() -> None:
    r = split_reasoning("<|channel>thought\nI should look it up.<channel|>" + GEMMA_TOOL_CALL)
    assert (r.reasoning, r.answer, r.style) == ("I should look it up.", GEMMA_TOOL_CALL, "channel")
    assert split_reasoning(GEMMA_TOOL_CALL).answer == GEMMA_TOOL_CALL  # no thought: all of it is the answer
    conv = [MESSAGES[0], {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}]
    assert GEMMA_TOOL_CALL in template("google-gemma-4-31B-it.jinja").render(conv, add_generation_prompt=False).text


GEMMA_CHAT = ["<s>", "<|turn>", "user", "\n", "Hi", "<turn|>", "\n", "<|turn>", "model", "\n", "<|channel>", "thought",
              "\n", "User", " greets", "<channel|>", "Hello", "!", "<turn|>"]


def test_token_spans_of_gemma4_thought_channels() -> None:
    """The thought's body (after the channel's name) is the reasoning, what follows <channel|> to <turn|> the answer;
    an empty, closed channel (Gemma 4's prompt with thinking off) leaves just the answer."""
    spans = token_spans(GEMMA_CHAT)
    assert [(s.kind, s.start, s.stop) for s in spans] == [("reasoning", 13, 15), ("answer", 16, 18)]
    assert [(s.kind, s.start, s.stop) for s in token_spans(GEMMA_CHAT[:14])] == [("reasoning", 13, 14)]
    off = GEMMA_CHAT[:12] + ["\n", "<channel|>", "Hello", "!", "<turn|>"]
    assert [(s.kind, s.start, s.stop) for s in token_spans(off)] == [("answer", 14, 16)]


def _expected() -> dict:
    return json.loads(gzip.decompress((TEMPLATES / "expected.json.gz").read_bytes()).decode("utf-8"))


def test_thinking_default_agrees_with_transformers_on_every_template() -> None:
    """What a template does with enable_thinking unset, read from transformers' renderings of the same
    conversation (unset, True, False): thinking_default must say the same for every fixture that reads it."""
    templates = _expected()["templates"]
    checked = 0
    for name, cases in sorted(templates.items()):
        if "thinking_on/gen" not in cases:
            continue
        unset, on, off = cases["system_user/gen"], cases["thinking_on/gen"], cases["thinking_off/gen"]
        if any(isinstance(x, dict) for x in (unset, on, off)) or on == off:
            continue
        want = True if unset == on else False if unset == off else None
        assert thinking_default(template(f"{name}.jinja")) is want, name
        checked += 1
    assert checked >= 25
    assert thinking_default(template("HuggingFaceTB-SmolLM2-135M-Instruct.jinja")) is None  # no switch to read
