"""Speed of the k-quant kernels (Q2_K .. Q6_K) against llama.cpp's vec_dot on the same shapes.

    .venv/bin/python benchmarks/kernels_kquants.py [--types Q4_K Q6_K] [--threads 2] [--reps 20] [--gemm 8]

For each type and shape (n_rows x n_cols) it prints the best time of one gemv (activation already
quantized to Q8_K), the weight bandwidth in GB/s, and the time of quantize_q8_k for that row. With
--gemm M it also times gemm on M activations (per activation, to compare with the gemv) and one
dequantize_rows of the whole matrix. --asm prints the instruction mix of each type's row product
(vpmaddubsw / vpmaddwd / vfmadd on ymm are ggml's AVX2 sequence). When llama-cpp-python is importable (from this Python or
--llama-site) the same product runs through ggml-cpu's own vec_dot, called row by row from a
compiled parallel loop on the same threads: kernel against kernel, no ggml graph or thread pool.

Shapes: a k-quant row is a whole number of 256-weight super-blocks, so the 640x640 and 2048x640
shapes of Gemma-3-270M (rows of 640 weights) are stored in legacy types there (Q5_0 / Q8_0, see
kernels_legacy.py); its k-quant tensors are attn_output 640x1024 (Q4_K) and ffn_down 640x2048
(Q4_K / Q6_K). The others are those of a 1.1B llama (dim 2048, FFN 8192). Keep runs short on a
shared machine: the best of --reps calls is reported, never an average.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from kernels_legacy import best_of, ggml_vec_dot  # noqa: E402

from engine.kernels.kquant import family as K  # noqa: E402
from engine.quant import quantize  # noqa: E402
from engine.quant.types import GGMLType  # noqa: E402

SHAPES = [(640, 1024), (640, 2048), (2048, 2048), (8192, 2048), (2048, 8192)]


def weights(rng: np.random.Generator, qtype: GGMLType, n_rows: int, n: int) -> np.ndarray:
    """Realistic blocks without quantizing millions of weights: 64 quantized rows, tiled, read-only."""
    base = quantize((rng.standard_normal((64, n)) * 0.02).astype(np.float32), qtype)
    w = np.ascontiguousarray(np.tile(base, (n_rows // 64, 1)))
    w.flags.writeable = False  # as the memory map: the specialisation the engine runs
    return w


def asm_mix(name: str) -> str:
    """The SIMD instructions of one row product (one super-block loop), by mnemonic, from numba's assembly."""
    from engine.kernels.kquant import dot as kquant_dot  # noqa: PLC0415

    dot = getattr(kquant_dot, f"_dot_{name.lower()}")

    @numba.njit
    def one(w, wo, nb, x, xo):
        return dot(w, wo, nb, x, xo)

    one(np.zeros(256, np.uint8), 0, 1, np.zeros(292, np.uint8), 0)
    asm = one.inspect_asm(one.signatures[0])
    ops = [line.split()[0] for line in asm.splitlines() if line.startswith("\t") and not line.startswith("\t.")]
    simd = Counter(op for op in ops if op.startswith("v"))
    width = "zmm" if "%zmm" in asm else "ymm" if "%ymm" in asm else "xmm"
    key = ("vpmaddubsw", "vpmaddwd", "vpdpwssd", "vpdpbusd", "vfmadd", "vcvtdq2ps")
    found = ", ".join(f"{k} {sum(n for op, n in simd.items() if op.startswith(k))}" for k in key)
    return f"{name}: {len(ops)} instructions in the compiled function, {sum(simd.values())} SIMD (widest {width}): {found}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", nargs="+", default=[t.name for t in K.KQUANT_TYPES])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--gemm", type=int, default=0, help="also time gemm on this many activations")
    ap.add_argument("--llama-site", default="/tmp/llvenv/lib/python3.11/site-packages")
    ap.add_argument("--asm", action="store_true", help="print the instruction mix of each row product and stop")
    args = ap.parse_args()
    if args.asm:
        for name in args.types:
            print(asm_mix(name))
        return 0
    numba.set_num_threads(args.threads)
    ggml = ggml_vec_dot(args.llama_site)
    rng = np.random.default_rng(0)
    print(f"threads {args.threads}; best of {args.reps} calls; GB/s = weight bytes / time"
          + ("" if ggml else "; llama.cpp not found"))
    for name in args.types:
        qtype = GGMLType[name]
        for n_rows, n in SHAPES:
            w = weights(rng, qtype, n_rows, n)
            x = rng.standard_normal((max(1, args.gemm), n)).astype(np.float32)
            xq = K.quantize_q8_k(x)
            out = np.empty(n_rows, np.float32)
            reps = max(3, args.reps // 4) if w.nbytes > 4e6 else args.reps
            gemv, row = K.GEMV[qtype], x[0]
            t = best_of(lambda gemv=gemv, w=w, xq=xq, out=out: gemv(w, xq[0], out), reps)
            tq = best_of(lambda row=row: K.quantize_q8_k(row), reps)
            line = (f"{name} {n_rows:5d}x{n:<5d} {w.nbytes / 1e6:5.2f} MB | gemv {t * 1e6:7.1f} us "
                    f"{w.nbytes / t / 1e9:6.2f} GB/s | q8_K {tq * 1e6:5.1f} us")
            if ggml is not None:
                run = ggml(qtype)
                tl = best_of(lambda run=run, w=w, xq=xq, out=out, n=n: run(w, xq[0], out, n), reps)
                line += f" | llama.cpp vec_dot {tl * 1e6:7.1f} us {w.nbytes / tl / 1e9:6.2f} GB/s ({tl / t:4.2f}x)"
            if args.gemm:
                outm = np.empty((args.gemm, n_rows), np.float32)
                gemm, dequant = K.GEMM[qtype], K.DEQUANTIZE_ROWS[qtype]
                tm = best_of(lambda gemm=gemm, w=w, xq=xq, outm=outm: gemm(w, xq, outm), max(2, reps // 4))
                tile = np.empty((n_rows, n), np.float32)
                td = best_of(lambda dq=dequant, w=w, r=n_rows, tile=tile: dq(w, 0, r, tile), max(2, reps // 4))
                line += (f" | gemm/{args.gemm} {tm / args.gemm * 1e6:7.1f} us per row of x"
                         f" | dequant {tile.nbytes / td / 1e9:5.2f} GB/s of float32 written")
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
