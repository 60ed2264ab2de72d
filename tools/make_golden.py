"""Make the golden fixtures that tests compare against: llama.cpp's token ids, logits and perplexity.

Run with a Python that has llama-cpp-python (a development tool, never a runtime dependency), built from
its sdist as README.md's "Golden fixtures" section says:

    /path/to/llvenv/bin/python tools/make_golden.py --models-dir DIR [--isa avx2]

--isa avx2 takes a llama-cpp-python built with AVX2 flags only (no AVX-512; README.md, "Golden fixtures") and
writes golden_<model>_avx2.*: that build's numbers, which differ from the AVX-512 build's in the last bits
(engine.kernels.isa). The build's own system info is checked against --isa and stored in the JSON.

For each catalog model it tokenizes tests/fixtures/prose.txt as a whole document (BOS when the model's
metadata adds one), runs every position through llama.cpp with the default f16 KV cache and again with an
f32 cache, and stores per position the top-K log-probabilities (K=128, full softmax over the whole
vocabulary), plus the perplexity of tokens 2..n. --long does Gemma 3 alone over tests/fixtures/long_prose.txt (a part of llama.cpp's own tools/completion/README.md,
MIT): 1,6xx tokens, past its sliding window and in four of llama.cpp's 512-token batches. Storing top-K instead of
whole logit rows keeps the files
small (a 262,144-entry vocabulary would be 1 MB per position); the KL divergence is then computed with the
probability mass outside the top-K lumped into one bucket, which can only under-estimate by a hair.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TOP_K = 128
MODELS = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def run(path: Path, text: str, add_bos: bool, cache_type: int, threads: int, n_ctx: int = 1024) -> tuple[list[int], np.ndarray]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, logits_all=True, n_threads=threads,
                verbose=False, type_k=cache_type, type_v=cache_type)
    ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
    return ids, logits


def build_isa() -> tuple[str, str]:
    """('avx512' or 'avx2' or 'other', the system-info line) of the llama.cpp this Python loads."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    isa = "avx512" if "AVX512 = 1" in info else "avx2" if "AVX2 = 1" in info else "other"
    return isa, info.strip()


def check_isa(wanted: str) -> str:
    """The system-info line, after checking that the llama.cpp build is the `wanted` one (else SystemExit)."""
    isa, info = build_isa()
    if isa != wanted:
        raise SystemExit(f"this llama.cpp is an {isa} build, not {wanted}: {info}")
    return info


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", required=True, type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", choices=("avx512", "avx2"), default="avx512",
                    help="the build the llama.cpp in use must be; avx2 writes golden_<model>_avx2.*")
    ap.add_argument("--long", action="store_true",
                    help="Gemma 3 over tests/fixtures/long_prose.txt (1,6xx tokens: past its 512-token sliding window "
                         "three times and four 512-token batches), context 2048, F16 cache: golden_gemma3_long.*")
    args = ap.parse_args()
    text = (FIXTURES / ("long_prose.txt" if args.long else "prose.txt")).read_text(encoding="utf-8")
    system_info = check_isa(args.isa)
    suffix = ("" if args.isa == "avx512" else f"_{args.isa}") + ("_long" if args.long else "")
    import llama_cpp

    for key, filename in MODELS.items():
        if args.long and key != "gemma3":  # the model with a sliding window
            continue
        path = args.models_dir / filename
        if not path.exists():
            print(f"skip {key}: {path} missing", file=sys.stderr)
            continue
        from gguf import GGUFReader

        add_bos = bool(GGUFReader(str(path)).fields["tokenizer.ggml.add_bos_token"].contents())
        out: dict[str, np.ndarray] = {}
        summary: dict[str, object] = {"model": filename, "llama_cpp_python": llama_cpp.__version__, "top_k": TOP_K,
                                      "add_bos": add_bos}
        for tag, ctype in (("f16", GGML_TYPE_F16),) if args.long else (("f16", GGML_TYPE_F16), ("f32", GGML_TYPE_F32)):
            ids, logits = run(path, text, add_bos, ctype, args.threads, 2048 if args.long else 1024)
            logp = log_softmax(logits)
            top = np.argsort(-logp, axis=-1, kind="stable")[:, :TOP_K]
            out[f"{tag}_top_ids"] = top.astype(np.int32)
            out[f"{tag}_top_logp"] = np.take_along_axis(logp, top, axis=-1).astype(np.float32)
            nll = -logp[np.arange(len(ids) - 1), np.asarray(ids[1:])]
            summary[f"{tag}_ppl"] = math.exp(float(nll.mean()))
            out["ids"] = np.asarray(ids, dtype=np.int32)
        summary["n_tokens"] = int(out["ids"].size)
        if args.isa != "avx512" or args.long:  # the AVX-512 files of the short prose stay as they were made
            summary["system_info"] = system_info
        np.savez_compressed(FIXTURES / f"golden_{key}{suffix}.npz", **out)
        (FIXTURES / f"golden_{key}{suffix}.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(key, json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
