"""Prompt and generation speed of GGUF Lens and llama.cpp on the same model, in one run, as ratios.

    .venv/bin/python benchmarks/vs_llamacpp.py [MODEL ...] --llama-python /path/to/llvenv/bin/python

llama.cpp runs through llama-cpp-python (a development tool, built as README.md says) in a subprocess with
the same thread count, prompt length and generation length; GGUF Lens runs `gguf-lens bench` the same way.
Both are best of --reps. Prints one JSON object per model.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LLAMA_BENCH = r"""
import json, resource, sys, time
import numpy as np
from llama_cpp import Llama
path, p, n, reps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
t = time.perf_counter()
llm = Llama(model_path=path, n_ctx=max(p, n) + 16, n_batch=512, n_ubatch=512, n_threads=threads,
            n_threads_batch=threads, verbose=False)
load_s = time.perf_counter() - t
rng = np.random.default_rng(1234)
ids = rng.integers(0, llm.n_vocab(), size=p).tolist()
pp = tg = float("inf")
llm.eval(ids[:8]); llm.reset()
for _ in range(reps):
    llm.reset(); t = time.perf_counter(); llm.eval(ids); pp = min(pp, time.perf_counter() - t)
    llm.reset(); tok = ids[0]; t = time.perf_counter()
    for _ in range(n):
        llm.eval([tok]); tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    tg = min(tg, time.perf_counter() - t)
print(json.dumps({"prompt_tok_s": p / pp, "gen_tok_s": n / tg, "load_s": load_s,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_json(cmd: list[str], env: dict[str, str]) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=["smollm2-135m-instruct"])
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON"), help="a python with llama-cpp-python")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    gguf_lens = [sys.executable, "-m", "engine.cli"]
    for model in args.models:
        path = subprocess.run([*gguf_lens, "fetch", model], capture_output=True, text=True, check=False).stdout.strip() \
            if not model.endswith(".gguf") else model
        ours = run_json([*gguf_lens, "bench", path, "-p", str(args.p), "-n", str(args.n), "-r", str(args.reps), "--json"], env)
        row: dict = {"model": model, "p": args.p, "n": args.n, "threads": args.threads, "gguf_lens": ours}
        if args.llama_python:
            ref = run_json([args.llama_python, "-c", LLAMA_BENCH, path, str(args.p), str(args.n), str(args.reps),
                            str(args.threads)], env)
            row["llama_cpp"] = ref
            row["ratio_prompt"] = round(ours["prompt_tok_s"] / ref["prompt_tok_s"], 3)
            row["ratio_gen"] = round(ours["gen_tok_s"] / ref["gen_tok_s"], 3)
            row["ratio_rss"] = round(ours["peak_rss_mb"] / ref["peak_rss_mb"], 3)
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
