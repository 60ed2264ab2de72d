"""Build tests/fixtures/tokenizer_corpus.json: the strings the tokenizer is checked on against llama.cpp.

    python tools/make_tokenizer_corpus.py [--llama-cpp DIR]

Sources, each entry tagged with where it came from:
- `manual`: the hand-written cases already in the file (kept as they are);
- `llama.cpp`: every test string of llama.cpp's models/ggml-vocab-*.gguf.inp (its own tokenizer tests), deduplicated;
- `tiktoken`: the input strings of openai/tiktoken's tests/test_encoding.py (repeated digits, the regex edge cases,
  the roundtrip strings, special-token texts, the "catastrophically repetitive" inputs);
- `hf-tokenizers`: the input strings of huggingface/tokenizers' Python binding tests;
- `hostile`: strings written to break pre-tokenizers (controls, bidi overrides, lone combining marks,
  half special tokens, U+FFFD, non-characters, very long runs);
- `generated`: megabyte-scale degenerate inputs, stored as unit x count;
- `sweep`: every assigned code point (in llama.cpp's table, Python's unicodedata or the `regex` module's newer
  data; surrogates left out, the private-use planes 15-16 sampled) in a context that makes a letter, a digit, punctuation and whitespace
  split differently.
Then run tools/make_tokenizer_fixtures.py to tokenize it with llama.cpp.
"""
from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.tokenizer.categories import UNDEFINED, category  # noqa: E402
from tests.engine.tokenizer.corpus import CORPUS  # noqa: E402

DEFAULT_SRC = Path("/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp")
SEPARATOR = "\n__ggml_vocab_test__\n"

TIKTOKEN = [
    *("0" * n for n in range(1, 18)),
    "rer", "'rer", "today\n ", "today\n \n", "today\n  \n", " \x850", "hello world", "hello <|endoftext|>",
    "<|endoftext|> hello <|fim_prefix|>", "<|endoftext|> hello <|fim_prefix|> there <|fim_middle|>",
    "hello", "hello ", "hello  ", " hello", " hello ", " hello  ", "请考试我的软件！12345", "👍", "\ufffd",
    "Café 😊 — 你好，世界", "two words", " two words", " two words ", "two words ", "’",
]
HF_TOKENIZERS = [  # the input strings of huggingface/tokenizers' bindings/python/tests (test_tokenizer, test_pre_tokenizers)
    "my name is john", "My name is John", "My name is Georges", "Hey friend!     How are you?!?", "Hey there!",
    "HeyThere!?-ThisIsLife", "my name", "pair",
]
HOSTILE = [
    "\u202eevil\u202c text", "\u2066isolate\u2069", "\u0301\u0301\u0301 lone marks", "a\u0300\u0301\u0302\u0303",
    "<|im_start", "|im_start|>", "<|im_start|><|im_start|", "<<|im_end|>>", "<start_of_turn><start_of_turn",
    "<|endoftext|><|endoftext|><|endoftext|>", "\ufffd\ufffd\ufffd", "\ufeff\ufeffBOM", "\uffff\ufffe\U0010ffff",
    "\x00\x01\x02\x03 nul", "\x1c\x1d\x1e\x1f separators", "\x85next line\x85", "\u2028line\u2029para",
    "tab\x0bvtab\x0cff", "\r\r\r\n\n\r", " \r\n \r\n ", "'''''", "'s's's's", "''s", "' s", "x's y'S z'Ll",
    "I\u0307stanbul \u0130stanbul", "\u212a kelvin \u017f long s", "ǅungla ǈj", "Ⅻ ⅻ ↀ ① ⓐ", "𝟘𝟙𝟚 ٠١٢ ०१२",
    "\u3000\u3000ideographic", "\u00a0\u00a0\u00a0", "\u2000\u2001\u2002\u2003x", " \u00a0 \u00a0x",
    "\t\t1", "\t\t\u1c89", "\u1c8a's", "\U00010d40\U00010d41 x", "\U00011db0 y", "\U00013460\U00013461",
    "\U0003d000 z", "a" * 300, "ab" * 300, " " * 300 + "x", "\n" * 300, "1" * 300, "😀" * 100,
    "ﷺ ﷽ ﬁ ﬂ", "Ⓐⓑⓒ", "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f", "각 각",
    "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇", "\U0001f9d1\u200d\U0001f91d\u200d\U0001f9d1", "x\u200dy\u200cz",
]
GENERATED = [
    ("x_1m", "x", 1_000_000, "", ""), ("spaces_1m", " ", 1_000_000, "", ""),
    ("spaces_1m_then_word", " ", 1_000_000, "", "end"), ("newlines_100k", "\n", 100_000, "", ""),
    ("digits_100k", "7", 100_000, "", ""), ("ab_200k", "ab", 100_000, "", ""),
    ("cjk_100k", "字", 100_000, "", ""), ("underscores_100k", "_", 100_000, " ", ""),
]
for _c in ("^", "0", "a", "'s", " ", "\n"):  # tiktoken's test_catastrophically_repetitive
    _n = f"{ord(_c[0]):02x}{len(_c)}"
    GENERATED += [(f"repeat_{_n}", _c, 10_000, "", ""), (f"repeat_sp_{_n}", _c, 10_000, " ", ""),
                  (f"repeat_sp_nl_{_n}", _c, 10_000, " ", "\n")]
