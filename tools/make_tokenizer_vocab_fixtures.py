"""Fixtures for every pre-tokenizer llama.cpp ships a test vocabulary for: group digests of llama_tokenize's ids.

llama.cpp's source tree holds vocabulary-only GGUF files for its tokenizer tests (models/ggml-vocab-*.gguf:
gpt-2, llama-bpe, qwen2, qwen35, deepseek-coder, deepseek-llm, falcon, starcoder, refact, mpt, command-r, ...),
one per BPE pre-tokenizer. This tokenizes the corpus (tests/fixtures/tokenizer_corpus.json, strings under
3,000 characters: llama.cpp's std::regex path overflows its stack on the long generated ones; a quarter of the
Unicode sweep) with each of them and stores, per group of GROUP strings, the digest of the ids, for two modes (plain, and
add_special+parse_special): a few kilobytes that tests/engine/tokenizer/test_other_vocabs.py compares against
when the vocabulary files are present.

    /tmp/llvenv/bin/python tools/make_tokenizer_vocab_fixtures.py [--llama-cpp DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.engine.tokenizer import corpus as corpus_lib  # noqa: E402

DEFAULT_SRC = Path("/tmp/llsrc/llama_cpp_python-0.3.36/vendor/llama.cpp")
OUT = ROOT / "tests" / "fixtures" / "tokens_vocabs.json"
VOCABS = ["gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-coder", "deepseek-llm", "falcon", "starcoder",
          "refact", "mpt", "command-r"]
MODES = {"plain": (False, False), "add_special+parse_special": (True, True)}
GROUP = 64
MAX_CHARS = 3000
SWEEP_EVERY = 4  # the full sweep runs on SmolLM2 (the same category table); a quarter of it suffices here


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


def main() -> int:
    """Write tests/fixtures/tokens_vocabs.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", type=Path, default=DEFAULT_SRC)
    args = parser.parse_args()
    texts = corpus_lib.subset(corpus_lib.load(), MAX_CHARS, SWEEP_EVERY)
    out: dict = {"group": GROUP, "max_chars": MAX_CHARS, "sweep_every": SWEEP_EVERY, "n_strings": len(texts),
                 "modes": list(MODES),
                 "vocabs": {}}
    for name in VOCABS:
        path = args.llama_cpp / "models" / f"ggml-vocab-{name}.gguf"
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        vocab = llm._model.vocab
        per_mode = {}
        for mode, (add_special, parse_special) in MODES.items():
            ids = [tokenize(vocab, t.encode("utf-8", errors="surrogatepass"), add_special, parse_special)
                   for _, t in texts]
            per_mode[mode] = [corpus_lib.group_digest(ids[k:k + GROUP]) for k in range(0, len(ids), GROUP)]
        out["vocabs"][name] = per_mode
        print(f"{name}: {len(texts)} strings", file=sys.stderr)
    OUT.write_text(json.dumps(out, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
