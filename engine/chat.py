"""Chat templates from tokenizer.chat_template, rendered in a Jinja sandbox with time, size and depth caps."""
from __future__ import annotations

import functools
import json
import logging
import re
import string
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping, MappingView, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jinja2 import Undefined, nodes, pass_eval_context
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from jinja2.filters import do_batch, do_format, do_indent, do_replace, do_wordwrap, make_attrgetter, sync_do_slice
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, _PassArg, generate_lorem_ipsum

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

TIME_LIMIT_S = 2.0  # wall-clock budget for compiling plus rendering one template
OUTPUT_LIMIT = 1 << 20  # characters a template may produce (raised for long conversations, see render)
MAX_TEMPLATE_CHARS = 1 << 20  # larger templates are not compiled
MAX_ITEMS = 100_000  # longest range() or list a template may build
MAX_CALL_DEPTH = 64  # nested calls (macros, loop(), functions) a template may make
MAX_INT_BITS = 8192  # largest integer a template may compute
MAX_WIDTH = 10_000  # widths and precisions in format specs, center(), indent()
MAX_NESTING = 100  # brackets plus blocks nested deeper than this are refused before jinja parses them

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
_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d*)(?:\.(\*|\d*))?")
_BLOCK_TAG = re.compile(r"\{%[-+]?\s*(end)?(?:if|for|macro|call|filter|with|block)\b")
_DELIMITER = re.compile(r"\{[{%#][-+]?|[-+]?[}%#]\}")
_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3", "gemma3n", "gemma-embedding"})


@dataclass(frozen=True)
class RenderResult:
    """A rendered prompt; warning says why the built-in template was used instead of the model's."""

    text: str
    warning: str | None
    used_fallback: bool


class LimitExceeded(Exception):
    """A chat template ran past a time, size or nesting limit."""


class TemplateRaised(Exception):
    """The template called raise_exception(message)."""


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


class _CountingCodeGenerator(CodeGenerator):
    """Routes every output chunk (also into macro and {% set %} buffers) and every `a ~ b` through size checks."""

    def _output_const_repr(self, group: Any) -> str:
        return f"environment.emit({super()._output_const_repr(group)})"

    def _output_child_pre(self, node: nodes.Expr, frame: Frame, finalize: Any) -> None:
        self.write("environment.emit(")
        super()._output_child_pre(node, frame, finalize)

    def _output_child_post(self, node: nodes.Expr, frame: Frame, finalize: Any) -> None:
        super()._output_child_post(node, frame, finalize)
        self.write(")")

    @optimizeconst
    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.checked_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


def _raise_exception(message: Any = "") -> None:
    raise TemplateRaised(str(message)[:500])


