"""Golden tiled k-quant products from llama.cpp's ggml-cpu, for tests/engine/kernels/test_kquant_tiled.py.

ggml-cpu's MUL_MAT first offers the op to its tiled k-quant path (ggml-cpu/tiled/tiled.cpp,
ggml_compute_forward_mul_mat_tiled): it takes it when the weight is Q2_K..Q6_K (or one of the IQ types it
lists), is not held in the CPU_REPACK buffer (src0->extra == NULL), GGML_CPU_TILED_MM is not 0, and the
batch has 8 or more activation rows (src1->ne[1] >= 8); otherwise it falls through to vec_dot. On x86 the
CPU_REPACK buffer takes Q4_K (and Q2_K with AVX-512) only with rows in eights, so Q3_K, Q5_K, Q6_K and other
Q4_K weights stay plain and meet the tiled path. This script runs it: through ctypes it builds the one-node
graph MUL_MAT(W, X) of tools/make_q4k_repack_fixtures.py with W in the plain CPU buffer and computes it on
the CPU backend, for 1, 7 (vec_dot), 8, 9, 16 (the tiled "narrow" path) and 33 rows (with 44 weight rows and
one thread the driver cuts the batch into windows of 17 and 16 rows: the standard path and the narrow one).

Writes tests/fixtures/kernels/kquant_tiled.npz:
  w_<TYPE>        weight rows (44, 3 super-blocks): 16 llama.cpp-quantized, 16 random bytes, 12 edge rows
  x               float32 activation rows (33, 768), edge rows among them; products use the first m rows
  xq              quantize_row_q8_K bytes of x (33, 3 * 292)
  y_<TYPE>_<m>    llama.cpp's MUL_MAT result (m, 44) float32, m in 1, 7, 8, 9, 16, 33
  meta            JSON: source, CPU features, and per product how many values differ from vec_dot's

Run with a Python that has llama-cpp-python (built from source with the AVX-512 flags of README.md):
  /tmp/llvenv/bin/python tools/make_kquant_tiled_fixtures.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from make_kernel_fixtures import cpu_from_float, cpu_vec_dot, load_ggml_cpu
from make_q4k_repack_fixtures import bind_graph_api, mul_mat
from make_quant_fixtures import ggml_quantize

from engine.quant import GGMLType

OUT = ROOT / "tests" / "fixtures" / "kernels" / "kquant_tiled.npz"
ROWS = (1, 7, 8, 9, 16, 33)
N = 768  # three super-blocks: the accumulation order over them matters
# block bytes and the byte offsets of the fp16 d and dmin (None: the type has no min)
LAYOUT = {GGMLType.Q3_K: (110, 108, None), GGMLType.Q4_K: (144, 0, 2),
          GGMLType.Q5_K: (176, 0, 2), GGMLType.Q6_K: (210, 208, None),
          GGMLType.Q2_K: (84, 80, 82)}  # last, so that the random draws of the others stay as they were


def activations(rng: np.random.Generator) -> np.ndarray:
    """33 rows of N floats: typical rows with outlier channels, and the edges of quantize_row_q8_K."""
    x = (rng.standard_normal((33, N)) * rng.uniform(0.05, 3.0, (33, 1))).astype(np.float32)
    x[:, ::61] *= 9  # a few outlier channels, as in real hidden states
    x[1, :256] = 0.0  # an all-zero block
    x[3, 256:512] = np.float32(-2.5)  # a constant block
    x[5, :256] = rng.standard_normal(256) * np.float32(1e-39)  # subnormals: 127 / amax overflows
    x[6, 17] = 1e4  # one huge value
    x[7] = (rng.standard_t(1.5, N) * 0.1).astype(np.float32)  # heavy tail
    x[8] = (rng.integers(-254, 255, N) + 0.5) / np.float32(254)  # halves after scaling
    x[10, 512:] = 0.0  # the last block zero (its d8 is 0)
    x[11] *= np.float32(1e-3)
    x[20] = np.float32(1.0)  # every activation 1: the products sum the weights
    return x


def weights(lib, rng: np.random.Generator, qtype: GGMLType) -> np.ndarray:
    """44 rows of N columns of `qtype`: llama.cpp-quantized (16), random bytes (16) and edge blocks (12)."""
    size, d_at, dmin_at = LAYOUT[qtype]
    nb = N // 256
    normal = (rng.standard_normal((8, N)) * 0.02).astype(np.float32)
    heavy = (rng.standard_t(3.0, (8, N)) * 0.02).astype(np.float32)
    heavy[:, ::97] *= 20
    quantized = ggml_quantize(lib.base, np.concatenate([normal, heavy]), qtype).reshape(16, nb, size)
    fields = [d_at] + ([dmin_at] if dmin_at is not None else [])

    def scales(blocks: np.ndarray, value) -> None:  # the fp16 d (and dmin) of every block in `blocks`
        half = np.broadcast_to(np.asarray(value, np.float32), blocks.shape[:-1]).astype("<f2")
        for at in fields:
            blocks[..., at : at + 2] = half[..., None].view(np.uint8)

    rand = rng.integers(0, 256, (16, nb, size), dtype=np.uint8)
    scales(rand, (rng.standard_normal((16, nb)) * 0.005).astype(np.float32))
    edge = rng.integers(0, 256, (12, nb, size), dtype=np.uint8)
    scales(edge, (rng.standard_normal((12, nb)) * 0.005).astype(np.float32))
    body = np.ones(size, bool)
    for at in fields:
        body[at : at + 2] = False
    edge[0] = 0  # zero blocks
    scales(edge[1], 65504.0)  # max fp16 d (and dmin)
    edge[2][:, body] = 0x00  # every quant, scale (and min) byte 0
    edge[3][:, body] = 0xFF  # every bit set
    edge[4][:, body] = 0xFF
    scales(edge[4], 1.0)
    scales(edge[5], 6e-8)  # subnormal fp16 scales
    edge[6, ::2] = 0  # zero blocks between random ones
    edge[7][:, body] = 0x55  # alternating bits
    edge[8][:, body] = 0xAA
    scales(edge[9], -0.01)  # negative d (and dmin)
    edge[10, 1:] = quantized[0, 1:]  # a random block ahead of quantized ones
    edge[11, :, :] = quantized[8]  # a heavy quantized row with its d scaled up
    scales(edge[11], 0.5)
    return np.concatenate([quantized, rand, edge]).reshape(44, nb * size)


def main() -> None:
    lib = load_ggml_cpu()
    bind_graph_api(lib)
    rng = np.random.default_rng(20250612)
    x = activations(rng)
    xq = cpu_from_float(lib, GGMLType.Q8_K, x)
    arrays: dict[str, np.ndarray] = {"x": x, "xq": xq}
    differs: dict[str, int] = {}
    for qtype in LAYOUT:
        w = weights(lib, rng, qtype)
        arrays[f"w_{qtype.name}"] = w
        vec_dot = cpu_vec_dot(lib, qtype, w, xq, N)
        for m in ROWS:
            y = mul_mat(lib, qtype, w, x[:m], repack=False, threads=1)
            again = mul_mat(lib, qtype, w, x[:m], repack=False, threads=3)  # other chunks, the same numbers
            assert np.array_equal(y.view(np.uint32), again.view(np.uint32)), (qtype.name, m)
            differs[f"{qtype.name}_{m}"] = int((y.view(np.uint32) != vec_dot[:m].view(np.uint32)).sum())
            if m < 8:  # below 8 rows MUL_MAT is vec_dot's
                assert differs[f"{qtype.name}_{m}"] == 0, (qtype.name, m)
            arrays[f"y_{qtype.name}_{m}"] = y
    arrays["meta"] = np.array(json.dumps({
        "source": lib.source, "features": lib.features, "rows": list(ROWS), "columns": N,
        "product": "MUL_MAT with src0 in ggml_backend_cpu_buffer_type (tiled k-quant path from 8 rows)",
        "values_differing_from_vec_dot": differs, "script": "tools/make_kquant_tiled_fixtures.py"}))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"{lib.source}, features {lib.features}: {OUT.stat().st_size / 1e3:.0f} kB in {OUT}")
    print("values differing from vec_dot:", differs)


if __name__ == "__main__":
    main()
