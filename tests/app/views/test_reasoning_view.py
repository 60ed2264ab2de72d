"""A reasoning model's reply in the chat: the thinking collapsed above the answer, live while it streams; the
reasoning switches shown for templates that read them and sent only when set away from the template's default."""
from __future__ import annotations

import dataclasses

from PySide6.QtGui import QGuiApplication

from app.controllers.conversation import template_vars
from app.data.chats import Message
from app.data.store import Settings
from app.state import AppState
from app.views.chat.message import MessageWidget
from app.views.chat.sampling import SamplingPanel


def test_the_thinking_is_collapsed_above_the_answer(qtbot) -> None:
    w = MessageWidget(1, Message("assistant", "<think>\nTwo and two make four.\n</think>\n\nIt is **4**."))
    qtbot.addWidget(w)
    w.show()
    assert w.body.toPlainText().strip() == "It is 4." and "<think>" not in w.body.toPlainText()
    assert w.reasoning_button.isVisible() and w.reasoning_button.text() == "▸ Thought for 5 words"
    assert not w.reasoning_view.isVisible()
    w.reasoning_button.setChecked(True)
    assert w.reasoning_view.isVisible() and w.reasoning_view.toPlainText() == "Two and two make four."
    assert w.reasoning_button.text().startswith("▾")
    w.copy_button.click()
    assert QGuiApplication.clipboard().text() == "It is **4**."


def test_a_streaming_reply_says_it_is_thinking_then_shows_the_answer(qtbot) -> None:
    m = Message("assistant", "<think>\nLet me")
    w = MessageWidget(1, m)
    qtbot.addWidget(w)
    w.show()
    w.streaming = True
    w.refresh(force=True)
    assert w.reasoning_button.text() == "▸ Thinking… (2 words)" and w.body.toPlainText() == "…"
    m.content += " add.\n</think>\n\nFour."
    w.refresh()
    assert w.reasoning_button.text() == "▸ Thought for 3 words" and w.body.toPlainText().strip() == "Four."


def test_gpt_oss_channels_and_plain_replies(qtbot) -> None:
    oss = MessageWidget(1, Message("assistant", "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant"
                                                 "<|channel|>final<|message|>Four.<|return|>"))
    plain = MessageWidget(1, Message("assistant", "Just four."))
    for w in (oss, plain):
        qtbot.addWidget(w)
        w.show()
    assert oss.body.toPlainText().strip() == "Four." and oss.reasoning_button.isVisible()
    assert plain.body.toPlainText().strip() == "Just four." and not plain.reasoning_button.isVisible()


def test_switches_show_for_the_templates_that_read_them(qtbot) -> None:
    state = AppState()
    state.settings = Settings()
    panel = SamplingPanel(state)
    qtbot.addWidget(panel)
    panel.show()
    assert not panel.thinking.isVisible() and not panel.effort.isVisible()
    panel.set_switches(("enable_thinking",))
    assert panel.thinking.isVisible() and panel.thinking.isChecked() and not panel.effort.isVisible()
    assert template_vars(state.settings) == ()  # the template's own default: nothing is passed
    panel.thinking.setChecked(False)
    assert state.settings.enable_thinking is False and template_vars(state.settings) == (("enable_thinking", False),)
    panel.set_switches(("reasoning_effort",))
    panel.effort.setCurrentIndex(panel.effort.findData("high"))
    assert template_vars(state.settings) == (("enable_thinking", False), ("reasoning_effort", "high"))
    assert Settings.from_dict({**dataclasses.asdict(state.settings), "reasoning_effort": "max"}).reasoning_effort == "medium"


def test_the_prompt_carries_the_switch() -> None:
    """fit_context renders the request's template variables: Qwen3's empty think block when thinking is off."""
    from pathlib import Path
    from types import SimpleNamespace

    from app.jobs.chat import fit_context
    from app.records.reply import GenerationRequest
    from engine.chat.template import ChatTemplate

    source = (Path(__file__).resolve().parents[2] / "fixtures" / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
    seen: list[str] = []
    tok = SimpleNamespace(encode=lambda text, add_special, parse_special: seen.append(text) or [1] * len(text))
    model = SimpleNamespace(chat=ChatTemplate(source, is_builtin=False), tokenizer=tok)
    on = GenerationRequest(messages=(("user", "hi"),))
    fit_context(model, on, 4096)
    fit_context(model, dataclasses.replace(on, template_vars=template_vars(Settings(enable_thinking=False))), 4096)
    assert seen[1] == seen[0] + "<think>\n\n</think>\n\n"


def test_gemma4_and_qwen35_replies_collapse_their_thinking_and_show_tool_calls_as_text(qtbot) -> None:
    gemma = MessageWidget(1, Message("assistant", "<|channel>thought\nThe user wants the weather.<channel|>"
                                                  '<|tool_call>call:get_weather{city:<|"|>Zürich<|"|>}<tool_call|>'))
    qwen = MessageWidget(1, Message("assistant", "The user wants the weather.\n</think>\n\n<tool_call>\n"
                                                 "<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n"
                                                 "</function>\n</tool_call>"))
    for w in (gemma, qwen):
        qtbot.addWidget(w)
        w.show()
        assert w.reasoning_button.isVisible() and w.reasoning_button.text() == "▸ Thought for 5 words"
        assert "The user wants" not in w.body.toPlainText()
    assert gemma.body.toPlainText().strip() == '<|tool_call>call:get_weather{city:<|"|>Zürich<|"|>}<tool_call|>'
    shown = qwen.body.toPlainText()
    assert "<tool_call>" in shown and "<function=get_weather>" in shown and "</tool_call>" in shown


def test_a_template_that_does_not_think_by_default_is_asked_to() -> None:
    """Gemma 4's template thinks only with enable_thinking=True: the settings' "think before answering" (on by
    default) passes it; off, nothing is asked and the prompt ends in the template's empty thought channel."""
    from pathlib import Path
    from types import SimpleNamespace

    from app.jobs.chat import fit_context
    from app.records.reply import GenerationRequest
    from engine.chat.template import ChatTemplate

    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "templates"
    source = (fixtures / "google-gemma-4-31B-it.jinja").read_text(encoding="utf-8")
    seen: list[str] = []
    tok = SimpleNamespace(encode=lambda text, add_special, parse_special: seen.append(text) or [1] * len(text))
    model = SimpleNamespace(chat=ChatTemplate(source, is_builtin=False), tokenizer=tok)
    on = GenerationRequest(messages=(("user", "hi"),), template_vars=template_vars(Settings()))
    fit_context(model, on, 4096)
    fit_context(model, dataclasses.replace(on, template_vars=template_vars(Settings(enable_thinking=False))), 4096)
    assert "<|think|>" in seen[0] and seen[0].endswith("<|turn>model\n")
    assert "<|think|>" not in seen[1] and seen[1].endswith("<|turn>model\n<|channel>thought\n<channel|>")
