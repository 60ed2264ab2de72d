"""Pre-tokenizer regexes run the way llama.cpp runs them: on text collapsed to llama.cpp's own Unicode categories.

llama.cpp (src/unicode.cpp, unicode_regex_split) never asks a regex library what a letter is. A pattern that
names a Unicode category (\\p{L}, \\p{N}, \\p{P}, \\p{M}, \\p{S}, \\p{Lu} ...) runs on a copy of the text in
which every non-ASCII code point is replaced by one byte: 0x0B for whitespace, 0xD1-0xD5 for a number,
letter, punctuation, mark or symbol, 0xD0 for anything else (undefined, separator, control); the pattern's
\\p{X} becomes a class of that byte and X's ASCII members. The categories come from its table
(src/unicode-data.cpp, here as unicode_data.py, made by tools/make_unicode_table.py), which is older than the
Unicode data of Python's `re` or of the `regex` module. A pattern with no category runs on the real code points
with non-ASCII whitespace replaced by 0x0B, since std::regex's \\s knows only ASCII.

llama.cpp's hand-written matchers for the GPT-2, LLaMA-3, Qwen2 and Qwen3.5 patterns classify with the same
table and behave as their regex does on the collapsed text (the GPT-2 one also takes a run of whitespace that
`\\s+(?!\\S)` leaves, as `|\\s+` would), so one mechanism serves every pre-tokenizer. The translated patterns
compile with re.ASCII: std::regex's \\s, \\d and \\w in the "C" locale are ASCII, and `$` is the end of input.
"""
from __future__ import annotations

import bisect
import functools
import re
from dataclasses import dataclass

import numpy as np

from engine.tokenizer.unicode_data import RANGES, WHITESPACE

