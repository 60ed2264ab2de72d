"""Where a decode step's time goes: compiled kernels against the Python around them, per token.

    .venv/bin/python benchmarks/decode_overhead.py [MODEL ...] [--tokens N] [--top K]

Runs N greedy decode steps (after a short prompt) under cProfile and splits the step time into the time
spent inside numba-compiled functions (the products, the fused norm/attention/GLU calls, the activation
quantizers) and everything else (the Python of engine/runtime/decode_plan.py, argmax, bookkeeping). The
profiler itself slows the Python side a little, so the Python share printed is an upper bound. One JSON line
per model: ms per token in total, in compiled calls and in Python, and the compiled calls per token; with --top K
also the K compiled functions that took longest (ms per token, `top`).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _compiled_names() -> set[tuple[str, int, str]]:
    """(file, line, name) of every numba dispatcher in the engine, as cProfile names them: the module-level ones and
    the copies engine.kernels.variants.specialise made so far (a copy is profiled under its plain function's name;
    call this after the run, since copies are made when first asked for)."""
    import importlib
    import pkgutil

    from numba.core.registry import CPUDispatcher

    import engine.kernels
    import engine.models

    import engine.ops
    import engine.runtime
    from engine.kernels import variants

    keys = set(variants.COPIES)
    for pkg in (engine.kernels, engine.models, engine.ops, engine.runtime):
        for info in pkgutil.walk_packages(pkg.__path__, f"{pkg.__name__}."):
            try:
                mod = importlib.import_module(info.name)
            except ImportError:  # a module for hardware this machine lacks (the GPU's)
                continue
            for value in vars(mod).values():
                if isinstance(value, CPUDispatcher):
                    code = value.py_func.__code__
                    keys.add((code.co_filename, code.co_firstlineno, code.co_name))
    return keys


def measure(name: str, n_tokens: int, top: int = 0) -> dict:
    from engine.model import load_model

    model = load_model(name)
    cache = model.new_cache(512)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    model.forward(prompt, cache)
    cache.commit(prompt)
    tok = 9
    for _ in range(4):  # warm: the plan is built, the pages are in
        tok = model.greedy_step(tok, cache)
    t0 = time.perf_counter()
    for _ in range(n_tokens):
        tok = model.greedy_step(tok, cache)
    plain_ms = (time.perf_counter() - t0) / n_tokens * 1000
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n_tokens):
        tok = model.greedy_step(tok, cache)
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tottime, cumtime, callers)
    compiled = _compiled_names()
    total = sum(v[2] for v in stats.values())
    in_kernels = sum(v[2] for k, v in stats.items() if k in compiled)
    calls = sum(v[1] for k, v in stats.items() if k in compiled)
    model.close()
    slow = sorted((k for k in stats if k in compiled), key=lambda k: -stats[k][2])[:top]
    return {
        "model": name, "tokens": n_tokens, "ms_per_token": round(plain_ms, 2),
        "profiled_ms_per_token": round(total / n_tokens * 1000, 2),
        "compiled_ms_per_token": round(in_kernels / n_tokens * 1000, 2),
        "python_ms_per_token": round((total - in_kernels) / n_tokens * 1000, 2),
        "compiled_calls_per_token": round(calls / n_tokens, 1),
        **({"top": {f"{Path(k[0]).stem}.{k[2]}": round(stats[k][2] / n_tokens * 1000, 3) for k in slow}} if top else {}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--top", type=int, default=0, help="also the K compiled functions that took longest")
    args = ap.parse_args()
    for name in args.models:
        print(json.dumps(measure(name, args.tokens, args.top)), flush=True)


if __name__ == "__main__":
    main()
