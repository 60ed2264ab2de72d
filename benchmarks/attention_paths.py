"""Plain versus tiled (online-softmax) attention for a long prefill: time and peak memory at 2k and 8k tokens.

    .venv/bin/python benchmarks/attention_paths.py [--tokens 2048 8192] [--heads 9 --kv-heads 3 --head-dim 64]

Shapes default to SmolLM2-135M's attention (9 query heads, 3 KV heads, head_dim 64); one layer, one chunk of
512 queries at the end of the context (what a chunked prefill does last) and the whole context in one chunk.
Peak memory is measured with tracemalloc (NumPy reports its allocations there). Prints one JSON line per case.
"""
from __future__ import annotations

import argparse
import json
import time
import tracemalloc

import numpy as np

from engine.ops.attention_tiled import attention_tiled
from engine.ops.reference import attention, causal_mask


def measure(fn) -> tuple[float, float]:
    tracemalloc.start()
    t = time.perf_counter()
    fn()
    dt = time.perf_counter() - t
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return dt, peak / 2**20


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--tile", type=int, default=256)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for n in args.tokens:
        k = rng.standard_normal((args.kv_heads, n, args.head_dim)).astype(np.float32)
        v = rng.standard_normal((args.kv_heads, n, args.head_dim)).astype(np.float32)
        for t in (512, n):
            q = rng.standard_normal((args.heads, t, args.head_dim)).astype(np.float32)
            pos = np.arange(n - t, n)
            scale = 1 / np.sqrt(args.head_dim)
            plain_s, plain_mb = measure(lambda: attention(q, k, v, causal_mask(pos, n), scale))
            tiled_s, tiled_mb = measure(lambda: attention_tiled(q, k, v, pos, scale, None, args.tile))
            print(json.dumps({"context": n, "queries": t, "plain_s": round(plain_s, 3), "plain_peak_mb": round(plain_mb, 1),
                              "tiled_s": round(tiled_s, 3), "tiled_peak_mb": round(tiled_mb, 1),
                              "time_ratio": round(tiled_s / plain_s, 2), "memory_ratio": round(tiled_mb / plain_mb, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
