"""Golden Q4_0 products from llama.cpp's ggml-cpu, repacked (q4_0_8x8) or not, for test_q4_0_repack.py.

On x86 with AVX2 ggml-cpu keeps a Q4_0 weight whose rows are a multiple of 8 in its CPU_REPACK buffer
(block_q4_0x8) and multiplies it through ggml_gemv_q4_0_8x8_q8_0 / ggml_gemm_q4_0_8x8_q8_0; other Q4_0 weights
go through vec_dot (or tinyBLAS, same bits). This script runs MUL_MAT(W, X) through ctypes exactly as
tools/make_q4k_repack_fixtures.py does for Q4_K: W allocated in ggml_backend_cpu_repack_buffer_type().

Writes tests/fixtures/kernels/q4_0_repack.npz:
  w_<wcase>       Q4_0 weight rows (r, nb * 18): llama.cpp-quantized (24 rows), random bytes (16), edge blocks
                  (8), and 12 llama.cpp-quantized rows (not a multiple of 8: llama.cpp does not repack them)
  x               float32 activation rows (16, 512), edge rows among them; products use the first m rows
  y_<wcase>_<m>   llama.cpp's MUL_MAT result (m, r) float32, m in 1, 2, 3, 4, 5, 8, 16
  meta            JSON: source, CPU features

Run with a Python that has llama-cpp-python (built from source with the AVX-512 flags of README.md):
  /tmp/llvenv/bin/python tools/make_q4_0_repack_fixtures.py
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
from make_q4k_repack_fixtures import ROWS, _f16, activations, bind_graph_api, mul_mat
from make_quant_fixtures import ggml_quantize

from engine.quant import GGMLType

OUT = ROOT / "tests" / "fixtures" / "kernels" / "q4_0_repack.npz"
N = 512


def weights(lib, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Q4_0 rows of n columns: llama.cpp-quantized, random bytes, edge blocks, and a row count not in eights."""
    nb = n // 32
    normal = (rng.standard_normal((12, n)) * 0.02).astype(np.float32)
    heavy = (rng.standard_t(3.0, (12, n)) * 0.02).astype(np.float32)
    heavy[:, ::97] *= 20
    quantized = ggml_quantize(lib.base, np.concatenate([normal, heavy]), GGMLType.Q4_0)
    rand = rng.integers(0, 256, (16, nb, 18), dtype=np.uint8)
    rand[..., 0:2] = _f16(rng.standard_normal((16, nb)) * 0.005).reshape(16, nb, 2)
    edge = rng.integers(0, 256, (8, nb, 18), dtype=np.uint8)
    edge[..., 0:2] = _f16(rng.standard_normal((8, nb)) * 0.005).reshape(8, nb, 2)
    edge[0] = 0  # zero blocks
    edge[1, :, 0:2] = _f16(65504.0)  # max fp16 d
    edge[2, :, 2:] = 0x00  # every quant 0 (value -8)
    edge[3, :, 2:] = 0xFF  # every quant 15 (value 7)
    edge[4, :, 0:2] = _f16(6e-8)  # subnormal fp16 scales
    edge[5, :, 0:2] = 0  # zero scales under random quants
    edge[6, ::2] = 0  # zero blocks between random ones
    odd = ggml_quantize(lib.base, normal, GGMLType.Q4_0)  # 12 rows: vec_dot in llama.cpp
    return {"quantized": quantized, "random": rand.reshape(16, -1), "edge": edge.reshape(8, -1), "rows12": odd}


def main() -> None:
    lib = load_ggml_cpu()
    bind_graph_api(lib)
    rng = np.random.default_rng(20261201)
    x = activations(rng, N)
    arrays: dict[str, np.ndarray] = {"x": x}
    for wcase, w in weights(lib, rng, N).items():
        arrays[f"w_{wcase}"] = w
        repack = w.shape[0] % 8 == 0  # llama.cpp's repack buffer refuses other Q4_0 weights (they stay plain)
        for m in ROWS:
            y = mul_mat(lib, GGMLType.Q4_0, w, x[:m], repack=repack, threads=1)
            again = mul_mat(lib, GGMLType.Q4_0, w, x[:m], repack=repack, threads=3)  # the chunking changes nothing
            assert np.array_equal(y.view(np.uint32), again.view(np.uint32)), (wcase, m)
            arrays[f"y_{wcase}_{m}"] = y
    arrays["meta"] = np.array(json.dumps({
        "source": lib.source, "features": lib.features, "rows": list(ROWS),
        "product": "MUL_MAT with src0 in ggml_backend_cpu_repack_buffer_type (q4_0_8x8_q8_0 for rows in eights)",
        "script": "tools/make_q4_0_repack_fixtures.py"}))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"{lib.source}, features {lib.features}: {OUT.stat().st_size / 1e3:.0f} kB in {OUT}")


if __name__ == "__main__":
    main()
