"""Time dequantizing every tensor of a GGUF model with engine.quant (prints; asserts nothing).

Usage: python benchmarks/dequant_speed.py [MODEL.gguf ...]
Defaults to the SmolLM2 and Gemma 3 test models in $GGUF_LENS_MODELS_DIR or /work/models.
"""
from __future__ import annotations

import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from gguf import GGUFReader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.quant import GGMLType, dequantize  # noqa: E402

DEFAULT_MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]


def bench(path: Path, repeats: int = 3) -> None:
    """Print the best-of-`repeats` time to dequantize the whole model, and per type."""
    reader = GGUFReader(path)
    tensors = [(GGMLType(int(t.tensor_type)), np.asarray(t.data).view(np.uint8).reshape(-1), int(t.n_elements))
               for t in reader.tensors]
    for _, raw, _ in tensors:  # fault the mmap in so the first run does not time disk reads
        raw.sum(dtype=np.uint64)
    n_weights = sum(n for _, _, n in tensors)
    best = float("inf")
    per_type: dict[str, float] = defaultdict(float)
    for _ in range(repeats):
        by_type: dict[str, float] = defaultdict(float)
        start = time.perf_counter()
        for qtype, raw, n in tensors:
            t0 = time.perf_counter()
            dequantize(raw, qtype, n)
            by_type[qtype.name] += time.perf_counter() - t0
        total = time.perf_counter() - start
        if total < best:
            best, per_type = total, by_type
    print(f"{path.name}: {n_weights / 1e6:.1f}M weights in {best:.3f} s "
          f"({n_weights / best / 1e6:.0f}M weights/s, best of {repeats})")
    counts: dict[str, int] = defaultdict(int)
    for qtype, _, n in tensors:
        counts[qtype.name] += n
    for name, seconds in sorted(per_type.items(), key=lambda kv: -kv[1]):
        print(f"  {name:5s} {counts[name] / 1e6:7.1f}M weights  {seconds:.3f} s  "
              f"{counts[name] / max(seconds, 1e-9) / 1e6:6.0f}M/s")


def main(argv: list[str]) -> None:
    """Benchmark the models named on the command line, or the default test models."""
    if argv:
        paths = [Path(a) for a in argv]
    else:
        root = Path(os.environ.get("GGUF_LENS_MODELS_DIR", "/work/models"))
        paths = [root / name for name in DEFAULT_MODELS if (root / name).exists()]
    if not paths:
        print("no models found; pass paths to .gguf files")
    for path in paths:
        bench(path)


if __name__ == "__main__":
    main(sys.argv[1:])
