"""Golden i-quant fixtures from gguf-py and llama.cpp's ggml, for tests/engine/quant/test_iquants.py and
tests/engine/kernels/test_iquant_kernels.py.

(a) dequantization: for each of IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, blocks
    that llama.cpp quantized (ggml_quantize_chunk, an all-ones importance matrix where it needs one), random
    bytes with small fp16 scales, and edge blocks (zero, every bit set, alternating bits, the largest, a
    subnormal, a negative, an infinite and a NaN scale); gguf-py's `dequantize` of them, which the tool
    checks against ggml's own to_float (dequantize_row_iq*) on every block;
(b) products: ggml-cpu's vec_dot (ggml_vec_dot_iq*_q8_K, ggml_vec_dot_iq4_nl_q8_0) of 20 weight rows
    (8 quantized by llama.cpp, 8 random, 4 edge) with 9 activation rows quantized by ggml-cpu's from_float
    (Q8_K, Q8_0 for IQ4_NL), and llama.cpp's MUL_MAT on the CPU backend for 1, 4 and 9 activation rows (below
    8 rows MUL_MAT is vec_dot's; from 8 the IQ types take the tiled path, and IQ4_NL batches of 2+ rows
    llamafile's tinyBLAS: the meta records how many of those values differ from vec_dot's); and for IQ4_NL
    the first 16 rows in the CPU_REPACK buffer (iq4_nl_8x8, what llama.cpp runs for rows in eights).

Writes tests/fixtures/quant/iquants.npz (blocks_<T>, values_<T> as float32 bits) and
tests/fixtures/kernels/iquant_dot.npz (x, xq_<VDT>, w_<T>, dot_<T> (9, 20), mul_mat_<T>_<m>,
mul_mat_repack_IQ4_NL_<m> (m, 16), meta JSON).

Run with a Python that has llama-cpp-python (built from source, README.md) and gguf:
  /tmp/llvenv/bin/python tools/make_iquant_fixtures.py
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from make_kernel_fixtures import cpu_from_float, cpu_vec_dot, load_ggml_cpu
from make_q4k_repack_fixtures import bind_graph_api, mul_mat

from engine.quant import TYPES, GGMLType

DEQUANT_OUT = ROOT / "tests" / "fixtures" / "quant" / "iquants.npz"
DOT_OUT = ROOT / "tests" / "fixtures" / "kernels" / "iquant_dot.npz"
IQ_TYPES = ["IQ4_NL", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"]
ROWS = (1, 4, 9)
N = {"IQ4_NL": 160}  # five IQ4_NL blocks: pairs, then the odd one of vec_dot's scalar tail
N_DEFAULT = 768  # three super-blocks


class _TypeTraits(ctypes.Structure):
    """struct ggml_type_traits in ggml.h."""

    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def ggml_dequantize(lib, qtype: GGMLType, blocks: np.ndarray) -> np.ndarray:
    """ggml's to_float (dequantize_row_iq*) of (n_blocks, type_size) bytes -> flat float32."""
    lib.base.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    lib.base.ggml_get_type_traits.argtypes = [ctypes.c_int]
    fn = _TO_FLOAT(lib.base.ggml_get_type_traits(int(qtype)).contents.to_float)
    blocks = np.ascontiguousarray(blocks)
    out = np.zeros(len(blocks) * TYPES[qtype].block_size, np.float32)
    fn(blocks.ctypes.data, out.ctypes.data, out.size)
    return out


def ggml_quantize_iq(lib, x: np.ndarray, qtype: GGMLType) -> np.ndarray:
    """llama.cpp's ggml_quantize_chunk of float32 rows with an all-ones importance matrix."""
    fn = lib.base.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_void_p]
    x = np.ascontiguousarray(x, np.float32)
    rows, cols = x.shape
    out = np.zeros((rows, TYPES[qtype].row_bytes(cols)), np.uint8)
    imatrix = np.ones(cols, np.float32)
    assert fn(int(qtype), x.ctypes.data, out.ctypes.data, 0, rows, cols, imatrix.ctypes.data) == out.size
    return out


def set_scale(blocks: np.ndarray, qtype: GGMLType, value) -> None:
    """Write the fp16 super-block scale of every block (..., type_size) in place (IQ1_M: the top nibbles)."""
    half = np.broadcast_to(np.asarray(value, np.float32), blocks.shape[:-1]).astype("<f2").view("<u2")
    if qtype != GGMLType.IQ1_M:
        blocks[..., 0:2] = half[..., None].view(np.uint8)
        return
    words = np.ascontiguousarray(blocks[..., 48:56]).view("<u2") & np.uint16(0x0FFF)
    for j in range(4):
        words[..., j] |= ((half >> np.uint16(4 * j)) & np.uint16(0xF)) << np.uint16(12)
    blocks[..., 48:56] = words.view(np.uint8)


def block_cases(lib, rng: np.random.Generator, qtype: GGMLType) -> np.ndarray:
    """8 llama.cpp-quantized blocks, 8 random ones and 10 edge blocks of `qtype` (26, type_size)."""
    info = TYPES[qtype]
    x = (rng.standard_normal((1, 8 * info.block_size)) * 0.05).astype(np.float32)
    quantized = ggml_quantize_iq(lib, x, qtype).reshape(8, info.type_size)
    rand = rng.integers(0, 256, (8, info.type_size), dtype=np.uint8)
    set_scale(rand, qtype, (rng.standard_normal(8) * 0.01).astype(np.float32))
    edge = rng.integers(0, 256, (10, info.type_size), dtype=np.uint8)
    edge[0] = 0
    edge[1] = 0xFF
    edge[2], edge[3] = 0x55, 0xAA
    for i, v in enumerate([1.0, 1.0, 1.0, 65504.0, 6e-8, -0.02, np.inf, np.nan]):
        set_scale(edge[2 + i : 3 + i], qtype, v)
    return np.concatenate([quantized, rand, edge])


