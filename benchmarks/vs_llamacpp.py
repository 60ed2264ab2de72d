"""Prompt and generation speed of GGUF Lens and llama.cpp on the same model, in one run, as ratios.

    .venv/bin/python benchmarks/vs_llamacpp.py [MODEL ...] [--synthetic-1b] --llama-python /path/to/llvenv/bin/python

llama.cpp runs through llama-cpp-python (a development tool, built as README.md says) in a subprocess with
the same thread count, prompt length and generation length; GGUF Lens runs `gguf-lens bench` (of this
checkout) the same way. Both are best of --reps; with --rounds N both run N times, taking turns, and each
keeps its best (a slow spell of a shared machine then falls on both). Prints one JSON object per model: tokens/s
of each, the ratios (ours / llama.cpp), and each one's peak resident memory against the file size.

--synthetic-1b adds issue 12's 1.1B llama in Q4_K_M (Llama-3.2-1B shapes, random weights), written on the
fly by benchmarks/synthetic_1b.py into /tmp (about 2 minutes on 2 cores the first time, then reused);
--moe adds a Mixture-of-Experts model with Qwen3-30B-A3B's widths and a few layers (benchmarks/synthetic_moe.py);
--gpt-oss one with gpt-oss-20b's widths in MXFP4_MOE (benchmarks/synthetic_gpt_oss.py).
--isa avx2 runs both as on an AVX2-only CPU (benchmarks/isa.py: numba compiles for a Haswell-class target;
--llama-python must be a build with AVX2 flags only, which is checked); --exact also compares both engines' logits on
the golden prose's first 128 tokens (max |difference|, rows equal, KLD). --flash-attn on runs both with flash
attention (llama.cpp's ggml_flash_attn_ext; GGUF Lens's --flash-attn on), off (default) both without; --cache-type
Q8_0 / Q4_0 both with K and V rows of that type (llama.cpp's -ctk / -ctv; with --flash-attn on).
--gen-after-prompt times generation after the prompt (at depth -p, as llama-bench -d) instead of from an empty
context. Prompts run in llama.cpp's batches of 512 in both engines (engine.generate.UBATCH, n_ubatch=512).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

LLAMA_BENCH = r"""
import json, resource, sys, time
import numpy as np
import llama_cpp
from llama_cpp import Llama
path, p, n, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
flash = sys.argv[6] == "on"
after = sys.argv[7] == "after"  # generation continues the prompt's context (at depth p), as llama-bench -d p
kv = {"F16": {}, "Q8_0": {"type_k": 8, "type_v": 8}, "Q4_0": {"type_k": 2, "type_v": 2}}[sys.argv[8]]  # -ctk/-ctv
t = time.perf_counter()
llm = Llama(model_path=path, n_ctx=(p + n if after else max(p, n)) + 16, n_batch=512, n_ubatch=512, n_threads=threads,
            n_threads_batch=threads, verbose=False, flash_attn=flash, **kv)
load_s = time.perf_counter() - t
rng = np.random.default_rng(1234)
ids = rng.integers(0, llm.n_vocab(), size=p).tolist()
pp = tg = float("inf")
n_vocab = llm.n_vocab()

def last_logits():  # llm.scores stays zero in llama-cpp-python 0.3.36: read the context's logits
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(n_vocab,))

llm.eval(ids[:8]); llm.reset()
for _ in range(reps):
    llm.reset(); t = time.perf_counter(); llm.eval(ids); pp = min(pp, time.perf_counter() - t)
    if not after:
        llm.reset()
    tok = ids[0]; t = time.perf_counter()
    for _ in range(n):
        llm.eval([tok]); tok = int(np.argmax(last_logits()))
    tg = min(tg, time.perf_counter() - t)
