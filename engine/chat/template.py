"""Chat templates from tokenizer.chat_template, rendered as transformers renders them, in a capped sandbox.

`ChatTemplate.render_text` is the template's own output for a conversation, computed the way Hugging Face
transformers' `apply_chat_template` computes it (render_jinja_template in chat_template_utils.py): messages
rebuilt from plain data with None-valued keys dropped and the reasoning fields aliased, `tools` and
`documents` passed (None when the caller has none), the special tokens as variables. It raises when the
template does. `render` never raises for a template's faults: a template that refuses a system message
gets the system prompt folded into the first user turn (noted once); anything else falls back to a built-in
template with a warning the CLI and the app show.
"""
from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jinja2.exceptions import SecurityError, TemplateSyntaxError

from engine.chat.builtin import (
    CHATML_SOURCE,
    GEMMA_SOURCE,
    builtin_for,
    content_text,
    fold_system,
    has_system,
    render_chatml,
    render_gemma,
)
from engine.chat.sandbox import (
    MAX_TEMPLATE_CHARS,
    OUTPUT_LIMIT,
    TIME_LIMIT_S,
    _CappedEnvironment,
    _check_nesting,
    _Deadline,
)
from engine.chat.template_globals import LimitExceeded, TemplateRaised

if TYPE_CHECKING:
    from engine.tokenizer.vocab import Tokenizer

__all__ = ["CHATML_SOURCE", "GEMMA_SOURCE", "ChatTemplate", "RenderResult", "render_chatml", "render_gemma"]

log = logging.getLogger(__name__)

# names transformers reads a message's reasoning from; templates read the first (chat_template_utils.py)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
MAX_DATA_DEPTH = 32  # messages, tools and documents nested deeper than this are a caller error
FOLD_NOTE = ("This model's chat template does not accept a system message; the system prompt was put at the "
             "start of the first user message instead")


@dataclass(frozen=True)
class RenderResult:
    """A rendered prompt; warning says why the built-in template was used, or notes a change made once."""

    text: str
    warning: str | None
    used_fallback: bool
    folded_system: bool = False  # the system prompt opens the first user message (the template refused it)


def plain_data(value: Any, depth: int = 0) -> Any:
    """value rebuilt from JSON types (str, int, float, bool, None, dict, list, tuple); other objects become
    '<TypeName>' placeholders, as transformers' _plain_template_data, so a template only ever sees plain data."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if depth > MAX_DATA_DEPTH:
        raise ValueError(f"chat data nested more than {MAX_DATA_DEPTH} deep")
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k, depth + 1): plain_data(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_data(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(plain_data(v, depth + 1) for v in value)
    return f"<{type(value).__name__}>"


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as transformers hands them to a template: keys whose value is None dropped, plain data only,
    and a message's reasoning under every name templates read it by (`thinking`, `reasoning_content`)."""
    out = []
    for m in messages:
        msg = plain_data({k: v for k, v in m.items() if v is not None})
        reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


def _check_list_of_mappings(value: Any, what: str) -> None:
    if value is not None and (not isinstance(value, Sequence) or isinstance(value, str)
                              or not all(isinstance(x, Mapping) for x in value)):
        raise TypeError(f"{what} must be a list of dicts, or None")


