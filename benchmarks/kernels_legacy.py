"""Speed of the legacy-quant and float gemv kernels on SmolLM2-like shapes, against llama.cpp's vec_dot.

    .venv/bin/python benchmarks/kernels_legacy.py [--types Q4_1 Q8_0] [--threads 2] [--reps 50]

For each type and shape (n_rows x n_cols: 576x576, 1536x576, 576x1536, 49152x576) it prints the
best time of one gemv (activation already quantized) and the effective weight bandwidth in GB/s,
on raw GGUF blocks and on repacked byte planes. When llama-cpp-python is importable (from this
Python or --llama-site, a site-packages folder holding it) the same product is timed through
ggml-cpu's own vec_dot, called row by row from a compiled parallel loop on the same threads, so
the comparison is kernel against kernel (no ggml graph or thread pool). Keep runs short on a
shared machine: the best of --reps calls is reported.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.kernels.legacy import family as legacy
from engine.kernels.activations import quantize_activation
from engine.quant import quantize
from engine.quant.types import GGMLType

SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]


def best_of(fn, reps: int) -> float:
    """Best wall time of `reps` calls after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def ggml_vec_dot(site: str | None):
    """A compiled row-parallel loop over ggml-cpu's vec_dot for a type, or None without llama-cpp-python."""
    if site:
        sys.path.append(site)
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from make_kernel_fixtures import load_ggml_cpu
        lib = load_ggml_cpu()
    except (ImportError, SystemExit, OSError, StopIteration):
        return None
    proto = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                             ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    loops = {}

    def for_type(qtype: GGMLType):
        if qtype not in loops:
            vec_dot = proto(lib.traits(qtype).vec_dot)

            @numba.njit(parallel=True)
            def run(w, xq, out, n):
                for r in numba.prange(w.shape[0]):
                    vec_dot(n, out[r:].ctypes.data, 0, w[r].ctypes.data, 0, xq.ctypes.data, 0, 1)

            loops[qtype] = run
        return loops[qtype]

    return for_type


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=["Q4_1", "Q4_0", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16", "F32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--llama-site", default="/tmp/llvenv/lib/python3.11/site-packages")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    ggml = ggml_vec_dot(args.llama_site)
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}; best of {args.reps} calls; GB/s = weight bytes / time")
    for name in args.types:
        qtype = GGMLType[name]
        for n_rows, n in SHAPES:
            w = quantize((rng.standard_normal((n_rows, n)) * 0.05).astype(np.float32), qtype)
            xq = quantize_activation(qtype, rng.standard_normal(n).astype(np.float32))
            out = np.empty(n_rows, np.float32)
            gemv = legacy.GEMV[qtype]
            reps = max(3, args.reps // 10) if n_rows > 10000 else args.reps
            line = f"{name:5s} {n_rows:5d}x{n:<5d}"
            packed = legacy.REPACK[qtype](w)
            for label, weight in (("raw", w), ("repacked", packed)):
                if label == "repacked" and packed is w:
                    continue
                t = best_of(lambda gemv=gemv, weight=weight, xq=xq, out=out: gemv(weight, xq, out), reps)
                line += f" | {label} {t * 1e6:8.1f} us {w.nbytes / t / 1e9:6.2f} GB/s"
            if ggml is not None:
                run = ggml(qtype)
                t = best_of(lambda run=run, w=w, xq=xq, out=out, n=n: run(w, xq, out, n), reps)
                line += f" | llama.cpp vec_dot {t * 1e6:8.1f} us {w.nbytes / t / 1e9:6.2f} GB/s"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
