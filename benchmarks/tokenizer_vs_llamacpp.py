"""Tokenizer speed against llama.cpp on degenerate and ordinary input, side by side; prints the ratios.

    .venv/bin/python benchmarks/tokenizer_vs_llamacpp.py --llama-python /tmp/llvenv/bin/python [MODEL ...]

MODEL: catalog names or .gguf paths (default: both catalog models). For each model and case the same text is
tokenized (add_special, parse_special) by GGUF Lens's Tokenizer.encode in this process and by llama.cpp's
low-level `llama_tokenize` in a child process under the llama-cpp-python interpreter (this same file with
--llama-side); the best of --reps runs counts, after one warm-up run (which compiles or loads the numba
merge of long words on our side; its time is printed as "first"). The ids are compared too. Ratios above 1
mean GGUF Lens is slower. On a shared machine the numbers move; run it more than once.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "x * 1M": lambda: "x" * 1_000_000,
    "spaces * 1M": lambda: " " * 1_000_000,
    "newlines * 1M": lambda: "\n" * 1_000_000,
    "ab * 500k": lambda: "ab" * 500_000,
    "CJK * 300k": lambda: "字" * 300_000,
    "prose 77 kB": lambda: (ROOT / "tests" / "fixtures" / "prose.txt").read_text(encoding="utf-8") * 50,
}


def _llama_side(model: str, reps: int) -> None:
    """Child process: time llama_tokenize on every case, print JSON {case: [seconds, n_ids, ids_hash]}."""
    import hashlib  # noqa: PLC0415

    import llama_cpp  # noqa: PLC0415

    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    vocab = llm._model.vocab
    out = {}
    for name, make in CASES.items():
        raw = make().encode("utf-8")
        best, ids = float("inf"), []
        for _ in range(reps):
            size = len(raw) + 8
            arr = (llama_cpp.llama_token * size)()
            t0 = time.perf_counter()
            n = llama_cpp.llama_tokenize(vocab, raw, len(raw), arr, size, True, True)
            best = min(best, time.perf_counter() - t0)
            ids = list(arr[:n])
        out[name] = [best, len(ids), hashlib.sha1(repr(ids).encode()).hexdigest()[:12]]
    print(json.dumps(out))


def _ours(model: str, reps: int) -> dict[str, list]:
    """Time Tokenizer.encode on every case: {case: [best seconds, first seconds, n_ids, ids_hash]}."""
    import hashlib  # noqa: PLC0415

    sys.path.insert(0, str(ROOT))
    from engine.gguf import open_gguf  # noqa: PLC0415
    from engine.tokenizer.vocab import Tokenizer  # noqa: PLC0415

    with open_gguf(model) as g:
        tok = Tokenizer.from_metadata(g.metadata)
    out = {}
    for name, make in CASES.items():
        text = make()
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special=True, parse_special=True)
        first = time.perf_counter() - t0
        best = first
        for _ in range(reps):
            t0 = time.perf_counter()
            ids = tok.encode(text, add_special=True, parse_special=True)
            best = min(best, time.perf_counter() - t0)
        out[name] = [best, first, len(ids), hashlib.sha1(repr(ids).encode()).hexdigest()[:12]]
    return out


def main() -> int:
    """Print one table per model: llama.cpp's time, ours, the ratio, and whether the ids agree."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["smollm2-135m-instruct", "gemma3-270m"])
    parser.add_argument("--llama-python", default="/tmp/llvenv/bin/python")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--llama-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llama_side:
        _llama_side(args.models[0], args.reps)
        return 0
    sys.path.insert(0, str(ROOT))
    from engine.catalog import resolve_model  # noqa: PLC0415

    for model in args.models:
        path = str(resolve_model(model))
        child = subprocess.run([args.llama_python, __file__, "--llama-side", "--reps", str(args.reps), path],
                               capture_output=True, text=True, check=True)
        theirs = json.loads(child.stdout.strip().splitlines()[-1])
        ours = _ours(path, args.reps)
        print(f"\n{Path(path).name}")
        print(f"  {'case':<14} {'llama.cpp':>10} {'ours':>10} {'first':>8} {'ratio':>7}  ids")
        for name in CASES:
            t_l, n_l, h_l = theirs[name]
            t_o, first, n_o, h_o = ours[name]
            same = "same" if (n_l, h_l) == (n_o, h_o) else f"DIFFER ({n_o} vs {n_l})"
            print(f"  {name:<14} {t_l:>9.3f}s {t_o:>9.3f}s {first:>7.2f}s {t_o / t_l:>6.2f}x  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
