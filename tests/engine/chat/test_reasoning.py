"""Reasoning replies taken apart and the templates' reasoning switches, on real chat templates from the models'
repositories (tests/fixtures/templates): Qwen3's enable_thinking, gpt-oss's reasoning_effort, a DeepSeek-R1
template that opens the <think> block in its generation prompt."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.chat.reasoning import opens_thinking, split_reasoning, template_switches, token_spans
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
