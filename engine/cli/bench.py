"""Speed measurement like llama-bench: prompt processing (pp) and token generation (tg) in tokens per second.

A decoder-only model's pp is one forward pass over the prompt, its tg single-token steps after one token. An
encoder-decoder model (T5) reads its prompt with the encoder: pp is llama_encode of -p tokens, tg -n decoder
steps from the decoder start token against that encoding (each step also reads it through cross-attention);
the result says which (`prompt_phase`).
"""
from __future__ import annotations

import resource
import sys
import time
from typing import Any

import numpy as np

from engine.errors import SettingError


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB. On Linux the high-water mark of its own memory (VmHWM):
    getrusage's ru_maxrss keeps a parent's across fork and exec (a benchmark that wrote a 1.1B file in-process gave
    every child the writer's peak)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
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
    seq2seq = bool(getattr(model.net, "is_encoder_decoder", False))
    waited: list[float] = []
    pp_best, tg_best = (_time_encoder_decoder if seq2seq else _time_decoder)(model, ids, n_gen, reps, waited)
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
        "prompt_phase": "encoder" if seq2seq else "decoder",
        **_isa(model),
        "notes": list(model.warnings),
        "kernels_wait_s": round(sum(waited), 2),
    }


def _settle(waited: list[float]) -> None:
    """Wait for the late kernels a first start compiles in a background process (engine.kernels.precompile) before
    anything is timed: timed beside that compile, both engines' numbers would be the machine's (a 2-core prompt ran
    at half speed), and until it is done the tokens take the slower first-start path. The wait goes to
    `kernels_wait_s`; benchmarks/cold_start.py measures a first start."""
    from engine.kernels import precompile  # noqa: PLC0415

    if precompile.late_status() is not None:
        t = time.perf_counter()
        precompile.wait_late()
        waited.append(time.perf_counter() - t)


def _isa(model: Any) -> dict[str, str]:  # noqa: ANN401
    """The kernels' target and whose bits the ggml numerics give there (engine.kernels.isa)."""
    if model.numerics != "ggml" or model.backend.is_device:
        return {}
    from engine.kernels.isa import describe  # noqa: PLC0415

    info = describe()
    return {"isa": info.target, "bits_of": info.bits_of}


def _time_decoder(model: Any, ids: list[int], n_gen: int, reps: int,  # noqa: ANN401
                  waited: list[float]) -> tuple[float, float]:
    """Best seconds of a prefill of `ids` and of n_gen single-token steps from an empty cache."""
    n_ctx = max(len(ids), n_gen) + 1
    pp_best = tg_best = float("inf")
    model.forward(ids[:8], model.new_cache(n_ctx))  # warm-up: first BLAS calls, page faults
    model.forward(ids, model.new_cache(n_ctx))  # a long prompt's kernels too (it may start the late helper)
    _settle(waited)
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
    return pp_best, tg_best


def _time_encoder_decoder(model: Any, ids: list[int], n_gen: int, reps: int,  # noqa: ANN401
                          waited: list[float]) -> tuple[float, float]:
    """Best seconds of the encoder on `ids` (llama_encode) and of n_gen greedy decoder steps against that encoding."""
    net = model.net
    if len(ids) > net.args.n_ctx:  # llama_encode needs the whole input in one ubatch, at most n_ctx tokens
        raise SettingError(f"bench: -p {len(ids)}: the encoder of this {model.arch} model reads at most its context "
                           f"of {net.args.n_ctx} tokens at once")
    start = net.decoder_start_token
    model.gguf.check_unchanged()
    cache = net.new_cache(n_gen + 1)  # warm-up: first BLAS calls, page faults
    net.encode(ids[:8], cache)
    model.greedy_step(start, cache)
    _settle(waited)
    pp_best = tg_best = float("inf")
    for _ in range(reps):
        cache = net.new_cache(n_gen + 1)
        t = time.perf_counter()
        net.encode(ids, cache)
        pp_best = min(pp_best, time.perf_counter() - t)
        tok = start
        t = time.perf_counter()
        for _ in range(n_gen):
            tok = model.greedy_step(tok, cache)
        tg_best = min(tg_best, time.perf_counter() - t)
    return pp_best, tg_best