def _failure(e: BaseException) -> str:
    """Why a template failed, worded for the fallback warning."""
    if isinstance(e, TemplateRaised):
        return f"raised an error: {e}"
    if isinstance(e, SecurityError):
        return "tried a forbidden operation"
    if isinstance(e, (LimitExceeded, RecursionError, MemoryError)):
        return f"exceeded limits ({e if isinstance(e, LimitExceeded) else type(e).__name__})"
    if isinstance(e, TemplateSyntaxError):
        return f"could not be parsed ({e.message}{f' at line {e.lineno}' if e.lineno else ''})"
    return f"failed ({type(e).__name__}: {e})"


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
        self._syntax_error: TemplateSyntaxError | None = None
        self._folds_system = False  # the template refused a system message once; fold it from then on
        self._fold_noted = False
        self._lock = threading.Lock()
        # the file's tokenizer.chat_template.tool_use, which transformers picks when the caller passes tools
        self.tool_use: ChatTemplate | None = None

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
        chat = cls(source, is_builtin=False, arch=arch, bos_token=bos, eos_token=eos,
                   strip_bos=strip_bos, strip_eos=strip_eos)
        tool_use = metadata.get("tokenizer.chat_template.tool_use")
        if isinstance(tool_use, str) and tool_use.strip():
            chat.tool_use = cls(tool_use, is_builtin=False, arch=arch, bos_token=bos, eos_token=eos,
                                strip_bos=strip_bos, strip_eos=strip_eos)
        return chat

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: Sequence[Mapping[str, Any]] | None = None,
               documents: Sequence[Mapping[str, Any]] | None = None,
               variables: Mapping[str, Any] | None = None) -> RenderResult:
        """The prompt for messages; the text is meant for encode(add_special=True, parse_special=True).

        tools are JSON schemas ({"type": "function", "function": {...}}) and documents {"title", "text"} dicts,
        handed to templates that use them; the built-in templates ignore both. Bad arguments raise TypeError.
        With tools, a file's separate tool-use template is used where it has one, as transformers chooses.
        variables are further template variables, as transformers passes extra keyword arguments (the reasoning
        switches `enable_thinking` and `reasoning_effort`, engine.chat.reasoning).
        """
        if tools is not None and self.tool_use is not None:
            return self.tool_use.render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                        documents=documents, variables=variables)
        context = self._context(messages, add_generation_prompt, tools, documents, variables)
        if self.is_builtin:
            return RenderResult(self._fallback(messages, add_generation_prompt), None, False)
        folded = self._folds_system and has_system(messages)
        try:
            if folded:
                context = self._context(fold_system(messages), add_generation_prompt, tools, documents, variables)
            text = self._run(context)
        except TemplateRaised as e:
            if folded or not has_system(messages) or not _refuses_system(e):
                return self._use_fallback(messages, add_generation_prompt, _failure(e))
            try:  # Gemma 2, Mistral v0.1 and others refuse a system message: fold it into the first user turn
                text = self._run(self._context(fold_system(messages), add_generation_prompt, tools, documents,
                                               variables))
            except Exception:  # noqa: BLE001 (still failing: the first error is the one to show)
                return self._use_fallback(messages, add_generation_prompt, _failure(e))
            self._folds_system = folded = True
            log.info("chat template refused a system message (%s); folding it into the first user turn", e)
        except Exception as e:  # noqa: BLE001 (any failure of untrusted template code falls back)
            return self._use_fallback(messages, add_generation_prompt, _failure(e))
        if not text.strip():
            return self._use_fallback(messages, add_generation_prompt, "rendered an empty prompt")
        if self._strip_bos and text.startswith(self._bos_token):
            text = text[len(self._bos_token):]  # encode(add_special=True) adds BOS itself
        if self._strip_eos and text.endswith(self._eos_token):
            text = text[: -len(self._eos_token)]
        note = None
        if folded and not self._fold_noted:  # said once per loaded template: the CLI and the app show it
            self._fold_noted = True
            note = FOLD_NOTE
            log.warning("%s", note)
        return RenderResult(text, note, False, folded)

    def render_text(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False,
                    tools: Sequence[Mapping[str, Any]] | None = None,
                    documents: Sequence[Mapping[str, Any]] | None = None, **variables: Any) -> str:
        """The template's own output, as transformers' render_jinja_template gives it; raises what the template
        raises (TemplateRaised for raise_exception, SecurityError, LimitExceeded, jinja's errors).

        variables are further template variables (transformers passes the special tokens and any extra
        keyword arguments); bos_token and eos_token default to the model's.
        """
        return self._run(self._context(messages, add_generation_prompt, tools, documents, variables))

    def _context(self, messages: Any, add_generation_prompt: bool, tools: Any, documents: Any,
                 variables: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], int]:
        """The template's variables and the output cap for them; bad arguments raise TypeError or ValueError."""
        if not isinstance(messages, Sequence) or isinstance(messages, str) or not all(
                isinstance(m, Mapping) for m in messages):
            raise TypeError("messages must be a list of {'role': ..., 'content': ...} dicts")
        _check_list_of_mappings(tools, "tools")
        _check_list_of_mappings(documents, "documents")
        data = {"bos_token": self._bos_token, "eos_token": self._eos_token, **(variables or {})}
        context = plain_data({"tools": None if tools is None else list(tools),
                              "documents": None if documents is None else list(documents), **data})
        context["messages"] = template_messages(messages)
        context["add_generation_prompt"] = bool(add_generation_prompt)
        size = sum(len(content_text(m.get("content"))) for m in messages) + len(repr(tools)) + len(repr(documents))
        return context, max(OUTPUT_LIMIT, 4 * size + 65536)

    def _run(self, prepared: tuple[dict[str, Any], int]) -> str:
        with self._lock:
            return self._render_sandboxed(*prepared)

    def _use_fallback(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool,
                      why: str) -> RenderResult:
        warning = f"This model's chat template {why}; using the built-in template"
        log.warning("%s", warning)
        return RenderResult(self._fallback(messages, add_generation_prompt), warning, True)

    def _compile(self, env: _CappedEnvironment) -> Any:
        """The compiled template; a syntax error is kept (it always recurs), a timeout or limit is not."""
        if self._syntax_error is not None:
            raise self._syntax_error
        if len(self.source) > MAX_TEMPLATE_CHARS:
            raise LimitExceeded(f"template is {len(self.source)} characters")
        _check_nesting(self.source)
        try:
            return env.from_string(self.source)
        except TemplateSyntaxError as e:
            self._syntax_error = e
            raise

    def _render_sandboxed(self, context: dict[str, Any], limit: int) -> str:
        if self._env is None:
            self._env = _CappedEnvironment()
        env = self._env
        env.start(self.time_limit_s, limit)
        chunks: list[str] = []
        output = None
        try:
            with _Deadline(env) as guard:
                if self._compiled is None:
                    self._compiled = self._compile(env)
                    env.tick()  # a timeout inside jinja's constant folding may have been swallowed
                    env.start(self.time_limit_s, limit)  # compiling and rendering get a budget each
                sys.settrace(guard.trace)
                output = self._compiled.generate(context)
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


def _refuses_system(e: TemplateRaised) -> bool:
    """Whether a template's error is about the system message or the order of roles (Gemma 2: 'System role not
    supported'; Mistral v0.1: 'Conversation roles must alternate user/assistant/...'), worth a fold."""
    text = str(e).lower()
    return "system" in text or "role" in text


def _token_from_metadata(metadata: Mapping[str, Any], role: str) -> str:
    """The text of the bos/eos token straight from metadata (when no Tokenizer is at hand), or ''."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    tid = metadata.get(f"tokenizer.ggml.{role}_token_id")
    if isinstance(tokens, (list, tuple)) and isinstance(tid, int) and 0 <= tid < len(tokens):
        text = tokens[tid]
        return text if isinstance(text, str) else ""
    return ""
