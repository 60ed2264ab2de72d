"""Issue 14 items 6-10 one by one: the generation tag, tools and documents, what is cached after a failed
compile, the system prompt folded for templates that refuse it, and transformers' template globals.

The probes in tests/fixtures/templates/expected.json.gz carry transformers' own answer for each behaviour
(tools/make_template_fixtures.py); the rest checks what `render` does around the template.
"""
from __future__ import annotations

import gzip
import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from engine.chat import template_globals
from engine.chat.builtin import fold_system
from engine.chat.template import ChatTemplate, plain_data, render_chatml
from engine.chat.template_globals import TemplateRaised

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "templates"
SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Hi"}
ASSISTANT = {"role": "assistant", "content": "Hello."}


@cache
def expected() -> dict[str, Any]:
    return json.loads(gzip.decompress((FIXTURES / "expected.json.gz").read_bytes()).decode("utf-8"))


def fixture_template(name: str, **kw: Any) -> ChatTemplate:
    source = (FIXTURES / f"{name}.jinja").read_text(encoding="utf-8")
    return ChatTemplate(source, is_builtin=False, bos_token="<s>", eos_token="</s>", **kw)


@pytest.fixture(autouse=True)
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    now = datetime.fromisoformat(expected()["now"])
    monkeypatch.setattr(template_globals, "clock", lambda: now)


# -- items 6 and 10: the probes, ours against transformers' answers ----------------------------------


@pytest.mark.parametrize("name", sorted(expected()["probes"]))
def test_probe_matches_transformers(name: str) -> None:
    probe = expected()["probes"][name]
    chat = ChatTemplate(probe["source"], is_builtin=False, bos_token="<s>", eos_token="</s>")
    want = probe["want"]
    kwargs = {"tools": probe.get("tools"), "documents": probe.get("documents")}
    if isinstance(want, dict):
        with pytest.raises(Exception) as info:  # any refusal; its kind is checked below
            chat.render_text(probe["messages"], add_generation_prompt=probe.get("gen", True), **kwargs)
        kind, _, message = want["refuses"].partition(": ")
        if kind == "TemplateError":  # raise_exception: the template's own message
            assert isinstance(info.value, TemplateRaised) and str(info.value) == message
        else:
            assert type(info.value).__name__ == kind
    else:
        text = chat.render_text(probe["messages"], add_generation_prompt=probe.get("gen", True), **kwargs)
        assert text == want


def test_render_text_defaults_to_no_generation_prompt_as_transformers() -> None:
    chat = ChatTemplate("{{ add_generation_prompt }}", is_builtin=False)
    assert chat.render_text([USER]) == "False"
    assert chat.render([USER]).text == "True"  # render is for generation: the prompt is on by default


def test_generation_tag_in_render() -> None:
    chat = ChatTemplate("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}",
                        is_builtin=False)
    assert chat.render([USER, ASSISTANT]) == type(chat.render([USER]))("[Hi][Hello.]", None, False)


def test_namespace_underscore_names_fall_back_as_forbidden() -> None:
    result = ChatTemplate("{% set ns = namespace(_x=1) %}{{ ns }}", is_builtin=False).render([USER])
    assert result.used_fallback and "forbidden operation" in (result.warning or "")


def test_template_data_is_plain() -> None:
    class Odd(str):
        pass

    data = plain_data({"a": (1, 2.5, True, None), "b": [Odd("x")], "c": object(), Odd("k"): {"d": b"x"}})
    assert data == {"a": (1, 2.5, True, None), "b": ["x"], "c": "<object>", "k": {"d": "<bytes>"}}
    assert type(data["b"][0]) is str
    with pytest.raises(ValueError, match="nested"):
        plain_data(json.loads("[" * 40 + "]" * 40))


# -- item 7: tools and documents --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
                                  "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
                                  "CohereForAI-c4ai-command-r-plus-tool_use"])
def test_tool_use_templates_refuse_without_tools_and_render_with_them(name: str) -> None:
    e = expected()
    conv = e["conversations"]["tools"]
    assert isinstance(e["templates"][name]["system_user/gen"], dict)  # transformers refuses: tools is None
    chat = fixture_template(name)
    without = chat.render(conv["messages"])
    assert without.used_fallback and without.text == render_chatml(conv["messages"])
    with_tools = chat.render(conv["messages"], tools=conv["tools"])
    assert not with_tools.used_fallback and with_tools.warning is None
    assert with_tools.text == e["templates"][name]["tools/gen"]
    assert "get_weather" in with_tools.text and "°C" in with_tools.text  # tojson keeps unicode