CONTEXTS = [" {c}'s\t\t{c}1{c}"]


def llama_cpp_inputs(src: Path) -> list[str]:
    """The test strings of every models/ggml-vocab-*.gguf.inp, first occurrence kept."""
    seen: dict[str, None] = {}
    for path in sorted((src / "models").glob("ggml-vocab-*.gguf.inp")):
        text = path.read_text(encoding="utf-8")
        for item in text.split(SEPARATOR):
            item = item.removesuffix("\n__ggml_vocab_test__\n").removesuffix("\n__ggml_vocab_test__")
            seen.setdefault(item, None)
    return list(seen)


def sweep_ranges() -> list[list[int]]:
    """Assigned code points as inclusive ranges: llama.cpp's table, Python's unicodedata or the `regex` module
    (whose Unicode data is the newest: the code points llama.cpp calls undefined but a regex calls letters)."""
    import regex  # noqa: PLC0415 - a development dependency of this tool only

    unassigned = regex.compile(r"\p{Cn}")
    cps = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        if cp >= 0xF0000 and cp % 251:  # the private-use planes: a sample
            continue
        ch = chr(cp)
        if category(cp) != UNDEFINED or unicodedata.category(ch) != "Cn" or unassigned.match(ch) is None:
            cps.append(cp)
    ranges: list[list[int]] = []
    for cp in cps:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return ranges


def _regex_version() -> str:
    import regex  # noqa: PLC0415

    return regex.__version__


def main() -> int:
    """Rewrite the corpus file, keeping its manual entries."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, default=DEFAULT_SRC)
    args = parser.parse_args()
    old = json.loads(CORPUS.read_text(encoding="utf-8"))
    entries = [dict(e, source=e.get("source", "manual")) for e in old["entries"] if e.get("source", "manual") == "manual"]
    texts = {e["text"] for e in entries}

    def add(source: str, items: list[str]) -> None:
        for k, text in enumerate(items):
            if text not in texts:
                texts.add(text)
                entries.append({"name": f"{source}_{k:03d}", "text": text, "source": source})

    add("llama.cpp", llama_cpp_inputs(args.llama_cpp))
    add("tiktoken", TIKTOKEN)
    add("hf-tokenizers", HF_TOKENIZERS)
    add("hostile", HOSTILE)
    corpus = {
        "description": "Tokenizer test corpus; tokenized with llama.cpp by tools/make_tokenizer_fixtures.py; "
                       "made by tools/make_tokenizer_corpus.py (see its docstring for the sources)",
        "entries": entries,
        "generated": [{"name": n, "unit": u, "count": c, "prefix": p, "suffix": s} for n, u, c, p, s in GENERATED],
        "sweep": {"ranges": sweep_ranges(), "contexts": CONTEXTS, "per_entry": 32, "separator": "\n",
                  "unicodedata": unicodedata.unidata_version, "regex": _regex_version()},
    }
    CORPUS.write_text(json.dumps(corpus, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    n_sweep = sum(b - a + 1 for a, b in corpus["sweep"]["ranges"])
    print(f"wrote {CORPUS}: {len(entries)} strings, {len(GENERATED)} generated, {n_sweep} sweep code points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
