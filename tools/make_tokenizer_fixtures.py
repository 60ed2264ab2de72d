"""Make golden tokenizer fixtures from llama.cpp (through llama-cpp-python's low-level calls) for tests/engine/tokenizer.

Run with a Python that has llama-cpp-python installed (development only, not a dependency of GGUF Lens):

    /tmp/llvenv/bin/python tools/make_tokenizer_fixtures.py [--models-dir DIR]

For each model it tokenizes every string of tests/fixtures/tokenizer_corpus.json (expanded by
tests/engine/tokenizer/corpus.py: literal strings, generated long inputs, the Unicode sweep) with
`llama_tokenize` for every combination of add_special and parse_special, and records: the ids (inline when
short, else a digest), `llama_detokenize` of the add_special+parse_special ids for the four remove_special x
unparse_special combinations (hex or digest; the low-level call, with a buffer as large as it asks for),
`llama_token_to_piece` (hex, special=True and special=False) for a sample of ids, the token attributes that
are not plain NORMAL, the EOG ids, and BOS/EOS/add_bos/add_eos.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from importlib import metadata as importlib_metadata
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engine.tokenizer import corpus as corpus_lib  # noqa: E402

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

# (name, add_special, parse_special), in the order entries store them
COMBOS = [
    ("add_special+parse_special", True, True),
    ("add_special", True, False),
    ("parse_special", False, True),
    ("plain", False, False),
]
# (remove_special, unparse_special) of the llama_detokenize outputs, in the order entries store them
DETOK = [(False, False), (False, True), (True, False), (True, True)]


def token_to_piece(vocab, token: int, special: bool) -> bytes:
    """llama_token_to_piece with a buffer that grows until the piece fits."""
    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, size, 0, special)
        if n < 0:
            size = -n + 1
            continue
        return buf.raw[:n]


def tokenize(vocab, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
    """llama_tokenize with a buffer as large as it asks for."""
    size = len(text) + 8
    while True:
        arr = (llama_cpp.llama_token * size)()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), arr, size, add_special, parse_special)
        if n < 0:
            size = -n
            continue
        return list(arr[:n])


def detokenize(vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
    """llama_detokenize with a buffer that grows until the text fits."""
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 256 + 64 * len(ids)
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, remove_special, unparse_special)
        if n < 0:
            size = -n + 1
            continue
        return buf.raw[:n]


def token_attrs(vocab, n_vocab: int) -> tuple[dict[str, int], list[int]]:
    """The tokens whose attribute is not NORMAL (id -> attribute) and the end-of-generation tokens."""
    attrs: dict[str, int] = {}
    eog: list[int] = []
    for t in range(n_vocab):
        a = int(llama_cpp.llama_vocab_get_attr(vocab, t))
        if a != llama_cpp.LLAMA_TOKEN_ATTR_NORMAL:
            attrs[str(t)] = a
        if llama_cpp.llama_vocab_is_eog(vocab, t):
            eog.append(t)
    return attrs, eog


def make_fixture(model_path: Path, items: list[tuple[str, str]]) -> dict:
    """Tokenize the corpus with llama.cpp and collect what the tests compare against."""
    llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    # name -> packed [ids of the four COMBOS..., llama_detokenize of the first combo's ids for the four DETOK]
    entries = {}
    seen: set[int] = set()
    for name, text in items:
        raw = text.encode("utf-8", errors="surrogatepass")
        stored = []
        for _, add_special, parse_special in COMBOS:
            toks = tokenize(vocab, raw, add_special, parse_special)
            stored.append(corpus_lib.store_ids(toks))
            if len(toks) <= corpus_lib.INLINE_MAX:
                seen.update(toks)
            if len(stored) == 1:
                base = toks
        for remove_special, unparse_special in DETOK:
            stored.append(corpus_lib.store_bytes(detokenize(vocab, base, remove_special, unparse_special)))
        entries[name] = corpus_lib.pack(stored)

    sample = set(range(min(n_vocab, 600))) | set(range(0, n_vocab, 97)) | seen
    sample |= set(range(max(0, n_vocab - 64), n_vocab))
    pieces = {
        str(t): [token_to_piece(vocab, t, True).hex(), token_to_piece(vocab, t, False).hex()]
        for t in sorted(sample)
    }

    attrs, eog = token_attrs(vocab, n_vocab)

    def opt(token: int) -> int | None:
        return None if token < 0 else int(token)

    return {
        "model": model_path.name,
        "llama_cpp_python": importlib_metadata.version("llama-cpp-python"),
        "n_vocab": n_vocab,
        "bos": opt(llama_cpp.llama_vocab_bos(vocab)),
        "eos": opt(llama_cpp.llama_vocab_eos(vocab)),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "eog": eog,
        "attrs_not_normal": attrs,
        "pieces": pieces,
        "combos": [c[0] for c in COMBOS],
        "detokenize": [f"remove_special={rs},unparse_special={us}" for rs, us in DETOK],
        "entries": entries,
    }


def main() -> int:
    """Write tests/fixtures/tokens_<model>.json for every model found."""
    default_dir = os.environ.get("GGUF_LENS_MODELS_DIR", "/work/models")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", default=default_dir)
    args = parser.parse_args()

    items = list(corpus_lib.expand(corpus_lib.load()))
    wrote = 0
    for short, filename in MODELS.items():
        path = Path(args.models_dir) / filename
        if not path.exists():
            print(f"skip {short}: {path} not found", file=sys.stderr)
            continue
        fixture = make_fixture(path, items)
        out = ROOT / "tests" / "fixtures" / f"tokens_{short}.json"
        out.write_text(json.dumps(fixture, ensure_ascii=False, indent=None) + "\n", encoding="utf-8")
        print(f"wrote {out} ({len(fixture['entries'])} entries, {len(fixture['pieces'])} pieces)")
        wrote += 1
    return 0 if wrote else 1


if __name__ == "__main__":
    sys.exit(main())
