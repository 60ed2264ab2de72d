"""Each one-row product's weight bandwidth against this host's own read and copy bandwidth (the physical limit).

    .venv/bin/python benchmarks/bandwidth.py [--types Q4_K Q8_0 ...] [--mb 96] [--threads 2] [--json]

A decode step is one row of activations against every weight matrix: each product should stream its weights
at the memory's speed, whatever the core's integer ports do. This times, on `--threads` threads:

- the host: an explicit-SIMD read of a 1 GiB array on numba's threads (read GB/s), and a copy of it (GB/s of
  bytes read plus written), best of 5;
- each type's one-row product as the engine runs it (engine.kernels.dispatch.BlockProduct, the activation
  quantized each call, as a decode step does), on a weight of about --mb MB (256) (far past the last-level cache),
  best of --reps calls: GB/s = the bytes the kernel reads (its repacked copy where it makes one) / time, and
  that as a share of the host's read bandwidth (issue 44 asks >= 70%);
- the host read again beside each product: the explicit-SIMD read of an array of the product's own size, its calls
  taken in turn with the product's (read, product, read, product ...), best of each. A VM's read bandwidth moves
  by half between minutes (36-66 GB/s on the AMD EPYC this was written on), so the share that counts is the one
  against this read, measured in the same seconds ("of read beside"); the 1 GiB figure heads the table.

With llama-cpp-python present (--llama-site), ggml-cpu's own vec_dot runs the same rows from a compiled parallel
loop (benchmarks/kernels_legacy.ggml_vec_dot: kernel against kernel, no graph). Say which CPU a figure came from:
the first line prints /proc/cpuinfo's model name and the SIMD the kernels were compiled for. Run it on a quiet
machine: a compile beside it halves both figures.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from kernels_legacy import best_of, ggml_vec_dot  # noqa: E402

from engine.kernels.dispatch import BlockProduct  # noqa: E402
from engine.kernels.activations import quantize_activation  # noqa: E402
from engine.kernels.isa import target  # noqa: E402
from engine.kernels.q8k import quantize_q8_k  # noqa: E402
from engine.kernels.simd import I32, I64, byte_ptr, load, vec  # noqa: E402
from engine.quant import quantize  # noqa: E402
from engine.quant.types import GGMLType, type_info  # noqa: E402

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS",
         "F16", "BF16"]
N_IN = 4096  # columns: a 7B-class width; every k-quant and i-quant row is whole super-blocks


V64 = vec(I64, 8)


@intrinsic
def _or_bytes(typingctx, arr, offset, n):
    """OR of n bytes of arr from offset (n a multiple of 256): four 64-byte loads a step into four accumulators,
    so the loop is bound by the loads, never by a dependency chain or a scalar reduction."""
    def codegen(context, b, sig, args):
        a_, o_, n_ = args
        p0 = byte_ptr(context, b, sig.args[0], a_, o_)
        accs = [cgutils.alloca_once_value(b, ir.Constant(V64, None)) for _ in range(4)]
        with cgutils.for_range(b, b.udiv(n_, ir.Constant(I64, 256))) as loop:
            p = b.gep(p0, [b.mul(loop.index, ir.Constant(I64, 256))])
            for k in range(4):
                b.store(b.or_(b.load(accs[k]), load(b, p, V64, 64 * k)), accs[k])
        v = b.or_(b.or_(b.load(accs[0]), b.load(accs[1])), b.or_(b.load(accs[2]), b.load(accs[3])))
        r = b.extract_element(v, ir.Constant(I32, 0))
        for i in range(1, 8):
            r = b.or_(r, b.extract_element(v, ir.Constant(I32, i)))
        return r

    return types.uint64(arr, offset, n), codegen


@numba.njit(parallel=True)
def _read_all(a: np.ndarray) -> int:
    chunks = 256
    step = a.nbytes // chunks // 256 * 256
    out = np.zeros(chunks, np.uint64)
    for c in numba.prange(chunks):
        out[c] = _or_bytes(a, np.uint64(c * step), np.uint64(step))
    r = np.uint64(0)
    for c in range(chunks):
        r |= out[c]
    return r


def host_bandwidth(threads: int, mib: int = 1024) -> dict[str, float]:
    """Read and copy GB/s of this host on `threads` threads (best of 5): an explicit-SIMD read of a `mib` MiB
    array (_read_all, on numba's threads), and NumPy copies of equal slices of it, one slice a thread."""
    a = np.ones(mib << 17, np.uint64)
    b = np.empty_like(a)
    read = best_of(lambda: _read_all(a), 5)
    cut = np.linspace(0, a.size, threads + 1).astype(int)
    src = [a[lo:hi] for lo, hi in zip(cut[:-1], cut[1:])]
    dst = [b[lo:hi] for lo, hi in zip(cut[:-1], cut[1:])]
    with ThreadPoolExecutor(threads) as pool:
        copy = best_of(lambda: list(pool.map(np.copyto, dst, src)), 5)
    return {"read_gb_s": a.nbytes / read / 1e9, "copy_gb_s": 2 * a.nbytes / copy / 1e9}


def beside(kernel, read, reps: int) -> tuple[float, float]:
    """Best wall time of `kernel` and of `read`, their calls taken in turn (after one warm-up call of each), so
    both see the same seconds of a host whose bandwidth moves."""
    kernel()
    read()
    best_k = best_r = float("inf")
    for _ in range(reps):
        for fn, slot in ((read, 0), (kernel, 1)):
            t = time.perf_counter()
            fn()
            t = time.perf_counter() - t
            if slot:
                best_k = min(best_k, t)
            else:
                best_r = min(best_r, t)
    return best_k, best_r


def weights(rng: np.random.Generator, qtype: GGMLType, mb: float) -> np.ndarray:
    """About `mb` MB of realistic blocks, N_IN columns: 64 quantized rows tiled, read-only (as the memory map)."""
    base = quantize((rng.standard_normal((64, N_IN)) * 0.02).astype(np.float32), qtype)
    rows = max(64, int(mb * 1e6 / base[0].nbytes) // 64 * 64)
    w = np.ascontiguousarray(np.tile(base, (rows // 64, 1)))
    w.flags.writeable = False
    return w


def activation_bytes(qtype: GGMLType, x: np.ndarray) -> np.ndarray:
    """x as the bytes ggml's vec_dot of this weight type reads (Q8_0 / Q8_1 / Q8_K / F16 ...)."""
    try:
        return np.asarray(quantize_activation(qtype, x)).reshape(-1)
    except ValueError:  # the k-quants and i-quants: Q8_K
        return np.asarray(quantize_q8_k(x)).reshape(-1)


def read_bytes(product: BlockProduct, blocks: np.ndarray) -> int:
    """The bytes a one-row product reads: its repacked copy's when it made one, else the blocks'."""
    weight = product.weight
    parts = weight if isinstance(weight, tuple) else (weight,)
    total = sum(int(p.nbytes) for p in parts if isinstance(p, np.ndarray))
    planes = getattr(weight, "nbytes", None)
    if not total and isinstance(planes, int):
        total = planes
    return total or int(blocks.nbytes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=TYPES)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mb", type=float, default=256.0, help="weight size per type (past the last-level cache)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--llama-site", default="/tmp/llvenv/lib/python3.11/site-packages")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    host = host_bandwidth(args.threads)
    ggml = ggml_vec_dot(args.llama_site)
    head = {"cpu": cpu, "kernels_isa": target(), "threads": args.threads, **host}
    rows_out: list[dict[str, object]] = []
    if not args.json:
        print(f"{cpu} · kernels {target()} · {args.threads} threads · host read {host['read_gb_s']:.1f} GB/s, "
              f"copy {host['copy_gb_s']:.1f} GB/s (read + written)")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, N_IN)).astype(np.float32)
    for name in args.types:
        qtype = GGMLType[name]
        if N_IN % type_info(qtype).block_size:
            continue
        w = weights(rng, qtype, args.mb)
        product = BlockProduct(qtype, w, N_IN)
        out = np.empty((1, w.shape[0]), np.float32)
        product(x, out)  # the first one-row call makes the repacked copy (where the type has one)
        nbytes = read_bytes(product, w)
        ref = np.ones(nbytes // 8, np.uint64)  # the read beside: the product's own size, fresh anonymous memory
        t, tr = beside(lambda p=product, o=out: p(x, o), lambda r=ref: _read_all(r), args.reps)
        read_beside = ref.nbytes / tr / 1e9
        del ref
        row = {"type": name, "rows": int(w.shape[0]), "cols": N_IN, "mb": nbytes / 1e6, "us": t * 1e6,
               "gb_s": nbytes / t / 1e9, "of_read": nbytes / t / 1e9 / host["read_gb_s"],
               "read_beside_gb_s": read_beside, "of_read_beside": nbytes / t / 1e9 / read_beside}
        if ggml is not None:
            run = ggml(qtype)
            xq = activation_bytes(qtype, x)
            o1 = np.empty(w.shape[0], np.float32)
            tl = best_of(lambda run=run, w=w, xq=xq, o1=o1: run(w, xq, o1, N_IN), args.reps)
            row |= {"llama_cpp_gb_s": w.nbytes / tl / 1e9, "vs_llama_cpp": tl / t}
        rows_out.append(row)
        if not args.json:
            extra = (f" | llama.cpp vec_dot {row['llama_cpp_gb_s']:5.1f} GB/s (ours {row['vs_llama_cpp']:.2f}x)"
                     if "llama_cpp_gb_s" in row else "")
            print(f"{name:7s} {row['rows']:6d}x{N_IN} {row['mb']:6.1f} MB  {row['us']:8.0f} us  "
                  f"{row['gb_s']:5.1f} GB/s = {row['of_read_beside'] * 100:3.0f}% of read beside "
                  f"({read_beside:4.1f} GB/s; {row['of_read'] * 100:3.0f}% of the 1 GiB read){extra}", flush=True)
        del product, w
    if args.json:
        print(json.dumps({**head, "products": rows_out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
