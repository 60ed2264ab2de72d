"""What a chat template finds in its environment, as Hugging Face transformers provides it.

Model authors test their templates with transformers' `apply_chat_template`
(transformers/utils/chat_template_utils.py, `_cached_compile_jinja_template`), so the names a template may
call, and how they behave, follow it: `raise_exception`, `strftime_now`, a `tojson` filter that keeps
unicode and does not escape HTML, a `dict` and a `namespace` that refuse underscore names, and the
`{% generation %}...{% endgeneration %}` tag (transformers' assistant-mask marker, which only renders its
body). Each is capped where a template could make it expensive; the caps themselves live in `sandbox`.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension
from jinja2.parser import Parser
from jinja2.utils import Namespace, generate_lorem_ipsum

MAX_JSON_INDENT = 16  # widest tojson indent a template may ask for
MAX_MESSAGE_CHARS = 500  # longest raise_exception message kept


class LimitExceeded(Exception):
    """A chat template ran past a time, size or nesting limit."""


class TemplateRaised(Exception):
    """The template called raise_exception(message)."""


# the clock strftime_now reads; tests and the fixture tool replace it to render dates reproducibly
Clock = Callable[[], datetime]
clock: Clock = datetime.now


def raise_exception(message: Any = "") -> None:
    """A template's own refusal (transformers raises jinja2.TemplateError with the message)."""
    raise TemplateRaised(str(message)[:MAX_MESSAGE_CHARS])


def strftime_now(fmt: str = "%Y-%m-%d") -> str:
    """The current local time formatted with fmt (Llama 3.x templates print today's date with it)."""
    if not isinstance(fmt, str) or len(fmt) > 200:
        raise LimitExceeded("strftime_now format too long")
    return clock().strftime(fmt)


def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # jinja's parameter names
    """jinja's lipsum with its sizes capped."""
    if n > 100 or max > 1000 or min > max:
        raise LimitExceeded("lipsum too long")
    return generate_lorem_ipsum(n, html, min, max)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None, separators: Any = None,
           sort_keys: bool = False) -> str:
    """json.dumps as transformers' tojson filter: unicode kept, no HTML escaping, indent and separators allowed."""
    if isinstance(indent, int) and indent > MAX_JSON_INDENT or isinstance(indent, str) and len(indent) > MAX_JSON_INDENT:
        raise LimitExceeded(f"tojson indent wider than {MAX_JSON_INDENT}")
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class TemplateDict:
    """The `dict` global: builds plain dicts, and has no attributes a template could climb through."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        """dict.fromkeys."""
        return dict.fromkeys(*args, **kwargs)


def _check_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"chat templates cannot store underscore-prefixed attributes on a namespace ({name!r})")


class TemplateNamespace(Namespace):
    """jinja's namespace() that refuses underscore-prefixed names, as transformers' TemplateNamespace."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's signature trick: namespace(self=...)
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_name(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_name(name)
        Namespace.__setitem__(self, name, value)


class GenerationTag(Extension):
    """`{% generation %}body{% endgeneration %}`: renders body, in its own scope as transformers' AssistantTracker.

    transformers records where each such block starts and ends to build an assistant-token mask; a prompt for
    generation needs only the text, so the body is rendered through a caller block and returned unchanged.
    """

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        """Parse the body up to endgeneration into a call block."""
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Callable[[], str]) -> str:
        return caller()


GLOBALS: dict[str, Any] = {
    "lipsum": lipsum, "raise_exception": raise_exception, "strftime_now": strftime_now,
    "dict": TemplateDict(), "namespace": TemplateNamespace,
}
