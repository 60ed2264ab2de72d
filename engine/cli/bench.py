"""Speed measurement like llama-bench: prompt processing (pp) and token generation (tg) in tokens per second.

A decoder-only model's pp is one forward pass over the prompt, its tg single-token steps after one token. An
encoder-decoder model (T5) reads its prompt with the encoder: pp is llama_encode of -p tokens, tg -n decoder
steps from the decoder start token against that encoding (each step also reads it through cross-attention);
the result says which (`prompt_phase`).

With interventions (--lora, --control-vector) the timed model runs with them, and a decoder-only model is timed
without them too in the same process, the two interleaved repetition by repetition (a machine busy for a while slows
both alike): `gen_tok_s` and `prompt_tok_s` are with them, `plain_gen_tok_s` and `plain_prompt_tok_s` without, and
`interventions` names them.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from engine.cli.options import add_numerics, add_steering
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
    gpu_layers: int | None = None, seed: int = 1234, numerics: str = "ggml", lora: Sequence[str] = (),
    control_vectors: Sequence[str] = (), flash_attn: str = "off", gen_after_prompt: bool = False,
) -> dict[str, Any]:
    """Load the model, then time a prefill of n_prompt random tokens and n_gen single-token steps; best of `reps`.
    `lora` and `control_vectors`: 'FILE[:SCALE]' specs, as the CLI's --lora and --control-vector take them.
    `gen_after_prompt`: the steps continue the prompt's cache (generation at depth n_prompt, as llama-bench -d),
    instead of starting from an empty one."""
    from engine.model import load_model  # noqa: PLC0415

    if not (1 <= n_prompt <= 65536 and 1 <= n_gen <= 65536 and 1 <= reps <= 100):
        raise SettingError("bench: -p and -n must be in 1..65536 and -r in 1..100")
    if gpu_layers is not None and backend == "numpy":
        raise SettingError("--gpu-layers needs the cupy backend")
    t0 = time.perf_counter()
    model = load_model(model_source, backend=backend, gpu_layers=gpu_layers, numerics=numerics, flash_attn=flash_attn)
    load_s = time.perf_counter() - t0
    _check_context(model, n_prompt + n_gen if gen_after_prompt else max(n_prompt, n_gen))  # the positions used
    switch = Interventions(model, lora, control_vectors)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, model.args.n_vocab, size=n_prompt).tolist()
    seq2seq = bool(getattr(model.net, "is_encoder_decoder", False))
    waited: list[float] = []
    switch.set(True)
    if seq2seq:  # timed with the interventions only (the comparison without them is a decoder-only model's)
        best = {True: _time_encoder_decoder(model, ids, n_gen, reps, waited)}
    else:
        best = _time_decoder(model, ids, n_gen, reps, waited, switch if switch.names else None, gen_after_prompt)
    pp_best, tg_best = best[True]
    plain = {}
    if False in best:  # the same model without the interventions, timed beside it
        plain = {"plain_prompt_tok_s": n_prompt / best[False][0], "plain_gen_tok_s": n_gen / best[False][1]}
    return {
        "model": model.name,
        "prompt_tok_s": n_prompt / pp_best,
        "gen_tok_s": n_gen / tg_best,
        "interventions": switch.names,
        **plain,
        "load_s": load_s,
        "peak_rss_mb": peak_rss_mb(),
        "backend": model.backend.name,
        "numerics": model.numerics,
        "flash_attn": model.flash_attn,
        "device": model.backend.device_name(),
        "gpu_layers": model.gpu_layers,
        "n_prompt": n_prompt,
        "n_gen": n_gen,
        "gen_depth": n_prompt if gen_after_prompt and not seq2seq else 0,
        "prompt_phase": "encoder" if seq2seq else "decoder",
        **_isa(model),
        "notes": list(model.warnings),
        "kernels_wait_s": round(sum(waited), 2),
    }


def _check_context(model: Any, n_ctx: int) -> None:  # noqa: ANN401
    """A context past what the file allows, or one whose KV cache would not fit in free memory, is refused before
    anything runs."""
    if getattr(model.net, "is_encoder_decoder", False):
        return
    from engine.memory import check_memory  # noqa: PLC0415

    trained = int(model.args.n_ctx)
    if n_ctx > trained:
        raise SettingError(f"bench: -p and -n need a context of {n_ctx} tokens; this model's file allows {trained} "
                           "(its context_length)")
    check_memory(model.gguf, model.args, n_ctx=n_ctx, cache_type=getattr(model.net.ops, "cache_type", "F16"))


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


class Interventions:
    """The --lora and --control-vector files a bench runs with, loaded and checked once, switched on and off."""

    def __init__(self, model: Any, lora_specs: Sequence[str], cvec_specs: Sequence[str]):  # noqa: ANN401
        from engine.intervene import control_vector as cv  # noqa: PLC0415
        from engine.intervene import lora  # noqa: PLC0415

        a = model.args
        self.model = model
        specs = [cv.parse_spec(t) for t in cvec_specs]
        self.vec = cv.load(specs, a.dim, a.n_layers, model.arch) if specs else None
        self.adapters = [lora.load(model, *lora.parse_spec(t)) for t in lora_specs]
        self.names = [text for text in (lora.describe(self.adapters), self.vec.describe() if self.vec else "") if text]

    def set(self, on: bool) -> None:
        """Apply the interventions (on) or remove them; nothing when there are none."""
        from engine.intervene import control_vector as cv  # noqa: PLC0415
        from engine.intervene import lora  # noqa: PLC0415

        if self.adapters:
            lora.apply(self.model, self.adapters if on else [])
        if self.vec is not None:
            cv.apply(self.model, self.vec if on else None)


def _time_decoder(model: Any, ids: list[int], n_gen: int, reps: int,  # noqa: ANN401
                  waited: list[float], switch: Interventions | None,
                  after_prompt: bool = False) -> dict[bool, tuple[float, float]]:
    """Best seconds of a prefill of `ids` and of n_gen single-token steps from an empty cache: {True: with the
    interventions (or the model as it is), False: without them (only with a switch)}."""
    from engine.generate import prefill  # noqa: PLC0415

    n_ctx = (len(ids) + n_gen if after_prompt else max(len(ids), n_gen)) + 1
    model.forward(ids[:8], model.new_cache(n_ctx))  # warm-up: first BLAS calls, page faults
    prefill(model, ids, model.new_cache(n_ctx))  # a long prompt's kernels too (it may start the late helper)
    _settle(waited)

    def rep() -> tuple[float, float]:
        cache = model.new_cache(n_ctx)
        t = time.perf_counter()
        prefill(model, ids, cache)  # in llama.cpp's batches of 512 (engine.generate.UBATCH), as its eval runs them
        pp = time.perf_counter() - t
        if not after_prompt:
            cache = model.new_cache(n_ctx)
        tok = ids[0]
        t = time.perf_counter()
        for _ in range(n_gen):
            tok = model.greedy_step(tok, cache)
        return pp, time.perf_counter() - t

    return _best(reps, rep, switch, lambda: model.greedy_step(ids[0], model.new_cache(2)))


def _best(reps: int, rep: Callable[[], tuple[float, float]], switch: Interventions | None,
          warm: Callable[[], object]) -> dict[bool, tuple[float, float]]:
    """The best (prompt, generation) seconds of `reps` calls of `rep`; with a switch each repetition runs with the
    interventions and then without, after an untimed step (`warm`) that builds the decode step for each."""
    best: dict[bool, tuple[float, float]] = {}
    for _ in range(reps):
        for on in (True, False) if switch is not None else (True,):
            if switch is not None:
                switch.set(on)
                warm()
            pp, tg = rep()
            old = best.get(on, (float("inf"), float("inf")))
            best[on] = (min(old[0], pp), min(old[1], tg))
    if switch is not None:
        switch.set(True)
    return best


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


def add_command(sub: argparse._SubParsersAction, add_model: Callable[[argparse.ArgumentParser], None]) -> None:
    """The `bench` subcommand."""
    p = sub.add_parser("bench", help="prompt and generation speed, like llama-bench")
    add_model(p)
    p.add_argument("-p", type=int, default=128, help="prompt tokens")
    p.add_argument("-n", type=int, default=64, help="generated tokens")
    p.add_argument("-r", "--reps", type=int, default=2, help="repetitions (best is kept)")
    p.add_argument("--backend", default="numpy", choices=["auto", "numpy", "cupy"])
    p.add_argument("--gpu-layers", type=int, default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--gen-after-prompt", action="store_true",
                   help="time generation after the prompt, at position -p (llama-bench -d), not from an empty cache")
    add_numerics(p)
    add_steering(p)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark and print it (one JSON object with --json)."""
    result = run_bench(args.model, n_prompt=args.p, n_gen=args.n, backend=args.backend, reps=args.reps,
                       gpu_layers=args.gpu_layers, numerics=args.numerics, lora=args.lora,
                       control_vectors=args.control_vector, flash_attn=args.flash_attn,
                       gen_after_prompt=args.gen_after_prompt)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['model']}  backend {result['backend']}  load {result['load_s']:.2f} s  "
          f"peak RSS {result['peak_rss_mb']:.0f} MB")
    if result["interventions"]:
        print(f"  with {'; '.join(result['interventions'])}")
    encoder = result["prompt_phase"] == "encoder"  # T5: pp is the encoder's, tg the decoder's against it
    rows = (("pp", "prompt_tok_s", args.p, "  (encoder)"), ("tg", "gen_tok_s", args.n, "  (decoder)"))
    for label, key, n, phase in rows:
        plain = result.get(f"plain_{key}")
        vs = f"  without them {plain:8.1f} tok/s ({result[key] / plain:.2f}x)" if plain else ""
        print(f"  {label}{n}: {result[key]:8.1f} tok/s" + (phase if encoder else "") + vs)
    return 0
