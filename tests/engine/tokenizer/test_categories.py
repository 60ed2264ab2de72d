"""llama.cpp's Unicode categories in the pre-tokenizer: the table, the collapsed splitting, every pre-tokenizer.

The golden comparison with llama.cpp on every assigned code point is the sweep in test_llama_corpus; these are
the rules behind it, and the table's provenance (tools/make_unicode_table.py).
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from engine.tokenizer import bpe
from engine.tokenizer.bpe import pre_tokenizer, split_words
from engine.tokenizer.categories import (
    CONTROL,
    LETTER,
    MARK,
    NUMBER,
    PUNCTUATION,
    SEPARATOR,
    SYMBOL,
    UNDEFINED,
    category,
    collapse,
    compile_pattern,
    is_whitespace,
)
from engine.tokenizer.vocab import Tokenizer

ROOT = Path(__file__).resolve().parents[3]
LLAMA_SRC = Path("/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp")


@pytest.mark.parametrize("cp, want", [
    (ord("a"), LETTER), (ord("Z"), LETTER), (ord("7"), NUMBER), (ord("'"), PUNCTUATION), (ord("$"), SYMBOL),
    (ord(" "), SEPARATOR), (0x0A, CONTROL), (0x0301, MARK), (0x4E00, LETTER), (0x0660, NUMBER),
    # assigned in newer Unicode (and so in Python's `re` / `regex`), undefined in llama.cpp's table
    (0x1C89, UNDEFINED), (0x1C8A, UNDEFINED), (0x10D40, UNDEFINED), (0x11DB0, UNDEFINED), (0x13460, UNDEFINED),
    (0x143FA, UNDEFINED), (0x3D000, UNDEFINED), (0x3FC3F, UNDEFINED),
    (0x110000, UNDEFINED), (-1, UNDEFINED),
])
def test_categories_are_llama_cpps(cp: int, want: int) -> None:
    assert category(cp) == want


def test_whitespace_is_llama_cpps() -> None:
    assert all(is_whitespace(c) for c in (9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x2028, 0x3000))
    assert not any(is_whitespace(c) for c in (0x1C, 0x1F, 0x200B, 0x180E, 0xFEFF))


def test_collapse_maps_each_code_point_to_one_category_byte() -> None:
    text = "a1 \u00e9\u0663\u3000\u1c89\u0301\u20ac\u00bf\U0001F600x"
    assert collapse(text) == "a1 \xd2\xd1\x0b\xd0\xd4\xd5\xd3\xd5x"
    assert collapse("plain ascii") == "plain ascii"
    assert len(collapse("\U0010FFFF\ud800")) == 2  # one byte per code point, lone surrogates included


@pytest.mark.parametrize("text, want", [
    ("\u1c8a's", ["\u1c8a'", "s"]),  # undefined in llama.cpp: not a letter, so no "'s" piece
    ("\t\t\u1c89", ["\t", "\t", "\u1c89"]),  # \s+(?!\S) leaves one tab before an undefined code point
    ("\t\t1", ["\t\t", "1"]),  # smollm splits digits off first: the tabs end their piece
    ("x \u00a0y", ["x", " ", "\u00a0", "y"]),
])
def test_smollm_pre_tokenizer_splits_like_llama_cpp(text: str, want: list[str]) -> None:
    assert split_words(text, pre_tokenizer("smollm").patterns) == want


@pytest.mark.parametrize("name", sorted(bpe._PRE_TABLE))
def test_every_pre_tokenizer_compiles_and_splits_losslessly(name: str) -> None:
    pre = pre_tokenizer(name)
    text = "Hello, wörld! 123 4567\r\n\t\u1c8a's \u00a0中文字 ÀÖ \u0661\u0662 ——"
    pieces = split_words(text, pre.patterns)
    assert "".join(pieces) == text and all(pieces)


def test_patterns_translate_as_unicode_regex_split() -> None:
    gpt2 = compile_pattern(bpe._GPT2)
    assert gpt2.collapsed and gpt2.regex.pattern.endswith(r"|\s+")  # the custom matcher's fallback
    assert compile_pattern(r"[\p{P}\$\+<=>\^~\|]+").regex.pattern == r"[\xd3!-#%-*,-/:-;?-@\[-\]_\{\}\$\+<=>\^~\|]+"
    wide = compile_pattern(r"\s+$")
    assert not wide.collapsed and wide.regex.pattern == r"\s+\Z"  # ECMAScript's `$`: the end of input
    with pytest.raises(ValueError, match="does not collapse"):
        compile_pattern(r"\p{Greek}+")


def test_duplicate_token_strings_keep_the_last_id() -> None:
    from tests.engine.tokenizer.test_tokenizer import _bpe_metadata  # noqa: PLC0415

    md = _bpe_metadata()
    tokens = list(md["tokenizer.ggml.tokens"]) + ["hello"]
    md["tokenizer.ggml.tokens"] = tokens
    md["tokenizer.ggml.token_type"] = list(md["tokenizer.ggml.token_type"]) + [1]
    tok = Tokenizer.from_metadata(md)
    assert tok.token_id("hello") == len(tokens) - 1  # as llama.cpp's token_to_id[word] = i
    assert tok.encode("hello") == [len(tokens) - 1]


@pytest.mark.skipif(not (LLAMA_SRC / "src" / "unicode-data.cpp").exists(), reason="llama.cpp sources not present")
def test_committed_table_is_what_the_tool_makes(tmp_path: Path) -> None:
    out = tmp_path / "unicode_data.py"
    subprocess.run([sys.executable, str(ROOT / "tools" / "make_unicode_table.py"), "--llama-cpp", str(LLAMA_SRC),
                    "--out", str(out)], check=True, capture_output=True)
    committed = importlib.util.find_spec("engine.tokenizer.unicode_data").origin
    assert out.read_text(encoding="utf-8") == Path(committed).read_text(encoding="utf-8")
