"""Make golden tokenizer fixtures from llama.cpp (through llama-cpp-python) for tests/engine/test_tokenizer.py.

Run with a Python that has llama-cpp-python installed (development only, not a dependency of GGUF Lens):

    /work/llvenv/bin/python tools/make_tokenizer_fixtures.py [--models-dir DIR]

For each model it tokenizes every entry of tests/fixtures/tokenizer_corpus.json with every combination of
add_special (llama_tokenize's add_special, which llama-cpp-python calls add_bos) and parse_special, and
records: the ids, llama_detokenize of those ids (hex, for the four remove_special x unparse_special
combinations), llama_token_to_piece (hex, special=True and special=False) for a sample of ids, the token
attributes that are not plain NORMAL, the EOG ids, and BOS/EOS/add_bos/add_eos.
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
CORPUS = ROOT / "tests" / "fixtures" / "tokenizer_corpus.json"

MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}

# (key in the fixture, add_special, parse_special)
COMBOS = [
    ("add_special+parse_special", True, True),
    ("add_special", True, False),
    ("parse_special", False, True),
    ("plain", False, False),
]


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


def make_fixture(model_path: Path, corpus: list[dict]) -> dict:
    """Tokenize the corpus with llama.cpp and collect what the tests compare against."""
    llm = llama_cpp.Llama(model_path=str(model_path), vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

    entries = []
    seen: set[int] = set()
    for item in corpus:
        text = item["text"]
        ids = {}
        for key, add_special, parse_special in COMBOS:
            # Llama.tokenize(text, add_bos, special) is llama_tokenize(..., add_special, parse_special)
            toks = llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)
            ids[key] = [int(t) for t in toks]
            seen.update(ids[key])
        base = ids["add_special+parse_special"]
        detok = {
            f"remove_special={rs},unparse_special={us}": detokenize(vocab, base, rs, us).hex()
            for rs in (False, True)
            for us in (False, True)
        }
        entries.append({"name": item["name"], "text": text, "ids": ids, "detokenize": detok})

    sample = set(range(min(n_vocab, 600))) | set(range(0, n_vocab, 97)) | seen
    sample |= set(range(max(0, n_vocab - 64), n_vocab))
    pieces = {
        str(t): [token_to_piece(vocab, t, True).hex(), token_to_piece(vocab, t, False).hex()]
        for t in sorted(sample)
    }

    attrs = {}
    eog = []
    for t in range(n_vocab):
        a = int(llama_cpp.llama_vocab_get_attr(vocab, t))
        if a != llama_cpp.LLAMA_TOKEN_ATTR_NORMAL:
            attrs[str(t)] = a
        if llama_cpp.llama_vocab_is_eog(vocab, t):
            eog.append(t)

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
        "entries": entries,
    }


def main() -> int:
    """Write tests/fixtures/tokens_<model>.json for every model found."""
    default_dir = os.environ.get("GGUF_LENS_MODELS_DIR", "/work/models")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", default=default_dir)
    args = parser.parse_args()

    corpus = json.loads(CORPUS.read_text(encoding="utf-8"))["entries"]
    wrote = 0
    for short, filename in MODELS.items():
        path = Path(args.models_dir) / filename
        if not path.exists():
            print(f"skip {short}: {path} not found", file=sys.stderr)
            continue
        fixture = make_fixture(path, corpus)
        out = ROOT / "tests" / "fixtures" / f"tokens_{short}.json"
        out.write_text(json.dumps(fixture, ensure_ascii=False, indent=None) + "\n", encoding="utf-8")
        print(f"wrote {out} ({len(fixture['entries'])} entries, {len(fixture['pieces'])} pieces)")
        wrote += 1
    return 0 if wrote else 1


if __name__ == "__main__":
    sys.exit(main())
