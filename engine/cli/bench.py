"""Speed measurement like llama-bench: prompt processing (pp) and token generation (tg) in tokens per second."""
from __future__ import annotations

import resource
import sys
import time
from typing import Any

import numpy as np

from engine.errors import SettingError


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024


def run_bench(
    model_source: str, *, n_prompt: int = 128, n_gen: int = 64, backend: str = "numpy", reps: int = 2,
    gpu_layers: int | None = None, seed: int = 1234, numerics: str = "ggml",
) -> dict[str, Any]:
    """Load the model, then time a prefill of n_prompt random tokens and n_gen single-token steps; best of `reps`."""
    from engine.model import load_model  # noqa: PLC0415

    if not (1 <= n_prompt <= 65536 and 1 <= n_gen <= 65536 and 1 <= reps <= 100):
        raise SettingError("bench: -p and -n must be in 1..65536 and -r in 1..100")
    if gpu_layers is not None and backend == "numpy":
        raise SettingError("--gpu-layers needs the cupy backend")
    t0 = time.perf_counter()
    model = load_model(model_source, backend=backend, gpu_layers=gpu_layers, numerics=numerics)
    load_s = time.perf_counter() - t0
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, model.args.n_vocab, size=n_prompt).tolist()
    n_ctx = max(n_prompt, n_gen) + 1
    pp_best = tg_best = float("inf")
    model.forward(ids[:8], model.new_cache(n_ctx))  # warm-up: first BLAS calls, page faults
    for _ in range(reps):
        cache = model.new_cache(n_ctx)
        t = time.perf_counter()
        model.forward(ids, cache)
        pp_best = min(pp_best, time.perf_counter() - t)
        cache = model.new_cache(n_ctx)
        tok = ids[0]
        t = time.perf_counter()
        for _ in range(n_gen):
            tok = model.greedy_step(tok, cache)
        tg_best = min(tg_best, time.perf_counter() - t)
    return {
        "model": model.name,
        "prompt_tok_s": n_prompt / pp_best,
        "gen_tok_s": n_gen / tg_best,
        "load_s": load_s,
        "peak_rss_mb": peak_rss_mb(),
        "backend": model.backend.name,
        "numerics": model.numerics,
        "device": model.backend.device_name(),
        "gpu_layers": model.gpu_layers,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "notes": list(model.warnings),
    }
