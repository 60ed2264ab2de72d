"""Both real vocabularies against llama.cpp on the whole outside corpus: ids in all four modes, and detokenization.

The corpus (tests/fixtures/tokenizer_corpus.json, made by tools/make_tokenizer_corpus.py) holds llama.cpp's own
tokenizer test inputs, tiktoken's and HF tokenizers' test strings, hostile strings, megabyte-scale degenerate inputs and a sweep of
every assigned code point in a context; the expected ids and llama_detokenize bytes come from llama.cpp
through tools/make_tokenizer_fixtures.py (tests/fixtures/tokens_<model>.json).
"""
from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from engine.gguf.reader import open_gguf
from engine.tokenizer.vocab import Tokenizer
from tests.conftest import GEMMA3_FILE, SMOLLM2_FILE, model_path
from tests.engine.tokenizer import corpus

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MODELS = {"smollm2": SMOLLM2_FILE, "gemma3": GEMMA3_FILE}
# fixture combo name -> (add_special, parse_special)
COMBOS = {
    "add_special+parse_special": (True, True),
    "add_special": (True, False),
    "parse_special": (False, True),
    "plain": (False, False),
}


@functools.lru_cache(maxsize=None)
def _items() -> tuple[tuple[str, str], ...]:
    return tuple(corpus.expand(corpus.load()))


@functools.lru_cache(maxsize=None)
def _tokenizer(short: str) -> Tokenizer:
    path = model_path(MODELS[short])
    if path is None:
        pytest.skip(f"model {MODELS[short]} not found (set GGUF_LENS_MODELS_DIR)")
    with open_gguf(path) as g:
        return Tokenizer.from_metadata(g.metadata)


@functools.lru_cache(maxsize=None)
def _fixture(short: str) -> dict[str, Any]:
    path = FIXTURES / f"tokens_{short}.json"
    if not path.exists():
        pytest.skip(f"{path.name} missing (run tools/make_tokenizer_fixtures.py)")
    return json.loads(path.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def _sections() -> dict[str, str]:
    """Entry name -> its corpus section (manual, llama.cpp, tiktoken, hf-tokenizers, hostile, generated)."""
    data = corpus.load()
    return {**{e["name"]: e["source"] for e in data["entries"]}, **{g["name"]: "generated" for g in data["generated"]}}


def _kind(name: str) -> str:
    """The corpus section an entry belongs to."""
    return _sections().get(name, "sweep")


def test_corpus_is_large_and_from_outside_sources() -> None:
    data = corpus.load()
    sources = Counter(e["source"] for e in data["entries"])
    assert sources["llama.cpp"] >= 30 and sources["tiktoken"] >= 20 and sources["hostile"] >= 30
    assert sources["hf-tokenizers"] >= 5
    assert len(_items()) >= 5000
    assert sum(b - a + 1 for a, b in data["sweep"]["ranges"]) > 150_000


@pytest.mark.parametrize("combo", list(COMBOS))
@pytest.mark.parametrize("short", list(MODELS))
def test_corpus_ids_match_llama_cpp(short: str, combo: str) -> None:
    tok, fx = _tokenizer(short), _fixture(short)
    add_special, parse_special = COMBOS[combo]
    k = fx["combos"].index(combo)
    bad: list[str] = []
    total: Counter[str] = Counter()
    for name, text in _items():
        want = corpus.unpack(fx["entries"][name], k)
        got = tok.encode(text, add_special=add_special, parse_special=parse_special)
        total[_kind(name)] += 1
        if not corpus.matches(got, want):
            shown = want[:12] if isinstance(want, list) else want
            bad.append(f"{name} {text[:40]!r}: got {got[:12]}... want {shown}")
    n = len(_items())
    print(f"{short} {combo}: {n - len(bad)}/{n} strings identical to llama.cpp ({dict(total)})")
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:30])


@pytest.mark.parametrize("short", list(MODELS))
def test_detokenize_matches_llama_detokenize(short: str) -> None:
    """llama_detokenize (the low-level call) of llama.cpp's own add_special+parse_special ids, all four flags."""
    tok, fx = _tokenizer(short), _fixture(short)
    n_combos = len(fx["combos"])
    bad = []
    for name, text in _items():
        stored = fx["entries"][name]
        ids = corpus.unpack(stored, 0)
        if not isinstance(ids, list):  # only a digest kept: our ids, once they match llama.cpp's
            ids = tok.encode(text, add_special=True, parse_special=True)
            if not corpus.matches(ids, corpus.unpack(stored, 0)):
                continue  # counted by the ids test
        for j, key in enumerate(fx["detokenize"]):
            got = tok.detokenize(ids, remove_special="remove_special=True" in key,
                                 unparse_special="unparse_special=True" in key)
            if not corpus.bytes_match(got, corpus.unpack(stored, n_combos + j)):
                bad.append(f"{name} {key}: {got[:40]!r}")
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:30])
