"""Golden F16 and F32 weight products from llama.cpp's ggml-cpu, for tests/engine/kernels/test_tinyblas.py.

A batch of two rows or more with a row length in sixteens goes through llamafile's tinyBLAS (one 16-lane
accumulator per output), a single row through vec_dot; this script runs MUL_MAT(W, X) through ctypes as
tools/make_q4k_repack_fixtures.py does, for weights of both float types and row lengths with and without
sixteens.

Writes tests/fixtures/kernels/float_gemm.npz:
  w_<type>_<n>       weight rows (24, n): F16 as fp16 bits (uint16), F32 as float32
  x_<n>              float32 activation rows (16, n)
  y_<type>_<n>_<m>   llama.cpp's MUL_MAT result (m, 24), m in 1, 2, 3, 8, 16
  w_<type>_<r>_<n>, xr_<n>, y_<type>_<r>_<n>_<m>   BF16 (bf16 bits) and F16 weights of r = 24 and 22 rows
                     (tinyBLAS wants the weight's rows in fours) and widths 512 and 528 (BF16's tinyBLAS
                     steps 32 values: 528 goes to vec_dot), made after the arrays above with their own seed

Run with a Python that has llama-cpp-python (built from source with the AVX-512 flags of README.md):
  /tmp/llvenv/bin/python tools/make_float_gemm_fixtures.py
With --isa avx2 and the AVX2-only build (README.md) the same inputs give float_gemm_avx2.npz: the AVX2 build's
orders (vec_dot's four 8-float accumulators, tinyBLAS<8>, BF16's tinyBLAS<8, __m256> and vec_dot_bf16's __m256
loop instead of VDPBF16PS), for engine.kernels.isa's avx2 bits.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from make_kernel_fixtures import load_ggml_cpu
from make_q4k_repack_fixtures import bind_graph_api, mul_mat

from engine.quant import GGMLType

OUT = ROOT / "tests" / "fixtures" / "kernels" / "float_gemm.npz"
ROWS = (1, 2, 3, 8, 16)
WIDTHS = (512, 200)  # in sixteens (tinyBLAS) and not (vec_dot for every batch)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, rounded to nearest even (ggml_compute_fp32_to_bf16 for finite values)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--isa", choices=("avx512", "avx2"), default="avx512")
    isa = ap.parse_args().isa
    lib = load_ggml_cpu()
    bind_graph_api(lib)
    if lib.features.get("avx512", False) != (isa == "avx512"):
        raise SystemExit(f"this llama.cpp's features {lib.features} are not an {isa} build's")
    out = OUT if isa == "avx512" else OUT.with_name(f"float_gemm_{isa}.npz")
    rng = np.random.default_rng(20261202)
    arrays: dict[str, np.ndarray] = {}
    for n in WIDTHS:
        x = (rng.standard_normal((16, n)) * 0.8).astype(np.float32)
        x[3, ::7] *= 300  # large values: the fp16 rounding of the activations shows
        x[5] *= np.float32(1e-4)
        arrays[f"x_{n}"] = x
        w = (rng.standard_normal((24, n)) * 0.05).astype(np.float32)
        for qtype, rows in ((GGMLType.F16, w.astype(np.float16).view(np.uint16)), (GGMLType.F32, w)):
            name = qtype.name.lower()
            arrays[f"w_{name}_{n}"] = rows
            for m in ROWS:
                y = mul_mat(lib, qtype, rows.view(np.uint8).reshape(24, -1), x[:m], repack=False, threads=1)
                again = mul_mat(lib, qtype, rows.view(np.uint8).reshape(24, -1), x[:m], repack=False, threads=3)
                assert np.array_equal(y.view(np.uint32), again.view(np.uint32)), (name, n, m)
                arrays[f"y_{name}_{n}_{m}"] = y
    rng = np.random.default_rng(20261203)
    for n in (512, 528):
        x = (rng.standard_normal((16, n)) * 0.8).astype(np.float32)
        x[3, ::7] *= 300
        x[5, ::5] = np.float32(3e-39)  # denormal activations (VDPBF16PS reads them as zero)
        arrays[f"xr_{n}"] = x
        for r in (24, 22):
            w = (rng.standard_normal((r, n)) * 0.05).astype(np.float32)
            w[1, ::9] = np.float32(-2e-39)
            for qtype, rows in ((GGMLType.BF16, bf16_bits(w)), (GGMLType.F16, w.astype(np.float16).view(np.uint16))):
                name = qtype.name.lower()
                arrays[f"w_{name}_{r}_{n}"] = rows
                for m in ROWS:
                    y = mul_mat(lib, qtype, rows.view(np.uint8).reshape(r, -1), x[:m], repack=False, threads=1)
                    arrays[f"y_{name}_{r}_{n}_{m}"] = y
    arrays["meta"] = np.array(json.dumps({"source": lib.source, "features": lib.features, "rows": list(ROWS),
                                          "script": "tools/make_float_gemm_fixtures.py"}))
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out, **arrays)
    print(f"{lib.source}, features {lib.features}: {out.stat().st_size / 1e3:.0f} kB in {out}")


if __name__ == "__main__":
    main()
