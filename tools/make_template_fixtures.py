"""Render real chat templates with Hugging Face transformers and store what it gives, for tests/engine/chat.

Run in a development venv that has transformers and jinja2 (no torch needed), not the project's .venv:

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install transformers jinja2
    /tmp/hfvenv/bin/python tools/make_template_fixtures.py [--add PATH ...]

Templates are the `*.jinja` files in tests/fixtures/templates/ (one per model, named after it); `--add` copies
more in first: a .jinja file, a directory of them, or a tokenizer_config.json (its chat_template, named after
the file's parent folder). Each template is rendered through `PreTrainedTokenizerFast.apply_chat_template`
(the code path model authors test with) for every conversation in CONVERSATIONS it uses (the tool
conversations only where the template mentions tools, the reasoning switches (enable_thinking both ways,
preserve_thinking) only where it reads them, and so on), with add_generation_prompt both ways,
bos_token "<s>" and eos_token "</s>", and the clock fixed at FIXED_NOW so that date-printing templates
(Llama 3.x) render the same text every day. The results go to tests/fixtures/templates/expected.json.gz
(gzip-compressed JSON): {"templates": {template: {case: text | {"refuses": "ErrorType: message"}}}}, a case
being "<conversation>/gen" or "<conversation>/nogen", with the conversations themselves under "conversations"
so the tests read them from the same file. "probes" holds small templates that each pin down one behaviour of
the environment (the generation tag, tojson's options, namespace's refusals, the message clean-up) with
transformers' answer. Where each template came from: tests/fixtures/templates/SOURCES.md.
"""
from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "templates"
EXPECTED = FIXTURES / "expected.json.gz"  # about 1 MB of JSON, 50 KB compressed
FIXED_NOW = datetime(2026, 1, 15, 10, 30, 0)
BOS, EOS = "<s>", "</s>"

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
USER = {"role": "user", "content": "Hi there - what's the weather like in Zürich? "}
ASSISTANT = {"role": "assistant", "content": "It is 4 °C and cloudy."}
USER2 = {"role": "user", "content": "And tomorrow?"}
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city, in °C.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city, e.g. Zürich"}},
            "required": ["city"],
        },
    },
}]
TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [{
    "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}]}
TOOL_RESULT = {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp_c": 4}'}
DOCUMENTS = [{"title": "Forecast", "text": "Zürich: 4 °C, cloudy; tomorrow 6 °C, sunny."}]
# the system prompt folded into the first user turn, as engine.chat.builtin.fold_system does for templates
# that refuse a system message
FOLDED_USER = {"role": "user", "content": SYSTEM["content"] + "\n\n" + USER["content"]}
REFUSES_SYSTEM = ["System role", "system role", "roles must alternate"]
REASONED = {"role": "assistant", "content": "It is 4 °C.", "reasoning_content": "The user asked about Zürich."}
# a tool call made after some thinking (Qwen3.5/3.6 and Gemma 4 replay it between the call and its result)
REASONED_TOOL_CALL = {**TOOL_CALL, "reasoning_content": "I should look the weather up."}
THINKING_SWITCH = ["enable_thinking"]

# name: (messages, tools, documents, variables (further keyword arguments: the reasoning switches), the words in a
# template that make the conversation worth rendering)
CONVERSATIONS: dict[str, dict[str, Any]] = {
    "user": {"messages": [USER]},
    "system_user": {"messages": [SYSTEM, USER]},
    "multi_turn": {"messages": [USER, ASSISTANT, USER2]},
    "system_multi_turn": {"messages": [SYSTEM, USER, ASSISTANT, USER2]},
    "tools": {"messages": [SYSTEM, USER], "tools": TOOLS, "when": ["tools"]},
    "tool_call": {"messages": [USER, TOOL_CALL, TOOL_RESULT], "tools": TOOLS, "when": ["tool_calls"]},
    "documents": {"messages": [USER], "documents": DOCUMENTS, "when": ["documents"]},
    "folded_system_user": {"messages": [FOLDED_USER], "when": REFUSES_SYSTEM},
    "folded_system_multi_turn": {"messages": [FOLDED_USER, ASSISTANT, USER2], "when": REFUSES_SYSTEM},
    "content_parts": {"messages": [SYSTEM, {"role": "user", "content": [{"type": "text", "text": USER["content"]}]}],
                      "when": ["is string", "is not string", "['type']", ".type"]},
    "reasoning": {"messages": [USER, REASONED, USER2], "when": ["reasoning_content", "thinking", "reasoning"]},
    "reasoned_tool_call": {"messages": [USER, REASONED_TOOL_CALL, TOOL_RESULT], "tools": TOOLS,
                           "when": ["reasoning_content"]},
    # the reasoning switches set both ways (Qwen3's default is on, Gemma 4's off), and Qwen3.6's preserve_thinking
    "thinking_on": {"messages": [SYSTEM, USER], "variables": {"enable_thinking": True}, "when": THINKING_SWITCH},
    "thinking_off": {"messages": [SYSTEM, USER], "variables": {"enable_thinking": False}, "when": THINKING_SWITCH},
    "thinking_off_multi_turn": {"messages": [USER, REASONED, USER2], "variables": {"enable_thinking": False},
                                "when": THINKING_SWITCH},
    "preserved_reasoning": {"messages": [USER, REASONED, USER2], "variables": {"preserve_thinking": True},
                            "when": ["preserve_thinking"]},
}


HI = [{"role": "user", "content": "hi"}]
# small templates that pin down one behaviour of transformers' environment each (issue 14, items 6, 7, 10)
PROBES: dict[str, dict[str, Any]] = {
    "generation_tag_scope": {"source": "{% set x = 1 %}{% generation %}{% set x = 2 %}{{ x }}{% endgeneration %}{{ x }}"},
    "tools_documents_none": {"source": "{{ tools is none }}{{ documents is none }}"},
    "tools_documents_given": {"source": "{{ tools | tojson }}|{{ documents | tojson }}", "tools": TOOLS,
                              "documents": DOCUMENTS},
    "tojson_options": {"source": "{{ 'é' | tojson }}{{ 'é' | tojson(ensure_ascii=True) }}"
                                 "{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2, sort_keys=True) }}"
                                 "{{ [1, 2] | tojson(separators=(',', ':')) }}{{ '<&>' | tojson }}"},
    "dict_global": {"source": "{% set d = dict(a=1) %}{{ d }}{{ dict.fromkeys(['x', 'y'], 0) }}"},
    "namespace_underscore_init": {"source": "{% set ns = namespace(_x=1) %}{{ ns }}"},
    "namespace_underscore_set": {"source": "{% set ns = namespace(a=1) %}{% set ns._b = 2 %}{{ ns.a }}"},
    "none_keys_dropped": {"source": "{{ 'tool_calls' in messages[0] }}{{ messages[0].keys() | list }}",
                          "messages": [{"role": "user", "content": "hi", "tool_calls": None}]},
    "reasoning_aliases": {"source": "{{ messages[0].thinking }}|{{ messages[0].reasoning_content }}|"
                                    "{{ messages[0] | list }}",
                          "messages": [{"role": "assistant", "content": "x", "reasoning": "why"}]},
    "trim_and_lstrip_blocks": {"source": "{% if true %}\n  a\n{% endif %}\n  {% for m in messages %}\n"
                                         "{{ m.role }}\n{% endfor %}"},
    "strftime_now": {"source": "{{ strftime_now('%d %b %Y %H:%M') }}"},
    "raise_exception": {"source": "{{ raise_exception('no ' ~ messages[0].role) }}"},
    "add_generation_prompt_default": {"source": "{{ add_generation_prompt }}", "gen": False},
    "loopcontrols": {"source": "{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}"
                               "{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}"},
}


def conversations_for(source: str) -> list[str]:
    """The conversations a template is rendered for: the plain ones always, the others where it uses them."""
    return [name for name, conv in CONVERSATIONS.items()
            if not conv.get("when") or any(word in source for word in conv["when"])]


def add_templates(paths: list[Path]) -> None:
    """Copy templates into the fixture folder: .jinja files, folders of them, or tokenizer_config.json files."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for path in paths:
        if path.is_dir():
            add_templates(sorted(path.glob("*.jinja")))
        elif path.suffix == ".jinja":
            shutil.copyfile(path, FIXTURES / path.name)
        elif path.suffix == ".json":
            source = json.loads(path.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(source, list):  # several named templates: the default one
                source = next((t["template"] for t in source if t.get("name") == "default"), None)
            if not isinstance(source, str):
                sys.exit(f"{path}: no chat_template string")
            (FIXTURES / f"{safe_name(path.parent.name)}.jinja").write_text(source, encoding="utf-8")
        else:
            sys.exit(f"{path}: not a .jinja file, a folder or a tokenizer_config.json")


def safe_name(name: str) -> str:
    """A file name from a model name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "template"


def make_tokenizer() -> Any:
    """The smallest fast tokenizer whose special tokens are just BOS and EOS: what apply_chat_template needs."""
    from tokenizers import Tokenizer  # noqa: PLC0415 (the development venv only)
    from tokenizers.models import WordLevel  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab={BOS: 0, EOS: 1}, unk_token=None)),
                                   bos_token=BOS, eos_token=EOS)


