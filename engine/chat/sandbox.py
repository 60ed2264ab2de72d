"""The Jinja sandbox chat templates render in: ImmutableSandboxedEnvironment plus time, size and depth caps.

The environment has the options, globals and filters transformers gives a template (`template_globals`);
every operator, call, filter and output chunk is checked against a deadline and size caps, so a hostile
template falls back instead of hanging or exhausting memory (RELIABILITY cases 1, 21).
"""
from __future__ import annotations

import functools
import logging
import re
import string
import sys
import time
import types
from collections.abc import Callable, Mapping, MappingView
from typing import Any

from jinja2 import Undefined, nodes, pass_eval_context
from jinja2.compiler import CodeGenerator, Frame, optimizeconst
from jinja2.exceptions import SecurityError
from jinja2.filters import do_batch, do_format, do_indent, do_replace, do_wordwrap, make_attrgetter, sync_do_slice
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, _PassArg

from engine.chat.template_globals import GLOBALS, GenerationTag, LimitExceeded, tojson


log = logging.getLogger(__name__)

TIME_LIMIT_S = 2.0  # wall-clock budget for compiling a template, and again for each render
OUTPUT_LIMIT = 1 << 20  # characters a template may produce (raised for long conversations, see render)
MAX_TEMPLATE_CHARS = 1 << 20  # larger templates are not compiled
MAX_ITEMS = 100_000  # longest range() or list a template may build
MAX_CALL_DEPTH = 64  # nested calls (macros, loop(), functions) a template may make
MAX_INT_BITS = 8192  # largest integer a template may compute
MAX_WIDTH = 10_000  # widths and precisions in format specs, center(), indent()
MAX_NESTING = 100  # brackets plus blocks nested deeper than this are refused before jinja parses them

_PRINTF_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d*)(?:\.(\*|\d*))?")
_BLOCK_TAG = re.compile(r"\{%[-+]?\s*(end)?(?:if|for|macro|call|filter|with|block)\b")
_DELIMITER = re.compile(r"\{[{%#][-+]?|[-+]?[}%#]\}")


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
        # the options and extensions transformers compiles chat templates with, plus the output hook
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, "jinja2.ext.loopcontrols"],
                         finalize=self._finalize)
        self.deadline = float("inf")
        self.output_limit = OUTPUT_LIMIT
        self.depth = 0
        self.emitted = 0
        self._weights: dict[int, tuple[Any, int]] = {}
        self.globals.update(GLOBALS, range=self._range)
        self.filters.update(center=self._center, indent=self._indent, wordwrap=self._wordwrap, format=self._format,
                            replace=self._replace, join=self._join, batch=self._batch, slice=self._slice,
                            tojson=tojson)
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
