"""Golden bytes of ggml's importance-weighted quantizers, for tests/engine/quant/test_weighted.py.

Calls ggml_quantize_chunk with quant_weights (and, for IQ4_NL / IQ4_XS, also without) from the libggml-base
shipped with llama-cpp-python through ctypes, on random rows of several scales (with all-zero blocks and a
near-zero row), on real rows of SmolLM2 when its file is found, with importance weights drawn like an imatrix's
(gamma-distributed, some zeros), and writes tests/fixtures/imatrix/kernels.npz: for each case `<case>.x`
(n_rows, n_cols) float32, `<case>.qw` (n_cols,) float32 and `<case>.<TYPE>[.plain]` the (n_rows, row_bytes) bytes.

  /tmp/llvenv/bin/python tools/make_imatrix_kernel_fixtures.py [--models-dir DIR]
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.quant import TYPES, GGMLType, dequantize_rows  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "imatrix" / "kernels.npz"
T = GGMLType
WEIGHTED = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS)
PLAIN = (T.IQ4_NL, T.IQ4_XS)  # their quantizer without quant_weights is not the _ref one: test it too


def load_ggml() -> ctypes.CDLL:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise SystemExit("llama_cpp is not installed in this Python")
    lib = ctypes.CDLL(str(Path(spec.origin).parent / "lib" / "libggml-base.so"))
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    return lib


def ggml_quantize(lib: ctypes.CDLL, qtype: GGMLType, x: np.ndarray, qw: np.ndarray | None) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    lib.ggml_quantize_init(int(qtype))
    out = np.zeros((x.shape[0], TYPES[qtype].row_bytes(x.shape[1])), np.uint8)
    w = None if qw is None else np.ascontiguousarray(qw, np.float32)
    lib.ggml_quantize_chunk(int(qtype), x.ctypes.data, out.ctypes.data, 0, x.shape[0], x.shape[1],
                            None if w is None else w.ctypes.data)
    return out


def cases(models_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(16)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    x = (rng.standard_normal((16, 512)) * rng.uniform(0.005, 3.0, (16, 1))).astype(np.float32)
    x[2, :64] = 0.0  # all-zero blocks
    x[5] *= np.float32(1e-6)  # tiny scales
    x[9, 100] = 40.0  # an outlier
    qw = (rng.gamma(0.5, 1.0, 512) + 1e-7).astype(np.float32)
    qw[40:60] = 0.0
    out["random"] = (x, qw)
    path = models_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if path.is_file():
        from engine.gguf import open_gguf  # noqa: PLC0415

        with open_gguf(path) as g:
            for name in ("blk.3.ffn_down.weight", "blk.5.attn_q.weight"):
                rows = dequantize_rows(g.rows(name)[:8], g.tensors[name].qtype)
                imp = (rng.gamma(0.7, 1.0, rows.shape[1]) * 1e-2).astype(np.float32)
                out[name.replace(".weight", "")] = (rows, imp)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", default=os.environ.get("GGUF_LENS_MODELS_DIR",
                                                           str(Path.home() / ".cache" / "gguf-lens" / "models")))
    args = ap.parse_args()
    lib = load_ggml()
    arrays: dict[str, np.ndarray] = {}
    for case, (x, qw) in cases(Path(args.models_dir)).items():
        arrays[f"{case}.x"], arrays[f"{case}.qw"] = x, qw
        for qtype in WEIGHTED:
            if x.shape[1] % TYPES[qtype].block_size:
                continue
            arrays[f"{case}.{qtype.name}"] = ggml_quantize(lib, qtype, x, qw)
            if qtype in PLAIN:
                arrays[f"{case}.{qtype.name}.plain"] = ggml_quantize(lib, qtype, x, None)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes, {len(arrays)} arrays)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
