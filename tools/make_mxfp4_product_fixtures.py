"""Golden MXFP4 products from llama.cpp's ggml-cpu, for tests/engine/kernels/test_mxfp4_kernels.py.

Through ctypes on the libggml shipped with llama-cpp-python (built from its sdist with this host's flags, README.md):
weight rows of MXFP4 blocks (quantized by ggml_quantize_chunk from random rows at several scales, random bytes with
every exponent class, and edge blocks: exponents 0, 1, 2, 254, 255, all codes 7 / 15) against activation rows
quantized by ggml-cpu's from_float (Q8_0):
  ggml_vec_dot_mxfp4_q8_0 of every (weight row, activation row)                  -> dot (9, 24)
  MUL_MAT on the plain CPU buffer for 1, 4 and 9 activation rows (vec_dot's)       -> mul_mat_<m> (m, 24)
  MUL_MAT in the CPU_REPACK buffer (mxfp4_8x8 on AVX2) for the first 16 rows      -> mul_mat_repack_<m> (m, 16)
Writes tests/fixtures/kernels/mxfp4_dot.npz (w, x, xq and the outputs as float32).

  /tmp/llvenv/bin/python tools/make_mxfp4_product_fixtures.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from make_kernel_fixtures import cpu_from_float, cpu_vec_dot, load_ggml_cpu  # noqa: E402
from make_q4k_repack_fixtures import bind_graph_api, mul_mat  # noqa: E402
from make_mxfp4_fixtures import quantize  # noqa: E402
from make_quant_fixtures import load_ggml  # noqa: E402

from engine.quant.types import GGMLType  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "kernels" / "mxfp4_dot.npz"
N = 256  # 8 blocks a row


def weights(rng: np.random.Generator) -> np.ndarray:
    lib, _ = load_ggml()
    x = rng.standard_normal((12, N)).astype(np.float32) * np.logspace(-3, 1, 12, dtype=np.float32)[:, None]
    quantized = quantize(lib, x)  # (12, 8 * 17)
    rand = rng.integers(0, 256, (8, N // 32, 17), dtype=np.uint8)
    rand[..., 0] = rng.integers(100, 140, rand.shape[:2])  # exponents around 1 (products stay finite)
    edge = np.zeros((4, N // 32, 17), np.uint8)
    edge[0, :, 0], edge[0, :, 1:] = np.array([0, 1, 2, 3, 126, 127, 128, 129], np.uint8), 0x77  # subnormal scales
    edge[1, :, 0], edge[1, :, 1:] = 120, 0xFF  # every code -12
    edge[2, :, 0], edge[2, :, 1:] = np.arange(8, dtype=np.uint8) * 3 + 110, rng.integers(0, 256, (8, 16))
    edge[3] = 0  # zero exponent and codes
    return np.concatenate([quantized, rand.reshape(8, -1), edge.reshape(4, -1)])


def main() -> None:
    rng = np.random.default_rng(39)
    lib = load_ggml_cpu()
    bind_graph_api(lib)
    w = weights(rng)
    x = (rng.standard_normal((9, N)) * rng.uniform(0.05, 4.0, (9, 1))).astype(np.float32)
    x[0, 3], x[0, 40] = 60.0, -60.0
    xq = cpu_from_float(lib, GGMLType.Q8_0, x)
    out = {"w": w, "x": x, "xq": xq, "dot": cpu_vec_dot(lib, GGMLType.MXFP4, w, xq, N)}
    for m in (1, 4, 9):
        out[f"mul_mat_{m}"] = mul_mat(lib, GGMLType.MXFP4, w, x[:m], repack=False, threads=1)
        out[f"mul_mat_repack_{m}"] = mul_mat(lib, GGMLType.MXFP4, w[:16], x[:m], repack=True, threads=1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT}: " + ", ".join(f"{k} {v.shape}" for k, v in out.items()))


if __name__ == "__main__":
    main()