def fix_clock() -> None:
    """strftime_now in transformers reads datetime.now(); make it FIXED_NOW."""
    import transformers.utils.chat_template_utils as ctu  # noqa: PLC0415

    class FixedDatetime(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:
            return FIXED_NOW

    ctu.datetime = FixedDatetime  # type: ignore[misc]


def render_case(tokenizer: Any, source: str, conv: dict[str, Any], gen: bool) -> str | dict[str, str]:
    """transformers' text for one conversation, or {"refuses": "ErrorType: message"}."""
    try:
        return tokenizer.apply_chat_template(
            json.loads(json.dumps(conv["messages"])), tools=conv.get("tools"), documents=conv.get("documents"),
            chat_template=source, add_generation_prompt=gen, tokenize=False, **conv.get("variables", {}))
    except Exception as e:  # noqa: BLE001 (a template's refusal is a result too)
        return {"refuses": f"{type(e).__name__}: {e}"[:500]}


def main() -> int:
    """Render every fixture template for its conversations, and the probes, into EXPECTED."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--add", type=Path, nargs="*", default=[], help=".jinja files, folders, tokenizer_config.json")
    args = ap.parse_args()
    add_templates(args.add)
    import transformers  # noqa: PLC0415

    fix_clock()
    tokenizer = make_tokenizer()
    expected: dict[str, Any] = {
        "made_with": f"transformers {transformers.__version__}, apply_chat_template(tokenize=False)",
        "bos_token": BOS, "eos_token": EOS, "now": FIXED_NOW.isoformat(),
        "conversations": {k: {kk: vv for kk, vv in v.items() if kk != "when"} for k, v in CONVERSATIONS.items()},
        "templates": {},
    }
    expected["probes"] = {}
    for name, probe in PROBES.items():
        conv = {"messages": probe.get("messages", HI), **{k: probe[k] for k in ("tools", "documents") if k in probe}}
        expected["probes"][name] = {**probe, "messages": conv["messages"],
                                    "want": render_case(tokenizer, probe["source"], conv, probe.get("gen", True))}
    cases = refusals = 0
    for path in sorted(FIXTURES.glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        results: dict[str, Any] = {}
        for name in conversations_for(source):
            for gen in (True, False):
                out = render_case(tokenizer, source, CONVERSATIONS[name], gen)
                results[f"{name}/{'gen' if gen else 'nogen'}"] = out
                cases += 1
                refusals += isinstance(out, dict)
        expected["templates"][path.stem] = results
    text = json.dumps(expected, ensure_ascii=False, separators=(",", ":")) + "\n"
    EXPECTED.write_bytes(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0))  # same bytes each run
    print(f"{len(expected['templates'])} templates, {cases} cases ({refusals} refused) -> {EXPECTED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