def _strftime_now(fmt: str = "%Y-%m-%d") -> str:
    if not isinstance(fmt, str) or len(fmt) > 200:
        raise LimitExceeded("strftime_now format too long")
    return datetime.now().strftime(fmt)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002 (jinja's names)
    if n > 100 or max > 1000 or min > max:
        raise LimitExceeded("lipsum too long")
    return generate_lorem_ipsum(n, html, min, max)


def _check_width(width: Any, what: str) -> None:
    if isinstance(width, int) and width > MAX_WIDTH or isinstance(width, str) and len(width) > MAX_WIDTH:
        raise LimitExceeded(f"{what} width {width if isinstance(width, int) else len(width)} > {MAX_WIDTH}")


def _check_printf(fmt: str) -> None:
    """Reject %-format specs with '*' widths, or widths/precisions above MAX_WIDTH (each, and all together)."""
    total = 0
    for m in _PRINTF_SPEC.finditer(fmt):
        for number in m.groups():
            if number == "*":
                raise LimitExceeded("'*' width in a % format")
            if number:
                total += int(number)
                _check_width(total, "% format")


def _check_nesting(source: str) -> None:
    """Reject templates nested deeper than MAX_NESTING (blocks plus brackets) before jinja recurses into them."""
    depth = blocks = 0
    for m in _BLOCK_TAG.finditer(source):
        depth = max(depth - 1, 0) if m.group(1) else depth + 1
        blocks = max(blocks, depth)
    depth = brackets = 0
    for c in _DELIMITER.sub("", source):
        if c in "([{":
            depth += 1
            brackets = max(brackets, depth)
        elif c in ")]}":
            depth = max(depth - 1, 0)
    if blocks + brackets > MAX_NESTING:
        raise LimitExceeded(f"template nested {blocks + brackets} deep (more than {MAX_NESTING})")


def _check_format_spec(fmt: str) -> None:
    """Reject str.format specs with nested fields or widths above MAX_WIDTH."""
    total = 0
    for _, field, spec, _ in string.Formatter().parse(fmt):
        if field is not None and spec:
            if "{" in spec:
                raise LimitExceeded("nested field in a format spec")
            for number in "".join(c if c.isdigit() else " " for c in spec).split():
                total += int(number)
                _check_width(total, "format spec")


class _CappedEnvironment(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment whose operators, calls and filters check a deadline and size caps."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _CountingCodeGenerator

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"],
                         finalize=self._finalize)
        self.deadline = float("inf")
        self.output_limit = OUTPUT_LIMIT
        self.depth = 0
        self.emitted = 0
        self._weights: dict[int, tuple[Any, int]] = {}
        self.globals.update(range=self._range, lipsum=_lipsum, raise_exception=_raise_exception,
                            strftime_now=_strftime_now)
        self.filters.update(center=self._center, indent=self._indent, wordwrap=self._wordwrap, format=self._format,
                            replace=self._replace, join=self._join, batch=self._batch, slice=self._slice,
                            tojson=self._tojson)
        self.filters = {name: self._checked_filter(f) for name, f in self.filters.items()}

    def start(self, time_limit_s: float, output_limit: int) -> None:
        """Reset the budgets for one render."""
        self.deadline = time.monotonic() + time_limit_s
        self.output_limit = output_limit
        self.depth = 0
        self.emitted = 0
        self._weights.clear()

    def tick(self) -> None:
        """Raise LimitExceeded once the deadline has passed."""
        if time.monotonic() > self.deadline:
            raise LimitExceeded("time")

    def weight(self, value: Any, depth: int = 0) -> int:
        """About how many characters str(value) would take; raises LimitExceeded past the output limit."""
        if isinstance(value, str):
            return len(value)
        if value is None or isinstance(value, (bool, float, range)):
            return 24
        if isinstance(value, int):
            return value.bit_length() // 3 + 2
        if isinstance(value, Namespace):
            value = value._Namespace__attrs  # type: ignore[attr-defined]
        if not isinstance(value, (Mapping, list, tuple, set, frozenset, MappingView)):
            return 64  # functions, macros, loop objects, Undefined: short reprs
        hit = self._weights.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        if depth > 32:
            raise LimitExceeded("data nested too deeply")
        total = 2
        for item in (value.items() if isinstance(value, Mapping) else value):
            total += self.weight(item, depth + 1) + 2
            if total > self.output_limit:
                raise LimitExceeded(f"value larger than {self.output_limit} characters")
        self._weights[id(value)] = (value, total)
        return total

    def _finalize(self, value: Any) -> Any:
        """Applied to every {{ expression }} before str(): refuse unsafe attributes and values too large to print."""
        if isinstance(value, Undefined) and getattr(value, "_undefined_exception", None) is SecurityError:
            raise SecurityError(value._undefined_message)  # printing it would silently show ''
        self.weight(value)
        return value

    def emit(self, chunk: str) -> str:
        """Count a chunk of output, wherever it goes; all chunks of one render share 4x the output limit."""
        self.emitted += len(chunk)
        if self.emitted > 4 * self.output_limit:
            raise LimitExceeded(f"template produced more than {4 * self.output_limit} characters")
        return chunk

    def _checked_filter(self, f: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a filter so its arguments are weighed (and the deadline checked) before it runs."""
        pass_arg = _PassArg.from_obj(f)
        skip = 0 if pass_arg is None else 1

        @functools.wraps(f)
        def checked(*args: Any, **kwargs: Any) -> Any:
            self.tick()
            for a in args[skip:]:
                self.weight(a)
            for a in kwargs.values():
                self.weight(a)
            return f(*args, **kwargs)

        if pass_arg is not None:
            checked.jinja_pass_arg = pass_arg  # type: ignore[attr-defined]
        return checked

    def _check_size(self, value: Any) -> None:
        if isinstance(value, str) and len(value) > self.output_limit:
            raise LimitExceeded(f"string of {len(value)} characters")
        if isinstance(value, (list, tuple)) and len(value) > MAX_ITEMS:
            raise LimitExceeded(f"list of {len(value)} items")

    # operators ---------------------------------------------------------------------------------

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """Check * ** + % for results too large before computing them."""
        self.tick()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    limit = self.output_limit if isinstance(seq, str) else MAX_ITEMS
                    if len(seq) * max(n, 0) > limit:
                        raise LimitExceeded(f"repetition of {len(seq)} x {n}")
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                    raise LimitExceeded("integer too large")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0:
                if max(left.bit_length(), 1) * right > MAX_INT_BITS and abs(left) > 1:
                    raise LimitExceeded(f"{left} ** {right} too large")
        elif operator == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                limit = self.output_limit if isinstance(left, str) else MAX_ITEMS
                if len(left) + len(right) > limit:
                    raise LimitExceeded(f"concatenation of {len(left) + len(right)}")
        elif operator == "%" and isinstance(left, str):
            _check_printf(left)
            self.weight(right)
        return super().call_binop(context, operator, left, right)

    def checked_concat(self, parts: tuple[Any, ...]) -> str:
        """`a ~ b ~ ...` with a size check on the result."""
        self.tick()
        for p in parts:
            self.weight(p)
        strs = [str(p) for p in parts]
        if sum(len(s) for s in strs) > self.output_limit:
            raise LimitExceeded("concatenation too long")
        return "".join(strs)

    # calls and attribute access ------------------------------------------------------------------

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's API)
        """Count nesting, check str methods that can allocate a lot, then call as the sandbox does."""
        __self.tick()
        for a in args:
            __self.weight(a)
        for a in kwargs.values():
            __self.weight(a)
        target = getattr(__obj, "__wrapped__", __obj)
        if isinstance(target, types.BuiltinMethodType) and isinstance(getattr(target, "__self__", None), str):
            if target.__name__ == "join" and len(args) == 1 and not kwargs:
                return __self.join_checked(args[0], target.__self__)
            __self._check_str_call(target.__self__, target.__name__, args, kwargs)
        __self.depth += 1
        try:
            if __self.depth > MAX_CALL_DEPTH:
                raise LimitExceeded(f"calls nested deeper than {MAX_CALL_DEPTH}")
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            __self.depth -= 1
        __self._check_size(result)
        return result

    def _check_str_call(self, s: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        first = args[0] if args else next(iter(kwargs.values()), None)
        if name in ("center", "ljust", "rjust", "zfill"):
            _check_width(first, name)
        elif name == "expandtabs" and isinstance(first, int) and len(s) * first > self.output_limit:
            raise LimitExceeded("expandtabs too wide")
        elif name == "replace" and len(args) >= 2:
            self._check_replace(s, args[0], args[1])
        elif name in ("format", "format_map"):
            _check_format_spec(s)

    def _check_replace(self, s: Any, old: Any, new: Any) -> None:
        s, old, new = str(s), str(old), str(new)
        count = len(s) + 1 if old == "" else s.count(old)
        if len(s) + count * max(len(new) - len(old), 0) > self.output_limit:
            raise LimitExceeded("replace result too long")

    def getattr(self, obj: Any, attribute: str) -> Any:
        """Sandboxed attribute access, with a deadline check."""
        self.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        """Sandboxed item access, with a deadline check."""
        self.tick()
        return super().getitem(obj, argument)

    # globals and filters -----------------------------------------------------------------------

    def _range(self, *args: int) -> range:
        rng = range(*args)
        if len(rng) > MAX_ITEMS:
            raise LimitExceeded(f"range of {len(rng)} items")
        return rng

    def _center(self, value: Any, width: int = 80) -> str:
        _check_width(width, "center")
        return str(value).center(width)

    def _indent(self, s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
        _check_width(width, "indent")
        w = len(width) if isinstance(width, str) else max(int(width), 0)
        s = str(s)
        if len(s) + (s.count("\n") + 1) * w > self.output_limit:
            raise LimitExceeded("indent result too long")
        return do_indent(s, width, first, blank)

    def _wordwrap(self, s: Any, width: int = 79, break_long_words: bool = True, wrapstring: str | None = None,
                  break_on_hyphens: bool = True) -> str:
        s = str(s)
        extra = len(wrapstring) if wrapstring is not None else 1
        if len(s) * (1 + extra) > self.output_limit:
            raise LimitExceeded("wordwrap result too long")
        return do_wordwrap(self, s, width, break_long_words, wrapstring, break_on_hyphens)

    def _format(self, value: Any, *args: Any, **kwargs: Any) -> str:
        _check_printf(str(value))
        return do_format(value, *args, **kwargs)

    @pass_eval_context
    def _replace(self, eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> str:
        self._check_replace(s, old, new)
        return do_replace(eval_ctx, s, old, new, count)

    @pass_eval_context
    def _join(self, eval_ctx: Any, value: Any, d: Any = "", attribute: Any = None) -> str:
        if attribute is not None:
            value = map(make_attrgetter(eval_ctx.environment, attribute), value)
        return self.join_checked(value, str(d))

    def join_checked(self, value: Any, sep: str) -> str:
        """sep.join(str(x) for x in value), refused before building anything too large."""
        items = []
        total = 0
        for item in value:
            self.tick()
            items.append(item)
            total += self.weight(item) + len(sep)
            if len(items) > MAX_ITEMS or total > self.output_limit:
                raise LimitExceeded("join result too long")
        return sep.join(str(x) for x in items)

    def _batch(self, value: Any, linecount: int, fill_with: Any = None) -> Any:
        if linecount > MAX_ITEMS:
            raise LimitExceeded("batch too large")
        return do_batch(value, linecount, fill_with)

    def _slice(self, value: Any, slices: int, fill_with: Any = None) -> Any:
        if slices > MAX_ITEMS:
            raise LimitExceeded("slice count too large")
        return sync_do_slice(value, slices, fill_with)

    @staticmethod
    def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                sort_keys: bool = False) -> str:
        # as Hugging Face's chat-template tojson (no HTML escaping, unicode kept)
        if isinstance(indent, int) and indent > 16 or isinstance(indent, str) and len(indent) > 16:
            raise LimitExceeded("tojson indent wider than 16")
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)


class _Deadline:
    """Context manager that traces Python lines in this thread and raises LimitExceeded past the deadline."""

    def __init__(self, env: _CappedEnvironment):
        self.env = env

    def trace(self, frame: Any, event: str, arg: Any) -> Any:
        """sys.settrace hook: called on every call and line while rendering."""
        if time.monotonic() > self.env.deadline:
            raise LimitExceeded("time")
        return self.trace

    def __enter__(self) -> _Deadline:
        self._old = sys.gettrace()
        sys.settrace(self.trace)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self._old)


# -- the public class -----------------------------------------------------------------------------


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