def test_a_files_tool_use_template_is_chosen_when_tools_are_given() -> None:
    """GGUF keeps named templates as tokenizer.chat_template.<name>; transformers picks 'tool_use' for tools."""
    e = expected()
    conv = e["conversations"]["tools"]
    tool_use = (FIXTURES / "CohereForAI-c4ai-command-r-plus-tool_use.jinja").read_text(encoding="utf-8")
    md = {"tokenizer.chat_template": "{{ 'plain:' }}{{ tools is none }}", "tokenizer.chat_template.tool_use": tool_use,
          "tokenizer.ggml.tokens": ["<s>", "</s>"], "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 1}
    chat = ChatTemplate.from_metadata(md, "command-r")
    assert chat.render([USER]).text == "plain:True"
    with_tools = chat.render(conv["messages"], tools=conv["tools"])
    assert not with_tools.used_fallback
    assert with_tools.text == e["templates"]["CohereForAI-c4ai-command-r-plus-tool_use"]["tools/gen"]


def test_documents_reach_the_template() -> None:
    e = expected()
    conv = e["conversations"]["documents"]
    name = "ibm-granite-granite-4.0"
    result = fixture_template(name).render(conv["messages"], documents=conv["documents"])
    assert not result.used_fallback and result.text == e["templates"][name]["documents/gen"]
    assert "Zürich: 4 °C" in result.text


@pytest.mark.parametrize("bad", [{"type": "function"}, "get_weather", [lambda: None], [["x"]]])
def test_bad_tools_are_a_caller_error(bad: Any) -> None:
    with pytest.raises(TypeError, match="tools must"):
        ChatTemplate("{{ tools }}", is_builtin=False).render([USER], tools=bad)


# -- item 8: what a failed compile leaves behind ----------------------------------------------------


def test_a_compile_that_hit_the_time_cap_is_retried() -> None:
    name = "google-gemma-4-31B-it"
    chat = fixture_template(name, time_limit_s=1e-6)
    user = expected()["conversations"]["user"]["messages"]
    first = chat.render(user)
    assert first.used_fallback and "exceeded limits (time)" in (first.warning or "")
    chat.time_limit_s = 60.0  # the machine is less busy now
    second = chat.render(user)
    assert not second.used_fallback and second.warning is None
    assert second.text == expected()["templates"][name]["user/gen"]


def test_a_syntax_error_is_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    chat = ChatTemplate("{% for m in messages %}{{ m.content }", is_builtin=False)
    assert "could not be parsed" in (chat.render([USER]).warning or "")
    env = chat._env
    assert env is not None
    calls: list[str] = []
    monkeypatch.setattr(env, "from_string", lambda source: calls.append(source))
    for _ in range(3):
        assert "could not be parsed" in (chat.render([USER]).warning or "")
    assert calls == []


def test_compiling_and_rendering_get_a_budget_each() -> None:
    chat = fixture_template("meetkai-functionary-medium-v3.2", time_limit_s=5.0)
    assert not chat.render([USER]).used_fallback


# -- item 9: a template that refuses a system message ------------------------------------------------


def test_fold_system_shapes() -> None:
    assert fold_system([SYSTEM, USER, ASSISTANT]) == [{"role": "user", "content": "Be brief.\n\nHi"}, ASSISTANT]
    assert fold_system([SYSTEM]) == [{"role": "user", "content": "Be brief."}]
    assert fold_system([SYSTEM, ASSISTANT]) == [{"role": "user", "content": "Be brief."}, ASSISTANT]
    parts = [{"type": "text", "text": "Hi"}]
    assert fold_system([SYSTEM, {"role": "user", "content": parts}]) == [
        {"role": "user", "content": [{"type": "text", "text": "Be brief.\n\n"}, *parts]}]
    assert fold_system([USER]) == [USER]
    messages = [SYSTEM, USER]
    fold_system(messages)
    assert messages == [SYSTEM, USER]  # the caller's list is left alone


def test_mistral_v01_roles_must_alternate_is_folded_too() -> None:
    e = expected()
    name = "mistralai-Mistral-7B-Instruct-v0.1"
    conv = e["conversations"]["system_multi_turn"]["messages"]
    assert e["templates"][name]["system_multi_turn/gen"]["refuses"].startswith(
        "TemplateError: Conversation roles must alternate")
    result = fixture_template(name).render(conv)
    assert result.folded_system and not result.used_fallback
    assert result.text == e["templates"][name]["folded_system_multi_turn/gen"]


def test_other_refusals_are_not_folded() -> None:
    chat = ChatTemplate("{% if messages | length > 2 %}{{ raise_exception('too long') }}{% endif %}{{ messages }}",
                        is_builtin=False)
    result = chat.render([SYSTEM, USER, ASSISTANT])
    assert result.used_fallback and not result.folded_system and "too long" in (result.warning or "")


def test_a_template_failing_with_and_without_the_system_message_falls_back_with_the_first_error() -> None:
    chat = ChatTemplate("{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}"
                        "{% endif %}{{ raise_exception('roles must alternate') }}", is_builtin=False)
    result = chat.render([SYSTEM, USER])
    assert result.used_fallback and "System role not supported" in (result.warning or "")
