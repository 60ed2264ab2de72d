"""Golden Q2_K products of llama.cpp's repacked q2_K_8x8 path, for tests/engine/kernels/test_iquant_tiled.py.

With AVX-512 llama.cpp's CPU_REPACK buffer takes Q2_K weights whose row count is a multiple of 8 (ggml-cpu's
repack.cpp, ggml_repack_get_optimal_repack_type) and multiplies every batch with ggml_gemv_q2_K_8x8_q8_K /
ggml_gemm_q2_K_8x8_q8_K: the gemm (activation rows in fours, ggml_quantize_mat_q8_K_4x8) adds one fma per 128
weights, the gemv (one row, and the rows left over) one per super-block. This script builds the one-node graph
MUL_MAT(W, X) of tools/make_q4k_repack_fixtures.py with W in the CPU_REPACK buffer for 1 to 33 activation rows.

Writes tests/fixtures/kernels/q2k_repack.npz:
  w          Q2_K weight rows (40, 3 super-blocks): llama.cpp-quantized, random bytes and edge rows
  x          float32 activation rows (33, 768)
  y_<m>      llama.cpp's MUL_MAT result (m, 40) float32
  meta       JSON: source, CPU features, and per product how many values differ from the plain buffer's

Run with a Python that has llama-cpp-python (built from source with the AVX-512 flags of README.md):
  /tmp/llvenv/bin/python tools/make_q2k_repack_fixtures.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from make_kernel_fixtures import load_ggml_cpu
from make_kquant_tiled_fixtures import activations, weights
from make_q4k_repack_fixtures import bind_graph_api, mul_mat

from engine.quant import GGMLType

OUT = ROOT / "tests" / "fixtures" / "kernels" / "q2k_repack.npz"
ROWS = (1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 33)


def main() -> None:
    lib = load_ggml_cpu()
    bind_graph_api(lib)
    if not lib.features.get("avx512"):
        raise SystemExit("llama.cpp repacks Q2_K only with AVX-512: run this on an AVX-512 machine")
    rng = np.random.default_rng(20261201)
    x = activations(rng)
    w = weights(lib, rng, GGMLType.Q2_K)[:40]  # rows in eights: the repack buffer takes them
    arrays: dict[str, np.ndarray] = {"w": w, "x": x}
    differs: dict[str, int] = {}
    for m in ROWS:
        y = mul_mat(lib, GGMLType.Q2_K, w, x[:m], repack=True, threads=1)
        again = mul_mat(lib, GGMLType.Q2_K, w, x[:m], repack=True, threads=3)
        assert np.array_equal(y.view(np.uint32), again.view(np.uint32)), m
        plain = mul_mat(lib, GGMLType.Q2_K, w, x[:m], repack=False, threads=1)
        differs[str(m)] = int((y.view(np.uint32) != plain.view(np.uint32)).sum())
        arrays[f"y_{m}"] = y
    arrays["meta"] = np.array(json.dumps({
        "source": lib.source, "features": lib.features, "rows": list(ROWS),
        "product": "MUL_MAT with src0 in the CPU_REPACK buffer (q2_K_8x8)",
        "values_differing_from_plain_buffer": differs, "script": "tools/make_q2k_repack_fixtures.py"}))
    np.savez_compressed(OUT, **arrays)
    print(f"{lib.source}: {OUT.stat().st_size / 1e3:.0f} kB in {OUT}; differing from the plain buffer: {differs}")


if __name__ == "__main__":
    main()
