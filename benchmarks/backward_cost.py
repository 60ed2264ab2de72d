"""What a backward pass costs against a forward pass of the same tokens: time and peak memory.

    nice -n 19 .venv/bin/python benchmarks/backward_cost.py [MODEL ...] [--tokens N] [--repeat R]

Per model (default: the catalog's SmolLM2 and Gemma 3 files in the user cache) a prompt of N tokens runs
- `forward_ms`: the engine's own prompt pass (the numerics the model loads with, ggml: compiled products on the blocks);
- `traced_forward_ms`: the same graph on traced values (engine.grad: float32 reference ops recorded on the tape);
- `backward_ms`: the tape's reverse pass alone (d logit difference / d every activation and the input embeddings);
with `backward_over_traced_forward` and `backward_over_forward` their ratios (the median of R runs each, after one
unmeasured run). Each product dequantizes its weight and drops it, and its VJP dequantizes it again. Memory, by
tracemalloc (NumPy reports its buffers to it): `traced_forward_peak_mb` (the tape's activations and the one weight
being dequantized), `grad_peak_mb` (forward and backward), `weight_copies_mb` (float32 copies kept while the pass runs:
0 with ggml numerics), `file_mb` (memory-mapped), and `max_rss_mb`: the process's peak resident memory so far (the
file's pages read, Python, NumPy, the pass: what "fits in 2 GB" asks; run one model per process to read it alone).
One JSON line per model.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = ("smollm2-135m-instruct", "gemma3-270m")
TEXT = ("The history of the printing press begins in the fifteenth century, when movable type made books cheaper and "
        "faster to produce than ever before, and the ideas they carried travelled further than any manuscript could. ")


def _median_ms(fn, repeat: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _peak_mb(fn) -> float:  # noqa: ANN001
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (peak - base) / 2**20


def measure(name: str, n_tokens: int, repeat: int) -> dict:
    from engine.grad.backward import gradient, traced
    from engine.grad.tape import Tape
    from engine.model import load_model

    spent: list[float] = []
    plain_backward = Tape.backward

    def timed_backward(self, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202 - the reverse pass alone, timed
        t0 = time.perf_counter()
        try:
            return plain_backward(self, *a, **k)
        finally:
            spent.append((time.perf_counter() - t0) * 1e3)

    Tape.backward = timed_backward

    model = load_model(name)
    try:
        ids = model.tokenizer.encode(TEXT * (n_tokens // 30 + 1), add_special=True, parse_special=False)[:n_tokens]
        net = model.net
        target, contrast = int(ids[-1]), int(ids[-2])

        def forward() -> None:
            net.forward(ids, model.new_cache(len(ids)))

        forward()
        fwd = _median_ms(forward, repeat)
        with traced(model):
            gradient(model, ids, target, contrast)
            copies = sum(lin._dense.nbytes for lin in net.linears().values() if lin._dense is not None)
            copies += sum(f._stacked.nbytes for layer in net.layers for f in layer.fused() if f._stacked is not None)
            traced_fwd = _median_ms(lambda: gradient(model, ids, target, contrast, backward=False), repeat)
            spent.clear()
            for _ in range(repeat):
                gradient(model, ids, target, contrast)
            bwd = statistics.median(spent)
            fwd_peak = _peak_mb(lambda: gradient(model, ids, target, contrast, backward=False))
            grad_peak = _peak_mb(lambda: gradient(model, ids, target, contrast))
        return {
            "model": name, "tokens": len(ids),
            "numerics": model.numerics, "forward_ms": round(fwd, 1), "traced_forward_ms": round(traced_fwd, 1),
            "backward_ms": round(bwd, 1), "backward_over_traced_forward": round(bwd / traced_fwd, 2),
            "backward_over_forward": round(bwd / fwd, 2), "traced_forward_peak_mb": round(fwd_peak, 1),
            "grad_peak_mb": round(grad_peak, 1), "weight_copies_mb": round(copies / 2**20, 1),
            "file_mb": round(net.weight_bytes() / 2**20, 1),
            "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
    finally:
        model.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    np.seterr(all="ignore")
    for name in args.models:
        print(json.dumps(measure(name, args.tokens, args.repeat)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
