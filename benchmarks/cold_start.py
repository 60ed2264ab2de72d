"""Cold start against warm start: the time to the first generated token with an empty kernel cache and with a full one.

    .venv/bin/python benchmarks/cold_start.py [MODEL ...] [--reps 2] [--json]

For each model (default: both catalog models) a fresh Python process loads the model and generates one token, timed
from the process's first line to that token: first with an empty numba cache (NUMBA_CACHE_DIR, a new folder: what a
first-time user has), then again on the cache that run filled (every later start). Each is the best of --reps runs
(each cold run gets its own empty folder). The added time is cold - warm. A cold run then waits for the late
kernels' background compile (engine.kernels.precompile) before it ends, so that the warm run finds every kernel
cached; when that was done is reported too. Run it on a quiet machine: a compile or a
benchmark beside it makes both slower and the difference meaningless.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = """
import time, json, sys
t0 = time.perf_counter()
from engine.model import load_model
from engine.generate import GenerationConfig, generate
from engine.sampler import SamplerSettings
model = load_model(sys.argv[1])
loaded = time.perf_counter() - t0
ids = model.tokenizer.encode("The capital of France is", add_special=True, parse_special=False)
cfg = GenerationConfig(max_tokens=1, sampler=SamplerSettings(temperature=0.0))
for step in generate(model, ids, cfg):
    break
first = time.perf_counter() - t0
from engine.kernels import precompile
late = precompile.late_status() is not None
precompile.wait_late()  # the late kernels' background compile: done (and cached) before this process ends
print(json.dumps({"first_token_s": first, "load_s": loaded, "all_compiled_s": time.perf_counter() - t0,
                  "late": late}))
"""


def run_once(model: str, cache: Path) -> dict[str, float]:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", PROGRAM, model], env=env, capture_output=True, text=True, cwd=ROOT,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{model}: the run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(model: str, reps: int) -> dict[str, float]:
    cold, warm, whole = [], [], []
    with tempfile.TemporaryDirectory(prefix="gguf-lens-cold-") as tmp:
        for r in range(reps):
            cache = Path(tmp) / f"cache{r}"
            cache.mkdir()
            got = run_once(model, cache)
            cold.append(got["first_token_s"])
            whole.append(got["all_compiled_s"])
            warm.append(run_once(model, cache)["first_token_s"])
    best_cold, best_warm = min(cold), min(warm)
    return {"model": model, "cold_s": round(best_cold, 2), "warm_s": round(best_warm, 2),
            "added_s": round(best_cold - best_warm, 2), "cold_runs": [round(c, 2) for c in cold],
            "warm_runs": [round(w, 2) for w in warm], "all_compiled_runs": [round(w, 2) for w in whole]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(m, max(1, args.reps)) for m in args.models]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows:
            print(f"{r['model']}: first token cold {r['cold_s']:.1f} s, warm {r['warm_s']:.1f} s, "
                  f"added {r['added_s']:.1f} s (best of {len(r['cold_runs'])}; cold {r['cold_runs']}, "
                  f"warm {r['warm_runs']}); every kernel compiled (the late ones in the background) at "
                  f"{r['all_compiled_runs']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
