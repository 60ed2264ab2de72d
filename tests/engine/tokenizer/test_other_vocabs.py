"""Every BPE pre-tokenizer llama.cpp has a test vocabulary for, against llama_tokenize on the corpus.

The vocabularies are llama.cpp's own models/ggml-vocab-*.gguf (vocabulary-only files in its source tree; set
LLAMA_CPP_DIR to a checkout, else the vendored copy under /tmp/llsrc is used; skipped when absent). The
expected ids are group digests made by tools/make_tokenizer_vocab_fixtures.py (tests/fixtures/tokens_vocabs.json).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine.gguf.reader import open_gguf
from engine.tokenizer.vocab import Tokenizer
from tests.engine.tokenizer import corpus

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "tokens_vocabs.json"
MODES = {"plain": (False, False), "add_special+parse_special": (True, True)}  # as the tool
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP_DIR", "/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp"))


def _fixture() -> dict:
    if not FIXTURE.exists():
        pytest.skip("tokens_vocabs.json missing (run tools/make_tokenizer_vocab_fixtures.py)")
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _vocab_names() -> list[str]:
    return list(json.loads(FIXTURE.read_text(encoding="utf-8"))["vocabs"]) if FIXTURE.exists() else []


@pytest.mark.parametrize("name", _vocab_names())
def test_pre_tokenizer_matches_llama_cpp(name: str) -> None:
    path = LLAMA_CPP / "models" / f"ggml-vocab-{name}.gguf"
    if not path.exists():
        pytest.skip(f"{path} not found (set LLAMA_CPP_DIR to a llama.cpp checkout)")
    fx = _fixture()
    group = fx["group"]
    texts = [t for _, t in corpus.subset(corpus.load(), fx["max_chars"], fx["sweep_every"])]
    assert len(texts) == fx["n_strings"]
    with open_gguf(path) as g:
        tok = Tokenizer.from_metadata(g.metadata)
    bad = []
    for mode, want in fx["vocabs"][name].items():
        add_special, parse_special = MODES[mode]
        ids = [tok.encode(t, add_special=add_special, parse_special=parse_special) for t in texts]
        got = [corpus.group_digest(ids[k:k + group]) for k in range(0, len(ids), group)]
        bad += [f"{mode}: strings {k * group}-{k * group + group - 1}" for k, (a, b) in enumerate(zip(got, want))
                if a != b]
    print(f"{name}: {len(texts)} strings x {len(fx['vocabs'][name])} modes, {len(bad)} groups differ")
    assert not bad, "\n".join(bad[:20])
