"""Golden quantization bytes from llama.cpp itself, for tests/engine/test_quantize.py.

Calls ggml_quantize_chunk (no importance matrix) from the libggml-base shipped with
llama-cpp-python through ctypes, on random rows, real rows of the two test models and edge
blocks, for every type engine.quant.quantize supports, and writes
  tests/fixtures/quant/inputs.npz   float32 inputs, one array per case, plus `source`
  tests/fixtures/quant/<TYPE>.npz   llama.cpp's bytes, one (n_rows, row_bytes) uint8 array per case

With --check it writes nothing and instead compares engine.quant.quantize with llama.cpp on
larger inputs (several million random weights and whole tensors of the test models), printing
the mismatching blocks per type; it exits 1 on any mismatch.

Run with a Python that has llama-cpp-python (built from source) installed:
  /work/llvenv/bin/python tools/make_quant_fixtures.py [--models-dir DIR] [--check]
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
from engine.quant import TYPES, GGMLType, dequantize, quantize  # noqa: E402

OUT_DIR = ROOT / "tests" / "fixtures" / "quant"
QUANT_TYPES = ["F16", "BF16", "Q8_0", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "Q6_K", "Q5_K", "Q4_K", "Q3_K", "Q2_K"]
WIDTH = 512  # columns of the synthetic cases: two k-quant super-blocks, sixteen legacy blocks
MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf", ["blk.0.attn_q.weight", "blk.3.ffn_down.weight", "token_embd.weight"]),
    "gemma3": ("gemma-3-270m-q4_k_m.gguf", ["blk.0.attn_v.weight", "blk.5.ffn_down.weight", "token_embd.weight"]),
}


def load_ggml() -> tuple[ctypes.CDLL, str]:
    """libggml-base from the installed llama_cpp package, with ggml_quantize_chunk typed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        raise SystemExit("llama-cpp-python is not installed in this Python")
    pkg = Path(spec.origin).parent
    lib_path = next(p for p in sorted((pkg / "lib").glob("libggml-base.so*")))
    lib = ctypes.CDLL(str(lib_path))
    fn = lib.ggml_quantize_chunk
    fn.restype = ctypes.c_size_t
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    version = "unknown"
    dist = next(pkg.parent.glob("llama_cpp_python-*.dist-info"), None)
    if dist is not None:
        version = dist.name.removeprefix("llama_cpp_python-").removesuffix(".dist-info")
    return lib, f"llama-cpp-python {version}, {lib_path.name}"


def ggml_quantize(lib: ctypes.CDLL, x: np.ndarray, qtype: GGMLType) -> np.ndarray:
    """llama.cpp's bytes for float32 rows `x` (n_rows, n_cols), imatrix = NULL."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n_rows, n_cols = x.shape
    info = TYPES[qtype]
    row_bytes = info.row_bytes(n_cols)
    out = np.zeros((n_rows, row_bytes), dtype=np.uint8)
    written = lib.ggml_quantize_chunk(int(qtype), x.ctypes.data, out.ctypes.data, 0, n_rows, n_cols, None)
    assert written == out.size, (qtype.name, written, out.size)
    return out


def random_cases(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Normal, uniform and heavy-tailed rows, at several scales."""
    scale = np.float32(0.02)
    return {
        "normal": (rng.standard_normal((160, WIDTH)) * scale).astype(np.float32),
        "uniform": rng.uniform(-1.0, 1.0, (8, WIDTH)).astype(np.float32),
        "heavy": (rng.standard_t(2.0, (8, WIDTH)) * scale).astype(np.float32),
        "shifted": (rng.standard_normal((8, WIDTH)) * scale + np.float32(0.05)).astype(np.float32),
        "one_superblock": (rng.standard_normal((3, 256)) * scale).astype(np.float32),
        "narrow": (rng.standard_normal((5, 96)) * scale).astype(np.float32),  # 32-weight block types only
        "huge": (rng.standard_normal((4, WIDTH)) * 1e30).astype(np.float32),  # fp16 scales overflow to inf
    }