hwm = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")]  # not ru_maxrss: a parent's
print(json.dumps({"prompt_tok_s": p / pp, "gen_tok_s": n / tg, "load_s": load_s,  # peak survives fork and exec
                  "peak_rss_mb": (hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024}))
"""


def run_json(cmd: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _best(runs: list[dict]) -> dict:
    """One engine's runs as one: the fastest prompt and generation, the lowest peak memory (a run that compiled
    kernels, after an edit to the engine, also held LLVM's memory for it)."""
    best = dict(runs[0])
    best["prompt_tok_s"] = max(r["prompt_tok_s"] for r in runs)
    best["gen_tok_s"] = max(r["gen_tok_s"] for r in runs)
    best["peak_rss_mb"] = min(r["peak_rss_mb"] for r in runs)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="catalog names or .gguf paths (default smollm2-135m-instruct)")
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON"), help="a python with llama-cpp-python")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1,
                    help="run both engines this many times, taking turns, and keep each one's best (a noisy machine)")
    ap.add_argument("--synthetic-1b", action="store_true",
                    help="also the 1.1B llama Q4_K_M with random weights (written to /tmp on the first run)")
    ap.add_argument("--synthetic-vocab", type=int, default=None,
                    help="its vocabulary (default 49152: 1.07B parameters; 128256 is Llama 3.2 1B's own)")
    ap.add_argument("--moe", action="store_true",
                    help="also a qwen3moe with Qwen3-30B-A3B's widths, 128 experts, top 8 (written to /tmp on the first run)")
    ap.add_argument("--moe-layers", type=int, default=4)
    ap.add_argument("--gpt-oss", action="store_true",
                    help="also a gpt-oss with gpt-oss-20b's widths in MXFP4_MOE (written to /tmp on the first run)")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native",
                    help="avx2: numba targets a Haswell-class CPU and llama.cpp must be an AVX2-only build")
    ap.add_argument("--exact", action="store_true", help="also compare the logits on the golden prose")
    ap.add_argument("--gen-after-prompt", action="store_true",
                    help="both engines time generation after the prompt (at position -p, llama-bench -d), not at 0")
    ap.add_argument("--cache-type", choices=["F16", "Q8_0", "Q4_0"], default="F16", type=str.upper,
                    help="both engines' K and V cache rows (llama.cpp's -ctk/-ctv; a quantized V needs --flash-attn on)")
    ap.add_argument("--flash-attn", choices=["on", "off"], default="off",
                    help="both engines with flash attention on (llama-cli's -fa auto on a CPU) or off (default)")
    args = ap.parse_args()
    models = list(args.models) or ([] if args.synthetic_1b or args.moe or args.gpt_oss else ["smollm2-135m-instruct"])
    t = str(args.threads)
    # the same thread count everywhere: BLAS (prefill tiles), numba's kernels, llama.cpp's n_threads;
    # PYTHONPATH: `gguf-lens bench` runs this checkout's engine
    env = dict(os.environ, OMP_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t, MKL_NUM_THREADS=t, NUMBA_NUM_THREADS=t,
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    gguf_lens = [sys.executable, "-m", "engine.cli"]
    from isa import exactness, isa_env, llama_isa  # noqa: PLC0415

    env = isa_env(args.isa, env)
    ref_isa = llama_isa(args.llama_python, env) if args.llama_python else ""
    if args.llama_python and args.isa == "avx2" and ref_isa != "avx2":
        raise SystemExit(f"--isa avx2: {args.llama_python} runs a {ref_isa} build of llama.cpp; build one with AVX2 "
                         "flags only (README.md, 'Golden fixtures and benchmarks')")
    paths: list[tuple[str, str]] = []
    for model in models:
        path = model if model.endswith(".gguf") else subprocess.run(
            [*gguf_lens, "fetch", model], capture_output=True, text=True, check=False, cwd=ROOT, env=env).stdout.strip()
        paths.append((model, path))
    if args.synthetic_1b:
        from synthetic_1b import Shape1B, ensure_1b  # noqa: PLC0415

        shape = Shape1B(n_vocab=args.synthetic_vocab or Shape1B.n_vocab)
        path = ensure_1b(None, shape, threads=os.cpu_count() or 2, llama_python=args.llama_python,
                         log=lambda m: print(m, file=sys.stderr, flush=True))
        paths.append((f"synthetic-llama-1.1b-q4_k_m-v{shape.n_vocab}", str(path)))
    if args.moe:
        from synthetic_moe import ShapeMoE, ensure_moe  # noqa: PLC0415

        shape_moe = ShapeMoE(n_layers=args.moe_layers)
        path = ensure_moe(None, shape_moe, threads=os.cpu_count() or 2, llama_python=args.llama_python,
                          log=lambda m: print(m, file=sys.stderr, flush=True))
        paths.append((f"synthetic-qwen3moe-30b-a3b-shape-L{shape_moe.n_layers}-q4_k_m", str(path)))
    if args.gpt_oss:
        from synthetic_gpt_oss import ShapeOss, ensure_oss  # noqa: PLC0415

        shape_oss = ShapeOss(n_layers=args.moe_layers)
        path = ensure_oss(None, shape_oss, threads=os.cpu_count() or 2, llama_python=args.llama_python,
                          log=lambda m: print(m, file=sys.stderr, flush=True))
        paths.append((f"synthetic-gpt-oss-20b-shape-L{shape_oss.n_layers}-mxfp4_moe", str(path)))
    for model, path in paths:
        file_mb = Path(path).stat().st_size / 2**20
        ours_cmd = [*gguf_lens, "bench", path, "-p", str(args.p), "-n", str(args.n), "-r", str(args.reps), "--json",
                    "--flash-attn", args.flash_attn, *(["--gen-after-prompt"] if args.gen_after_prompt else []),
                    *(["--cache-type", args.cache_type] if args.cache_type != "F16" else [])]
        ref_cmd = [args.llama_python, "-c", LLAMA_BENCH, path, str(args.p), str(args.n), str(args.reps), t,
                   args.flash_attn, "after" if args.gen_after_prompt else "empty", args.cache_type]
        ours_runs, ref_runs = [], []
        for _ in range(args.rounds):  # the engines take turns: a slow spell of the machine falls on both
            ours_runs.append(run_json(ours_cmd, env))
            if args.llama_python:
                ref_runs.append(run_json(ref_cmd, env))
        ours = _best(ours_runs)
        row: dict = {"model": model, "file_mb": round(file_mb, 1), "p": args.p, "n": args.n, "threads": args.threads,
                     "flash_attn": args.flash_attn, "cache_type": args.cache_type, "gen_after_prompt": args.gen_after_prompt, "isa": args.isa, "llama_cpp_build": ref_isa, "rounds": args.rounds, "gguf_lens": ours,
                     "rss_vs_file": round(ours["peak_rss_mb"] / file_mb, 3)}
        if args.llama_python:
            ref = _best(ref_runs)
            row["llama_cpp"] = ref
            row["llama_cpp_rss_vs_file"] = round(ref["peak_rss_mb"] / file_mb, 3)
            row["ratio_prompt"] = round(ours["prompt_tok_s"] / ref["prompt_tok_s"], 3)
            row["ratio_gen"] = round(ours["gen_tok_s"] / ref["gen_tok_s"], 3)
            row["ratio_rss"] = round(ours["peak_rss_mb"] / ref["peak_rss_mb"], 3)
            if args.exact:
                row["logits"] = exactness(gguf_lens, args.llama_python, path, env, args.threads)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