def dequant_fixtures(lib, rng: np.random.Generator) -> dict[str, np.ndarray]:
    from gguf import GGMLQuantizationType
    from gguf import quants as gguf_quants

    arrays = {}
    for name in IQ_TYPES:
        qtype = GGMLType[name]
        blocks = block_cases(lib, rng, qtype)
        with np.errstate(all="ignore"):
            values = gguf_quants.dequantize(blocks, GGMLQuantizationType[name]).reshape(-1).astype(np.float32)
        theirs = ggml_dequantize(lib, qtype, blocks)
        same = (values.view(np.uint32) == theirs.view(np.uint32)) | (np.isnan(values) & np.isnan(theirs))
        assert same.all(), (name, int((~same).sum()))
        arrays[f"blocks_{name}"] = blocks
        arrays[f"values_{name}"] = values.view(np.uint32)
    return arrays


def activations(rng: np.random.Generator, n: int) -> np.ndarray:
    """9 activation rows: typical ones with outlier channels, and the edges of the Q8 quantizers."""
    x = (rng.standard_normal((9, n)) * rng.uniform(0.1, 3.0, (9, 1))).astype(np.float32)
    x[:, ::61] *= 9
    x[1, :32] = 0.0  # a zero block
    x[2] = np.float32(1.0)  # the products sum the weights
    x[3, 5] = 1e4  # one huge value
    x[4] = (rng.standard_t(1.5, n) * 0.1).astype(np.float32)
    x[5] = (rng.integers(-254, 255, n) + 0.5) / np.float32(254)  # halves after scaling
    return x


def weights(lib, rng: np.random.Generator, qtype: GGMLType, n: int) -> np.ndarray:
    """20 weight rows of n columns: 8 quantized by llama.cpp, 8 random bytes, 4 edge rows."""
    info = TYPES[qtype]
    nb = n // info.block_size
    normal = (rng.standard_normal((8, n)) * 0.02).astype(np.float32)
    normal[4:, ::97] *= 20
    quantized = ggml_quantize_iq(lib, normal, qtype)
    rand = rng.integers(0, 256, (8, nb, info.type_size), dtype=np.uint8)
    set_scale(rand, qtype, (rng.standard_normal((8, nb)) * 0.005).astype(np.float32))
    edge = rng.integers(0, 256, (4, nb, info.type_size), dtype=np.uint8)
    set_scale(edge, qtype, np.float32(0.01))
    edge[0] = 0xFF
    set_scale(edge[0], qtype, 1.0)
    set_scale(edge[1], qtype, 65504.0)  # the largest fp16 scale
    edge[2, ::2] = 0  # zero blocks between random ones
    set_scale(edge[3], qtype, -0.01)
    return np.concatenate([quantized, rand.reshape(8, -1), edge.reshape(4, -1)])


def dot_fixtures(lib, rng: np.random.Generator) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    differs: dict[str, int] = {}
    for name in IQ_TYPES:
        qtype = GGMLType[name]
        n = N.get(name, N_DEFAULT)
        vdt = GGMLType(lib.traits(qtype).vec_dot_type)
        x = arrays.setdefault(f"x_{n}", activations(rng, n))
        xq = arrays.setdefault(f"xq_{vdt.name}_{n}", cpu_from_float(lib, vdt, x))
        w = weights(lib, rng, qtype, n)
        arrays[f"w_{name}"] = w
        dot = cpu_vec_dot(lib, qtype, w, xq, n)
        arrays[f"dot_{name}"] = dot
        for m in ROWS:
            y = mul_mat(lib, qtype, w, x[:m], repack=False, threads=1)
            differs[f"{name}_{m}"] = int((y.view(np.uint32) != dot[:m].view(np.uint32)).sum())
            if m == 1 or (m < 8 and name != "IQ4_NL"):  # IQ4_NL batches go through tinyBLAS
                assert differs[f"{name}_{m}"] == 0, (name, m)
            arrays[f"mul_mat_{name}_{m}"] = y
            if name == "IQ4_NL":  # rows in eights: the CPU_REPACK buffer's iq4_nl_8x8 gemv / gemm
                arrays[f"mul_mat_repack_{name}_{m}"] = mul_mat(lib, qtype, w[:16], x[:m], repack=True, threads=1)
    arrays["meta"] = np.array(json.dumps({
        "source": lib.source, "features": lib.features, "rows": list(ROWS), "gguf": _gguf_version(),
        "product": "ggml-cpu vec_dot; MUL_MAT with src0 in ggml_backend_cpu_buffer_type",
        "mul_mat_values_differing_from_vec_dot": differs, "script": "tools/make_iquant_fixtures.py"}))
    print("MUL_MAT values differing from vec_dot:", differs)
    return arrays


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def main() -> None:
    lib = load_ggml_cpu()
    bind_graph_api(lib)
    rng = np.random.default_rng(20251201)
    for path, arrays in ((DEQUANT_OUT, dequant_fixtures(lib, rng)), (DOT_OUT, dot_fixtures(lib, rng))):
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **arrays)
        print(f"{lib.source}: {path.stat().st_size / 1e3:.0f} kB in {path}")


if __name__ == "__main__":
    main()