def edge_blocks(rng: np.random.Generator) -> np.ndarray:
    """Super-block sized (256) edge patterns, two per row of WIDTH."""
    n = 256

    def normal() -> np.ndarray:
        return rng.standard_normal(n).astype(np.float32)

    patterns = [
        np.zeros(n),
        np.full(n, 0.5),
        np.full(n, -0.25),
        np.where(np.arange(n) == 17, 1000.0, normal() * 0.01),  # one huge outlier
        np.where(np.arange(n) == 200, -3.0e4, normal() * 0.01),  # one huge negative outlier
        normal() * 1e-40,  # float32 subnormals
        -np.abs(normal()),  # negative only
        np.abs(normal()) + 0.1,  # positive only, min > 0
        normal() * 1e-20,  # below GROUP_MAX_EPS
        np.where(np.arange(n) % 2 == 0, -0.0, 0.0),  # signed zeros
        normal() * 1e5,  # scales and mins overflow fp16
        np.where(rng.random(n) < 0.05, normal(), 0.0),  # sparse
        np.concatenate([np.zeros(n // 2), normal()[: n // 2]]),  # zero sub-blocks inside a super-block
        rng.integers(-8, 8, n).astype(np.float64),  # exact small integers: rounding ties
        rng.integers(-8, 8, n) + 0.5,  # halves: more ties
        np.where(np.arange(n) == 5, -1.0, 1.0),  # constant but one
    ]
    return np.concatenate(patterns).astype(np.float32).reshape(-1, WIDTH)


def non_finite(rng: np.random.Generator) -> np.ndarray:
    """Rows sprinkled with inf, -inf and NaN: only for --check, since what C makes of NaN is x86's choice."""
    x = (rng.standard_normal((128, 1024)) * 0.02).astype(np.float32)
    u = rng.random(x.shape)
    x[u < 0.002] = np.inf
    x[(u > 0.5) & (u < 0.502)] = -np.inf
    x[u > 0.998] = np.nan
    return x


def model_cases(models_dir: Path) -> dict[str, np.ndarray]:
    """Dequantized rows of a few tensors of each test model, whole rows and reflowed to WIDTH."""
    from gguf import GGUFReader

    cases: dict[str, np.ndarray] = {}
    for key, (file_name, tensor_names) in MODELS.items():
        path = models_dir / file_name
        if not path.exists():
            print(f"skipping {path}: not found")
            continue
        tensors = {t.name: t for t in GGUFReader(path).tensors}
        for i, name in enumerate(tensor_names):
            t = tensors[name]
            n_cols = int(t.shape[0])
            raw = np.asarray(t.data).view(np.uint8).reshape(int(t.shape[1]), -1)
            rows = dequantize(raw[:8], GGMLType(int(t.tensor_type))).reshape(8, n_cols)
            cases[f"{key}_{i}_reflowed"] = rows.reshape(-1)[: 4 * WIDTH].reshape(4, WIDTH)
            if n_cols % 256 == 0:
                cases[f"{key}_{i}_rows"] = rows[:2]
    return cases


def check_cases(models_dir: Path, rng: np.random.Generator, layers: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Bigger inputs for --check: random rows and every weight matrix of some layers, reflowed to 1024 columns."""
    from gguf import GGUFReader

    cases = {
        "normal": (rng.standard_normal((2048, 1024)) * 0.02).astype(np.float32),
        "heavy": (rng.standard_t(1.5, (1024, 1024)) * 0.02).astype(np.float32),
        "uniform": rng.uniform(-2.0, 3.0, (512, 1024)).astype(np.float32),
        "edge": np.tile(edge_blocks(rng).reshape(-1, 1024), (4, 1)),
        "non_finite": non_finite(rng),
    }
    for key, (file_name, _) in MODELS.items():
        path = models_dir / file_name
        if not path.exists():
            continue
        for t in GGUFReader(path).tensors:
            prefixes = tuple(f"blk.{i}." for i in layers)
            if len(t.shape) == 2 and (t.name.startswith(prefixes) or t.name == "token_embd.weight"):
                raw = np.asarray(t.data).view(np.uint8).reshape(-1)
                if t.name == "token_embd.weight":  # the first 4096 rows are plenty
                    raw = raw[: raw.size // int(t.shape[1]) * 4096]
                w = dequantize(raw, GGMLType(int(t.tensor_type)))
                cases[f"{key}:{t.name}"] = w[: w.size // 1024 * 1024].reshape(-1, 1024)
    return cases


def check(lib: ctypes.CDLL, cases: dict[str, np.ndarray]) -> bool:
    """Compare engine.quant.quantize with ggml_quantize_chunk on every case and type; True when all match."""
    import time

    all_ok = True
    for name in QUANT_TYPES:
        qtype = GGMLType[name]
        info = TYPES[qtype]
        n_weights = n_bad = 0
        ours_s = theirs_s = 0.0
        for case, x in cases.items():
            t0 = time.perf_counter()
            theirs = ggml_quantize(lib, x, qtype)
            t1 = time.perf_counter()
            ours = quantize(x, qtype)
            ours_s += time.perf_counter() - t1
            theirs_s += t1 - t0
            bad = (ours.reshape(-1, info.type_size) != theirs.reshape(-1, info.type_size)).any(axis=1)
            n_weights += x.size
            if bad.any():
                n_bad += int(bad.sum())
                print(f"  {name} {case}: {int(bad.sum())} of {bad.size} blocks differ, first {np.flatnonzero(bad)[:5]}")
        all_ok &= n_bad == 0
        print(f"{name:5s} {n_weights / 1e6:6.1f}M weights: {'byte-exact' if n_bad == 0 else f'{n_bad} blocks differ'}"
              f"  (ours {n_weights / ours_s / 1e6:.1f}M/s, llama.cpp {n_weights / theirs_s / 1e6:.1f}M/s)")
    return all_ok


def main() -> None:
    """Build the inputs, ask llama.cpp for every type's bytes, write the .npz files (or --check)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models-dir", type=Path,
                        default=Path(os.environ.get("GGUF_LENS_MODELS_DIR", "/work/models")))
    parser.add_argument("--check", action="store_true", help="compare with llama.cpp at scale; write nothing")
    parser.add_argument("--layers", type=int, nargs="*", default=[0, 7], help="model layers used by --check")
    args = parser.parse_args()

    lib, source = load_ggml()
    if args.check:
        ok = check(lib, check_cases(args.models_dir, np.random.default_rng(7), tuple(args.layers)))
        raise SystemExit(0 if ok else 1)
    rng = np.random.default_rng(20240601)
    cases = random_cases(rng)
    cases["edge"] = edge_blocks(rng)
    cases.update(model_cases(args.models_dir))

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT_DIR / "inputs.npz", source=np.array(source), **cases)
    for name in QUANT_TYPES:
        qtype = GGMLType[name]
        block = TYPES[qtype].block_size
        outputs = {case: ggml_quantize(lib, x, qtype) for case, x in cases.items() if x.shape[1] % block == 0}
        np.savez_compressed(OUT_DIR / f"{name}.npz", **outputs)
    total = sum(p.stat().st_size for p in OUT_DIR.glob("*.npz"))
    print(f"{len(cases)} cases x {len(QUANT_TYPES)} types from {source}: {total / 1e6:.2f} MB in {OUT_DIR}")


if __name__ == "__main__":
    main()
