"""Chat templates: SmolLM2's real template, Gemma's built-in one, and hostile templates (RELIABILITY 1, 21, 22)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.chat.template import CHATML_SOURCE, GEMMA_SOURCE, ChatTemplate, render_chatml, render_gemma
from engine.gguf.reader import open_gguf
from engine.tokenizer.vocab import Tokenizer

ROOT = Path(__file__).resolve().parents[3]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there "},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "What is 2+2?"},
]


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> tuple[dict[str, Any], Tokenizer]:
    md = open_gguf(smollm2_path).metadata
    return md, Tokenizer.from_metadata(md)


@pytest.fixture(scope="module")
def gemma3(gemma3_path: Path) -> tuple[dict[str, Any], Tokenizer]:
    md = open_gguf(gemma3_path).metadata
    return md, Tokenizer.from_metadata(md)


def _hostile(source: str, arch: str = "llama", **kw: Any) -> ChatTemplate:
    return ChatTemplate(source, is_builtin=False, arch=arch, **kw)


# -- real models ----------------------------------------------------------------------------------


def test_smollm2_real_template(smollm2: tuple[dict[str, Any], Tokenizer]) -> None:
    md, tok = smollm2
    chat = ChatTemplate.from_metadata(md, md["general.architecture"], tok)
    assert not chat.is_builtin and chat.source == md["tokenizer.chat_template"]
    result = chat.render([{"role": "user", "content": "Hi"}])
    assert result == type(result)(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", None, False)
    result = chat.render(CONVERSATION, add_generation_prompt=False)
    assert result.text == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there <|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n")
    ids = tok.encode(chat.render(CONVERSATION).text, add_special=True, parse_special=True)
    assert ids[0] == 1 and ids.count(2) == 4 and ids[-4:] == [1, 520, 9531, 198]  # <|im_start|>assistant\n


def test_gemma3_has_no_template_and_gets_the_builtin(gemma3: tuple[dict[str, Any], Tokenizer]) -> None:
    md, tok = gemma3
    assert "tokenizer.chat_template" not in md
    chat = ChatTemplate.from_metadata(md, md["general.architecture"], tok)
    assert chat.is_builtin and chat.source == GEMMA_SOURCE
    result = chat.render(CONVERSATION)
    assert result.warning is None and not result.used_fallback
    assert result.text == (
        "<start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"
        "<start_of_turn>model\n")
    ids = tok.encode(result.text, add_special=True, parse_special=True)
    assert ids[:4] == [2, 105, 2364, 107]  # <bos> <start_of_turn> user \n
    assert ids[-3:] == [105, 4368, 107]  # <start_of_turn> model \n


def test_gemma_fallback_when_a_gemma_template_fails(gemma3: tuple[dict[str, Any], Tokenizer]) -> None:
    md, tok = gemma3
    chat = ChatTemplate.from_metadata({**md, "tokenizer.chat_template": "{{ raise_exception('no system role') }}"},
                                      "gemma3", tok)
    result = chat.render(CONVERSATION)
    assert result.used_fallback and "no system role" in (result.warning or "")
    assert result.text == render_gemma(CONVERSATION)


def test_bos_in_template_is_not_doubled(gemma3: tuple[dict[str, Any], Tokenizer]) -> None:
    md, tok = gemma3
    source = "{{ bos_token }}" + GEMMA_SOURCE
    chat = ChatTemplate.from_metadata({**md, "tokenizer.chat_template": source}, "gemma3", tok)
    result = chat.render(CONVERSATION)
    assert not result.used_fallback and result.text == render_gemma(CONVERSATION)
    assert tok.encode(result.text, add_special=True).count(tok.bos_id) == 1


# -- built-in templates -----------------------------------------------------------------------------


@pytest.mark.parametrize("messages", [CONVERSATION, CONVERSATION[1:], CONVERSATION[:1], [],
                                      [{"role": "user", "content": [{"type": "text", "text": " parts "}]}]])
@pytest.mark.parametrize("gen", [True, False])
def test_builtin_renderers_match_their_jinja_source(messages: list[dict], gen: bool) -> None:
    plain = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str) else " parts "}
             for m in messages]
    for source, render in ((GEMMA_SOURCE, render_gemma), (CHATML_SOURCE, render_chatml)):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        assert env.from_string(source).render(messages=plain, add_generation_prompt=gen) == render(messages, gen)


def test_missing_or_unusable_template_uses_builtin() -> None:
    for value in (None, "", "   ", 42, ["{{ x }}"]):
        md = {} if value is None else {"tokenizer.chat_template": value}
        chat = ChatTemplate.from_metadata(md, "llama")
        assert chat.is_builtin and chat.source == CHATML_SOURCE
        want = "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
        assert chat.render([{"role": "user", "content": "x"}]).text == want


# -- ordinary templates render exactly as in a plain sandbox (no false alarms) ----------------------

_ORDINARY = {
    "namespace_and_loop": (
        "{%- set ns = namespace(sys='') -%}"
        "{%- for m in messages if m.role == 'system' %}{% set ns.sys = m.content %}{% endfor -%}"
        "{{ bos_token }}{% if ns.sys %}[SYS]{{ ns.sys | trim }}[/SYS]\n{% endif %}"
        "{% for m in messages %}{% if m.role != 'system' %}"
        "{{ loop.index0 }}:{{ m.role | upper }}: {{ m.content.split('2')[0] ~ '|' }}\n"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
    ),
    "macros_and_json": (
        "{% macro turn(role, text) %}<{{ role }}>{{ text }}</{{ role }}>{% endmacro %}"
        "{% for m in messages %}{{ turn(m['role'], m['content']) }}{% endfor %}"
        "{{ {'n': messages | length, 'roles': messages | map(attribute='role') | list} | tojson }}"
        "{{ messages[-1] | tojson(indent=2) }}"
    ),
    "loopcontrols_and_filters": (
        "{% for m in messages %}{% if loop.index > 3 %}{% break %}{% endif %}"
        "{{ '%s=%d;' | format(m.role, m.content | length) }}{{ m.content | replace(' ', '_') | center(20) }}"
        "{{ m.content | wordcount }}{{ (m.content * 2) | truncate(9, True) }}{% endfor %}"
        "{{ range(5) | join(',') }} {{ (messages | selectattr('role', 'equalto', 'user') | list | length) ** 2 }}"
        "{% if messages[0]['role'] == 'system' and not (tools is defined) %}{{ '{}-{}'.format(1, 2) }}{% endif %}"
    ),
}


@pytest.mark.parametrize("name", list(_ORDINARY))
def test_ordinary_templates_render_like_a_plain_sandbox(name: str) -> None:
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    plain.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    want = plain.from_string(_ORDINARY[name]).render(messages=CONVERSATION, add_generation_prompt=True,
                                                     bos_token="<s>", eos_token="</s>", tools=None, documents=None)
    result = _hostile(_ORDINARY[name], bos_token="<s>", eos_token="</s>").render(CONVERSATION)
    assert result.warning is None and result.text == want


def test_strftime_now_and_raise_exception_are_available() -> None:
    chat = _hostile("{{ strftime_now('%Y') }}|{% if messages|length > 9 %}{{ raise_exception('too long') }}{% endif %}")
    assert chat.render(CONVERSATION).text == time.strftime("%Y") + "|"
    result = chat.render(CONVERSATION * 3)
    assert result.used_fallback and "raised an error: too long" in (result.warning or "")


def test_concurrent_renders_agree() -> None:
    chat = _hostile(_ORDINARY["macros_and_json"])
    want = chat.render(CONVERSATION).text
    results: list[str] = []

    def work() -> None:
        results.extend(chat.render(CONVERSATION).text for _ in range(20))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [want] * 80


# -- RELIABILITY case 1: code execution through the template -------------------------------------


def _rce_templates(canary: Path) -> list[str]:
    return [
        '{{ lipsum.__globals__["os"].popen("touch %s").read() }}' % canary,
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.system('touch %s') }}" % canary,
        "{{ joiner.__init__.__globals__['os'].popen('touch %s') }}" % canary,
        "{{ namespace.__init__.__globals__.sys.modules.os.system('touch %s') }}" % canary,
        "{{ messages.__class__.__base__.__subclasses__() }}",
        "{{ (messages|attr('__class__')).__mro__ }}",
        "{{ range.__self__ }}{{ raise_exception.__globals__ }}",
        "{% set x = messages.append({'role': 'x'}) %}{{ messages|length }}",
        "{{ '{0.__class__.__mro__}'.format('') }}",
    ]


def test_template_code_execution_is_refused(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    pwned_before = Path("/tmp/pwned").exists()
    for source in _rce_templates(canary) + ['{{ lipsum.__globals__["os"].popen("touch /tmp/pwned").read() }}']:
        result = _hostile(source).render(CONVERSATION)
        assert result.used_fallback, source
        assert result.warning is not None
        assert "forbidden operation" in result.warning or "failed" in result.warning, (source, result.warning)
        assert result.text == render_chatml(CONVERSATION)
        assert not canary.exists(), source
    assert Path("/tmp/pwned").exists() == pwned_before
    result = _hostile(_rce_templates(canary)[0]).render(CONVERSATION)
    assert result.warning == "This model's chat template tried a forbidden operation; using the built-in template"


# -- RELIABILITY case 21: resource bombs -----------------------------------------------------------

BOMBS = {
    "range_1e9": "{% for i in range(10**9) %}{% endfor %}",
    "nested_ranges": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "string_times_1e9": '{{ "A" * 10**9 }}',
    "recursive_macro": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "recursive_loop": "{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}",
    "loop_over_long_strings": '{% set s = "x" * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}',
    "doubling_tilde": ('{% set ns = namespace(s="ab") %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}'
                       '{% endfor %}'),
    "doubling_plus": '{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}',
    "squaring": "{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "power": "{{ 7 ** 10000000 }}",
    "center": '{{ "a" | center(10**9) }}',
    "ljust": '{{ "a".ljust(10**9) }}',
    "printf_width": '{{ "%0999999999d" | format(1) }}',
    "printf_star": '{{ "%*d" % (10**9, 1) }}',
    "format_width": '{{ "{:>999999999}".format(1) }}',
    "join_huge": '{{ range(100000) | join("x" * 100000) }}',
    "print_list_of_big_strings": '{% set s = "x" * 1000000 %}{{ [s] * 100000 }}',
    "nested_list_literals": ('{% set s = "x" * 1000000 %}{% set a = [s,s,s,s,s,s,s,s,s,s] %}'
                             '{% set b = [a,a,a,a,a,a,a,a,a,a] %}{{ [b,b,b,b,b,b,b,b,b,b] }}'),
    "set_block_accumulates": ('{% set x %}{% for i in range(100000) %}{% for j in range(100) %}' + "z" * 1000
                              + "{% endfor %}{% endfor %}{% endset %}{{ x | length }}"),
    "output_flood": '{% for i in range(100000) %}{{ "y" * 100 }}{% endfor %}',
    "batch_fill": '{{ [1] | batch(10**9, "x") | list }}',
    "deep_nesting": "{{ " + "[" * 5000 + "]" * 5000 + " }}",
    "deep_blocks": "{% if true %}" * 3000 + "x" + "{% endif %}" * 3000,
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_resource_bombs_fall_back_quickly(name: str) -> None:
    t0 = time.process_time()
    result = _hostile(BOMBS[name]).render(CONVERSATION)
    elapsed = time.process_time() - t0
    print(f"{name}: {elapsed:.2f} CPU s, {result.warning}")
    assert elapsed < 60.0  # CPU seconds: a guard against a bomb that runs to its end (minutes to hours), not a speed bound
    assert result.used_fallback and result.text == render_chatml(CONVERSATION)
    assert "exceeded limits" in (result.warning or "") or "failed" in (result.warning or "")


def test_bombs_stay_within_memory_in_a_subprocess() -> None:
    """All bombs under RLIMIT_AS = 1 GiB and a raised recursion limit: the process survives and falls back."""
    script = (
        "import json, resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "sys.setrecursionlimit(10**6)\n"
        "from engine.chat.template import ChatTemplate\n"
        "bombs = json.loads(sys.stdin.read())\n"
        "msgs = [{'role': 'user', 'content': 'hi'}]\n"
        "out = {k: ChatTemplate(v, is_builtin=False, arch='llama').render(msgs).used_fallback\n"
        "       for k, v in bombs.items()}\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", script], input=json.dumps(BOMBS), capture_output=True, text=True,
                       timeout=240, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {k: True for k in BOMBS}


# -- RELIABILITY case 22: broken templates ---------------------------------------------------------


@pytest.mark.parametrize("source, fragment", [
    ("{% generation %}{{ m }}{% endgeneration", "could not be parsed"),
    ("{% for m in messages %}{{ m.content }", "could not be parsed"),
    ("{{ messages[0]['content'] + 1 }}", "failed (TypeError"),
    ("{{ raise_exception('System role not supported') }}", "raised an error: System role not supported"),
    ("{% if false %}never{% endif %}   \n", "rendered an empty prompt"),
    ("{{ undefined_thing.attr.deeper }}", "failed (UndefinedError"),
    ("x" * (2 << 20), "exceeded limits"),
])
def test_broken_templates_fall_back_with_a_visible_warning(source: str, fragment: str) -> None:
    chat = _hostile(source)
    for _ in range(2):  # the model stays usable: the next render falls back the same way
        result = chat.render(CONVERSATION)
        assert result.used_fallback and fragment in (result.warning or ""), result.warning
        assert result.warning.endswith("using the built-in template")
        assert result.text == render_chatml(CONVERSATION)


def test_bad_messages_are_a_caller_error() -> None:
    with pytest.raises(TypeError):
        _hostile("{{ messages }}").render("not a list")  # type: ignore[arg-type]


def test_more_amplifiers_are_refused() -> None:
    for source in (
        '{{ ("%9999s" * 200) | format(*range(200)) }}',
        '{{ ("%9000s" * 200) % ((1,) * 200) }}',
        '{{ ("x" * 1000000).replace("x", "yy") }}',
        '{{ ("x\\n" * 100000) | indent(1000) }}',
        '{{ (range(100000) | list) | tojson(indent=10000) }}',
        '{{ "\\n".join(["x" * 1000000] * 100) }}',
        '{{ ("x" * 1000000) | wordwrap(1, wrapstring="y" * 100) }}',
        '{{ ("\\t" * 1000000).expandtabs(100) }}',
    ):
        result = _hostile(source).render(CONVERSATION)
        assert result.used_fallback and "exceeded limits" in (result.warning or ""), (source, result.warning)
    ok = _hostile('{{ ", ".join(messages | map(attribute="role")) }}').render(CONVERSATION)
    assert ok.text == "system, user, assistant, user"
