"""Golden MXFP4 bytes and values from llama.cpp itself, for tests/engine/quant/test_mxfp4.py.

Through ctypes on the libggml-base shipped with llama-cpp-python (built from its sdist, see README.md), on random
rows at many scales, real rows of the catalog models and edge blocks (zeros, subnormals, infinities, NaN, values
just below and at powers of two, ties between codes):
  ggml_quantize_chunk(GGML_TYPE_MXFP4)             -> `<case>_q` (n_rows, 17 * n_blocks) uint8
  type_traits[MXFP4].to_float on random bytes      -> `dq_bytes`, `dq_values` (every exponent byte 0..255)
Writes tests/fixtures/quant/mxfp4.npz (inputs as `<case>_x`).

  /tmp/llvenv/bin/python tools/make_mxfp4_fixtures.py [--models-dir ~/.cache/gguf-lens/models]
"""
from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from make_quant_fixtures import load_ggml  # noqa: E402

from engine.gguf import open_gguf  # noqa: E402
from engine.quant import dequantize_rows  # noqa: E402

MXFP4 = 39
BLOCK_BYTES = 17
OUT = ROOT / "tests" / "fixtures" / "quant" / "mxfp4.npz"


class TypeTraits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


def quantize(lib: ctypes.CDLL, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    n_rows, n_cols = x.shape
    out = np.zeros((n_rows, n_cols // 32 * BLOCK_BYTES), np.uint8)
    written = lib.ggml_quantize_chunk(MXFP4, x.ctypes.data, out.ctypes.data, 0, n_rows, n_cols, None)
    assert written == out.size
    return out


def to_float(lib: ctypes.CDLL, blocks: np.ndarray) -> np.ndarray:
    lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    traits = lib.ggml_get_type_traits(MXFP4).contents
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(traits.to_float)
    blocks = np.ascontiguousarray(blocks, np.uint8)
    out = np.zeros(blocks.size // BLOCK_BYTES * 32, np.float32)
    fn(blocks.ctypes.data, out.ctypes.data, out.size)
    return out.reshape(-1, 32)


def cases(rng: np.random.Generator, models_dir: Path | None) -> dict[str, np.ndarray]:
    out = {
        "normal": (rng.standard_normal((64, 512)) * 0.02).astype(np.float32),
        "uniform": rng.uniform(-1.0, 1.0, (16, 512)).astype(np.float32),
        "heavy": (rng.standard_t(2.0, (16, 512)) * 0.02).astype(np.float32),
        "scales": (rng.standard_normal((64, 64)) * np.float32(10.0) ** rng.integers(-45, 38, (64, 1))).astype(np.float32),
    }
    n = 32
    edges = [
        np.zeros(n), np.full(n, 0.5), np.full(n, -0.25), np.where(np.arange(n) % 2, -0.0, 0.0),
        rng.standard_normal(n) * 1e-40, rng.standard_normal(n) * 1e-44,  # subnormal maxima
        np.where(np.arange(n) == 3, np.inf, rng.standard_normal(n)),  # an infinity in the block
        np.where(np.arange(n) == 7, np.nan, rng.standard_normal(n)),  # a NaN in the block
        np.where(np.arange(n) == 9, -np.inf, 0.0),
        np.full(n, 3.0e38), rng.standard_normal(n) * 1e38,  # the largest scales
        rng.integers(-12, 13, n) / 2.0, rng.integers(-12, 13, n) / 4.0 + 0.125,  # codes and ties between them
    ]
    for k in range(-20, 21, 3):  # amax just below, at and just above powers of two (log2f rounds up below them)
        p = np.float32(2.0) ** k
        for a in (np.nextafter(p, np.float32(0)), np.nextafter(np.nextafter(p, np.float32(0)), np.float32(0)), p,
                  np.nextafter(p, np.float32(np.inf)), p * np.float32(1 - 2**-13)):
            row = rng.uniform(-1, 1, n).astype(np.float32) * a
            row[rng.integers(n)] = a
            edges.append(row)
    out["edges"] = np.concatenate(edges).astype(np.float32).reshape(-1, 32)
    if models_dir is not None:  # real weights of the catalog models
        for stem, name in (("SmolLM2-135M-Instruct.Q4_1.gguf", "blk.2.ffn_up.weight"),
                           ("gemma-3-270m-q4_k_m.gguf", "blk.4.attn_q.weight")):
            path = models_dir / stem
            if path.exists():
                g = open_gguf(path)
                t = g.tensors[name]
                out[f"model_{stem.split('-')[0].lower()}"] = dequantize_rows(g.rows(name), t.qtype)[:16]
                g.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models-dir", type=Path, default=Path.home() / ".cache" / "gguf-lens" / "models")
    args = ap.parse_args()
    lib, source = load_ggml()
    rng = np.random.default_rng(39)
    arrays: dict[str, np.ndarray] = {"source": np.array(source)}
    for name, x in cases(rng, args.models_dir).items():
        arrays[f"{name}_x"] = x
        arrays[f"{name}_q"] = quantize(lib, x)
    raw = rng.integers(0, 256, (256, BLOCK_BYTES), dtype=np.uint8)
    raw[:, 0] = np.arange(256, dtype=np.uint8)  # every exponent byte
    arrays["dq_bytes"] = raw
    arrays["dq_values"] = to_float(lib, raw)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT} ({source})")


if __name__ == "__main__":
    main()
