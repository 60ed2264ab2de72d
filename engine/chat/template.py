"""Chat templates from tokenizer.chat_template, rendered in a Jinja sandbox with time, size and depth caps."""
from __future__ import annotations

import logging
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jinja2.exceptions import SecurityError, TemplateSyntaxError

if TYPE_CHECKING:
    from engine.tokenizer.vocab import Tokenizer

from engine.chat.sandbox import (
    MAX_TEMPLATE_CHARS,
    OUTPUT_LIMIT,
    TIME_LIMIT_S,
    LimitExceeded,
    TemplateRaised,
    _CappedEnvironment,
    _check_nesting,
    _Deadline,
)

log = logging.getLogger(__name__)


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
_DELIMITER = re.compile(r"\{[{%#][-+]?|[-+]?[}%#]\}")
_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n", "gemma-embedding"})


@dataclass(frozen=True)
class RenderResult:
    """A rendered prompt; warning says why the built-in template was used instead of the model's."""

    text: str
    warning: str | None
    used_fallback: bool




def _content_text(content: Any) -> str:
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
    return [{"role": str(m.get("role", "")), "content": _content_text(m.get("content"))} for m in messages]


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


# -- the capped sandbox ---------------------------------------------------------------------------


class ChatTemplate:
    """A model's chat template (or a built-in one), rendered safely with a built-in fallback."""

    def __init__(self, source: str, *, is_builtin: bool, arch: str = "", bos_token: str = "", eos_token: str = "",
                 strip_bos: bool = False, strip_eos: bool = False, time_limit_s: float = TIME_LIMIT_S):
        self.source = source
        self.is_builtin = is_builtin
        self._fallback_source, self._fallback = builtin_for(arch)
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._strip_bos = strip_bos and bool(bos_token)
        self._strip_eos = strip_eos and bool(eos_token)
        self.time_limit_s = time_limit_s
        self._env: _CappedEnvironment | None = None
        self._compiled: Any = None
        self._compile_error: BaseException | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], arch: str, tokenizer: Tokenizer | None = None) -> ChatTemplate:
        """The template in tokenizer.chat_template, or the built-in one for arch when the file has none."""
        bos, eos, strip_bos, strip_eos = "", "", False, False
        if tokenizer is not None:
            bos = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
            eos = tokenizer.token_text(tokenizer.eos_id) if tokenizer.eos_id is not None else ""
            strip_bos, strip_eos = tokenizer.add_bos, tokenizer.add_eos
        else:
            bos, eos = _token_from_metadata(metadata, "bos"), _token_from_metadata(metadata, "eos")
        source = metadata.get("tokenizer.chat_template")
        if not isinstance(source, str) or not source.strip():
            if source is not None:
                log.warning("tokenizer.chat_template is not a usable string (%s); using the built-in template",
                            type(source).__name__)
            builtin_source, _ = builtin_for(arch)
            return cls(builtin_source, is_builtin=True, arch=arch, bos_token=bos, eos_token=eos)
        return cls(source, is_builtin=False, arch=arch, bos_token=bos, eos_token=eos,
                   strip_bos=strip_bos, strip_eos=strip_eos)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True) -> RenderResult:
        """The prompt for messages; the text is meant for encode(add_special=True, parse_special=True)."""
        if not isinstance(messages, Sequence) or not all(isinstance(m, Mapping) for m in messages):
            raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
        if self.is_builtin:
            return RenderResult(self._fallback(messages, add_generation_prompt), None, False)
        limit = max(OUTPUT_LIMIT, 4 * sum(len(_content_text(m.get("content"))) for m in messages) + 65536)
        try:
            with self._lock:
                text = self._render_sandboxed(messages, add_generation_prompt, limit)
        except TemplateRaised as e:
            return self._use_fallback(messages, add_generation_prompt, f"raised an error: {e}")
        except SecurityError:
            return self._use_fallback(messages, add_generation_prompt, "tried a forbidden operation")
        except (LimitExceeded, RecursionError, MemoryError) as e:
            detail = str(e) if isinstance(e, LimitExceeded) else type(e).__name__
            return self._use_fallback(messages, add_generation_prompt, f"exceeded limits ({detail})")
        except TemplateSyntaxError as e:
            where = f" at line {e.lineno}" if e.lineno else ""
            return self._use_fallback(messages, add_generation_prompt, f"could not be parsed ({e.message}{where})")
        except Exception as e:  # any other failure of untrusted template code
            return self._use_fallback(messages, add_generation_prompt, f"failed ({type(e).__name__}: {e})")
        if not text.strip():
            return self._use_fallback(messages, add_generation_prompt, "rendered an empty prompt")
        if self._strip_bos and text.startswith(self._bos_token):
            text = text[len(self._bos_token):]  # encode(add_special=True) adds BOS itself
        if self._strip_eos and text.endswith(self._eos_token):
            text = text[: -len(self._eos_token)]
        return RenderResult(text, None, False)

    def _use_fallback(self, messages: list[dict], add_generation_prompt: bool, why: str) -> RenderResult:
        warning = f"This model's chat template {why}; using the built-in template"
        log.warning("%s", warning)
        return RenderResult(self._fallback(messages, add_generation_prompt), warning, True)

    def _render_sandboxed(self, messages: list[dict], add_generation_prompt: bool, limit: int) -> str:
        if self._compile_error is not None:
            raise self._compile_error
        if len(self.source) > MAX_TEMPLATE_CHARS:
            self._compile_error = LimitExceeded(f"template is {len(self.source)} characters")
            raise self._compile_error
        if self._env is None:
            self._env = _CappedEnvironment()
        env = self._env
        env.start(self.time_limit_s, limit)
        chunks: list[str] = []
        output = None
        try:
            with _Deadline(env) as guard:
                if self._compiled is None:
                    try:
                        _check_nesting(self.source)
                        self._compiled = env.from_string(self.source)
                    except Exception as e:  # a template that fails to compile once always will
                        self._compile_error = e
                        raise
                env.tick()  # a timeout inside jinja's constant folding may have been swallowed
                sys.settrace(guard.trace)
                output = self._compiled.generate(
                    messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                    bos_token=self._bos_token, eos_token=self._eos_token)
                size = 0
                for chunk in output:
                    size += len(chunk)
                    if size > limit:
                        raise LimitExceeded(f"output longer than {limit} characters")
                    chunks.append(chunk)
                env.tick()
        finally:
            if output is not None:
                output.close()
            env.start(0.0, OUTPUT_LIMIT)  # drop references to this render's data
        return "".join(chunks)


def _token_from_metadata(metadata: Mapping[str, Any], role: str) -> str:
    """The text of the bos/eos token straight from metadata (when no Tokenizer is at hand), or ''."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    tid = metadata.get(f"tokenizer.ggml.{role}_token_id")
    if isinstance(tokens, (list, tuple)) and isinstance(tid, int) and 0 <= tid < len(tokens):
        text = tokens[tid]
        return text if isinstance(text, str) else ""
    return ""
