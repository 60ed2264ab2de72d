"""The long fuzz run of RELIABILITY.md case 23: N mutations of 3 small valid GGUF files, crashes kept.

    .venv/bin/python tools/fuzz_gguf.py --iterations 10000            # a random seed, printed
    .venv/bin/python tools/fuzz_gguf.py --iterations 2000 --seed 1234 # reproducible

Each input (tests/fuzz/gguf_mutations.py: bit flips, boundary integers over typed fields, splices,
truncations, insertions, deletions) runs in a forked child under RLIMIT_AS and a timeout through
open_gguf, Tokenizer.from_metadata, load_model(warm=False), a checked forward pass and a chat render.
Anything but a LensError escaping, a signal or a timeout is a crash: the input is shrunk to the fewest
mutations that still crash the same way and saved as tests/fuzz/regressions/<sha1>.gguf plus a .json
note (seed, iteration, mutations, traceback; "status": "open" until the engine is fixed, then set it
to "fixed"). tests/fuzz/test_fuzz_gguf.py replays every saved file.
"""
from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fuzz.gguf_mutations import (  # noqa: E402
    CASE_LIMIT,
    CASE_TIMEOUT_S,
    REGRESSIONS,
    Mutation,
    Outcome,
    Seed,
    apply_mutations,
    build_seeds,
    describe,
    owner_of,
    random_mutations,
    run_input,
    save_regression,
)
from tests.reliability.harness import LoaderServer  # noqa: E402


def shrink(server: LoaderServer, path: Path, seed: Seed, mutations: list[Mutation], seeds: list[Seed],
           signature: str, **limits: float) -> list[Mutation]:
    """Drop mutations one at a time while the input still crashes with the same signature."""
    best = list(mutations)
    i = 0
    while i < len(best) and len(best) > 1:
        trial = best[:i] + best[i + 1 :]
        out = run_input(server, path, apply_mutations(seed, trial, seeds), **limits)  # type: ignore[arg-type]
        if out.crashed and out.signature == signature:
            best = trial
        else:
            i += 1
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: a fresh one, printed)")
    ap.add_argument("--save", type=Path, default=REGRESSIONS, help="folder for crashing inputs")
    ap.add_argument("--save-all", action="store_true", help="save every crashing input, not one per signature")
    ap.add_argument("--limit-mib", type=int, default=CASE_LIMIT >> 20, help="RLIMIT_AS of each case")
    ap.add_argument("--timeout", type=float, default=CASE_TIMEOUT_S, help="seconds per case")
    args = ap.parse_args(argv)

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"fuzz_gguf: seed {seed}, {args.iterations} iterations, RLIMIT_AS {args.limit_mib} MiB, "
          f"timeout {args.timeout} s", flush=True)
    rng = random.Random(seed)
    limits = {"limit": args.limit_mib << 20, "timeout": args.timeout}
    crashes: collections.Counter[str] = collections.Counter()
    deepest: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fuzz-gguf-") as tmp:
        seeds = build_seeds(Path(tmp) / "seeds")
        case = Path(tmp) / "case.gguf"
        server = LoaderServer()
        try:
            for it in range(args.iterations):
                s = rng.choice(seeds)
                mutations = random_mutations(rng)
                for m in describe(mutations):
                    kinds[m.split("(")[0]] += 1
                blob = apply_mutations(s, mutations, seeds)
                out: Outcome = run_input(server, case, blob, **limits)  # type: ignore[arg-type]
                deepest[out.stages[-1] if out.stages else "rejected at open"] += 1
                if out.crashed:
                    first = crashes[out.signature] == 0
                    crashes[out.signature] += 1
                    if first or args.save_all:
                        small = shrink(server, case, s, mutations, seeds, out.signature, **limits)
                        small_blob = apply_mutations(s, small, seeds)
                        saved = save_regression(small_blob, out, {
                            "seed": seed, "iteration": it, "seed_file": s.name, "mutations": describe(small),
                            "owner": owner_of(out.key)}, args.save)
                        print(f"[{it}] CRASH {out.signature}\n    {s.name} {describe(small)} -> {saved}", flush=True)
                if (it + 1) % 1000 == 0:
                    rate = (it + 1) / (time.perf_counter() - t0)
                    print(f"[{it + 1}] {sum(crashes.values())} crashes ({len(crashes)} kinds), {rate:.0f} inputs/s",
                          flush=True)
        finally:
            server.close()
    elapsed = time.perf_counter() - t0
    print(f"\n{args.iterations} inputs in {elapsed:.0f} s, seed {seed}")
    print("mutations applied: " + ", ".join(f"{k} {n}" for k, n in kinds.most_common()))
    print("deepest stage reached: " + ", ".join(f"{k} {n}" for k, n in deepest.most_common()))
    if crashes:
        print(f"{sum(crashes.values())} crashing inputs, {len(crashes)} distinct:")
        for sig, n in crashes.most_common():
            print(f"  {n:6d}  {sig}")
    else:
        print("no crashes: only LensError subclasses were raised")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