# category flags, as unicode_cpt_flags in src/unicode.h
UNDEFINED, NUMBER, LETTER, SEPARATOR, MARK, PUNCTUATION, SYMBOL, CONTROL = 1, 2, 4, 8, 16, 32, 64, 128
MAX_CODEPOINT = 0x10FFFF
_COLLAPSED = {NUMBER: 0xD1, LETTER: 0xD2, PUNCTUATION: 0xD3, MARK: 0xD4, SYMBOL: 0xD5}  # k_ucat_cpt
_OTHER, _SPACE = 0xD0, 0x0B
# \p{X} -> (category, its ASCII members as a class body), as k_ucat_enum and k_ucat_map in unicode.cpp
_PROPERTIES = {
    r"\p{N}": (NUMBER, "0-9"),
    r"\p{L}": (LETTER, "A-Za-z"),
    r"\p{P}": (PUNCTUATION, r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
    r"\p{M}": (MARK, ""),
    r"\p{S}": (SYMBOL, r"\$\+<->\^`\|~"),
    **{rf"\p{{{sub}}}": (LETTER, "A-Za-z") for sub in ("Lu", "Ll", "Lt", "Lm", "Lo")},
}
# llama.cpp's hand-written matchers, by the exact pattern text that selects them (unicode_regex_split_custom)
GPT2_CUSTOM = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


@functools.cache
def _starts_and_flags() -> tuple[list[int], list[int]]:
    """The category runs of unicode_data.RANGES as two parallel lists."""
    starts, flags = [], []
    for pair in "".join(RANGES).split():
        first, flag = pair.split(":")
        starts.append(int(first, 16))
        flags.append(int(flag, 16))
    return starts, flags


def category(cp: int) -> int:
    """llama.cpp's category flag of a code point (UNDEFINED outside the table), as unicode_cpt_flags_from_cpt."""
    if not 0 <= cp <= MAX_CODEPOINT:
        return UNDEFINED
    starts, flags = _starts_and_flags()
    return flags[bisect.bisect_right(starts, cp) - 1]


def is_whitespace(cp: int) -> bool:
    """llama.cpp's is_whitespace flag."""
    return cp in _WHITESPACE


_WHITESPACE = frozenset(WHITESPACE)
_WIDE_SPACES = {cp: _SPACE for cp in WHITESPACE if cp >= 0x80}


@functools.cache
def _collapse_table() -> np.ndarray:
    """uint8[0x110000]: the byte each code point collapses to (ASCII stays itself)."""
    starts, flags = _starts_and_flags()
    bounds = np.array([*starts, MAX_CODEPOINT + 1], dtype=np.int64)
    codes = np.array([_COLLAPSED.get(f, _OTHER) for f in flags], dtype=np.uint8)
    table = np.repeat(codes, np.diff(bounds))
    table[:0x80] = np.arange(0x80, dtype=np.uint8)
    for cp in WHITESPACE:
        if cp >= 0x80:
            table[cp] = _SPACE
    return table


def collapse(text: str) -> str:
    """The text with each non-ASCII code point replaced by its category byte (text_collapsed in unicode.cpp)."""
    if text.isascii():
        return text
    cps = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
    return _collapse_table()[cps].tobytes().decode("latin-1")


def widen(text: str) -> str:
    """The text with non-ASCII whitespace replaced by 0x0B, as llama.cpp hands it to std::wregex."""
    return text if text.isascii() else text.translate(_WIDE_SPACES)


@dataclass(frozen=True)
class SplitPattern:
    """One pre-tokenizer expression: llama.cpp's text, and the regex that splits as llama.cpp does."""

    source: str  # the expression as llama-vocab.cpp writes it
    regex: re.Pattern[str]
    collapsed: bool  # runs on collapse(text) rather than widen(text)


def _translate(expr: str, collapsed: bool) -> str:
    """\\p{X} -> a class of X's category byte and ASCII members (inside [] or as one), as unicode_regex_split
    does; an unescaped `$` outside [] -> \\Z, since ECMAScript's `$` without multiline is the end of input."""
    out: list[str] = []
    inside = False
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch == "\\" and expr.startswith("p{", i + 1) and collapsed:
            end = expr.find("}", i + 3)
            prop = expr[i:end + 1] if end >= 0 else expr[i:i + 8]
            if prop not in _PROPERTIES:
                raise ValueError(f"pre-tokenizer pattern uses {prop!r}, which llama.cpp does not collapse")
            flag, ascii_members = _PROPERTIES[prop]
            body = f"\\x{_COLLAPSED[flag]:02x}{ascii_members}"
            out.append(body if inside else f"[{body}]")
            i = end + 1
            continue
        if ch == "\\":
            out.append(expr[i:i + 2])
            i += 2
            continue
        if ch == "[" and not inside:
            inside = True
        elif ch == "]" and inside:
            inside = False
        elif ch == "$" and not inside:
            ch = "\\Z"
        out.append(ch)
        i += 1
    return "".join(out)


def compile_pattern(expr: str) -> SplitPattern:
    """The split pattern for one llama.cpp expression; a category llama.cpp cannot collapse raises ValueError."""
    collapsed = any(prop in expr for prop in _PROPERTIES)
    if not collapsed and "\\p{" in expr:
        raise ValueError(f"pre-tokenizer pattern {expr[:40]!r} uses a category llama.cpp does not collapse")
    if collapsed:
        if not expr.isascii():
            raise ValueError("a pattern with Unicode categories must be ASCII (as llama.cpp requires)")
    body = _translate(expr, collapsed)
    if expr == GPT2_CUSTOM:
        body += r"|\s+"  # unicode_regex_split_custom_gpt2 takes what \s+(?!\S) leaves
    return SplitPattern(expr, re.compile(body, re.ASCII), collapsed)


def split_offsets(text: str, patterns: tuple[SplitPattern, ...]) -> list[tuple[int, int]]:
    """[start, end) code point spans of the pieces, each pattern splitting the spans the one before left."""
    views: dict[bool, str] = {}
    spans = [(0, len(text))] if text else []
    for pattern in patterns:
        view = views.get(pattern.collapsed)
        if view is None:
            view = views[pattern.collapsed] = collapse(text) if pattern.collapsed else widen(text)
        out: list[tuple[int, int]] = []
        for start, end in spans:
            pos = start
            for m in pattern.regex.finditer(view, start, end):
                a, b = m.span()
                if a > pos:
                    out.append((pos, a))
                if b > a:
                    out.append((a, b))
                pos = b
            if pos < end:
                out.append((pos, end))
        spans = out
    return spans
