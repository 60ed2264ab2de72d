"""Golden activation bytes and dot products from llama.cpp's ggml-cpu, for tests/engine/kernels.

ggml-cpu exports `ggml_get_type_traits_cpu(type)`, whose `from_float` quantizes an activation row
to the type's bytes and whose `vec_dot` is the product one row of a matrix-vector multiply runs.
This script calls both through ctypes, from the libggml-cpu shipped with llama-cpp-python, and writes
  tests/fixtures/kernels/activations.npz   float32 rows (`x_<case>`) and ggml's bytes (`<TYPE>_<case>`)
                                           for the vec_dot types Q8_0, Q8_1, F16 and BF16
  tests/fixtures/kernels/dot_<TYPE>.npz    per weight type: weight blocks `w_<wcase>`, activations
                                           `x_<xcase>` with ggml's bytes for them `xq_<xcase>`, and
                                           vec_dot results `dot_<wcase>_<xcase>` (m, n_rows) float32
  tests/fixtures/kernels/source.json       llama-cpp-python version and the CPU features ggml-cpu was built with

The numbers depend on how ggml-cpu was compiled (its SIMD path fixes the summation order); these
were made by an AVX2 + AVX-512 (F, VNNI, BF16) build, and source.json records the features.

The ctypes binding is importable for other fixture scripts (the k-quant ones call it for Q8_K):
  ggml = load_ggml_cpu()
  xq = cpu_from_float(ggml, GGMLType.Q8_0, x)             # ggml's bytes for float32 rows x
  s = cpu_vec_dot(ggml, GGMLType.Q4_0, w_blocks, xq, n)  # (m, n_rows) vec_dot values

Run with a Python that has llama-cpp-python (built from source) installed:
  /tmp/llvenv/bin/python tools/make_kernel_fixtures.py
"""
from __future__ import annotations

import ctypes
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from make_quant_fixtures import load_ggml

from engine.quant import GGMLType, quantize

OUT_DIR = ROOT / "tests" / "fixtures" / "kernels"
WEIGHT_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
ACTIVATION_TYPES = ["Q8_0", "Q8_1", "F16", "BF16"]
WIDTH = 256  # columns of most cases: 8 legacy blocks, 4 chunks of ggml's 64-float SIMD loop
FEATURES = ["avx", "avx2", "avx512", "avx512_vnni", "avx512_bf16", "avx_vnni", "f16c", "fma", "llamafile"]

_FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class _TypeTraitsCpu(ctypes.Structure):
    """struct ggml_type_traits_cpu in ggml-cpu.h."""

    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


@dataclass
class GgmlCpu:
    """libggml-base and libggml-cpu loaded through ctypes, with where they came from."""

    base: ctypes.CDLL
    cpu: ctypes.CDLL
    source: str
    features: dict[str, bool]

    def traits(self, qtype: GGMLType | int) -> _TypeTraitsCpu:
        """The CPU type traits of `qtype`."""
        return self.cpu.ggml_get_type_traits_cpu(int(qtype)).contents

    def row_size(self, qtype: GGMLType | int, n: int) -> int:
        """Bytes of a row of n values of `qtype`, as ggml_row_size (its sizeof, e.g. 36 for Q8_1)."""
        return int(self.base.ggml_row_size(int(qtype), n))


def load_ggml_cpu() -> GgmlCpu:
    """libggml-cpu from the installed llama_cpp package (next to the libggml-base load_ggml finds), initialised."""
    base, source = load_ggml()
    lib_dir = Path(base._name).parent
    cpu = ctypes.CDLL(str(next(p for p in sorted(lib_dir.glob("libggml-cpu.so*")))))
    cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(_TypeTraitsCpu)
    cpu.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    cpu.ggml_cpu_init.restype = None
    cpu.ggml_cpu_init()
    base.ggml_row_size.restype = ctypes.c_size_t
    base.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    features = {}
    for name in FEATURES:
        fn = getattr(cpu, f"ggml_cpu_has_{name}")
        fn.restype = ctypes.c_int
        features[name] = bool(fn())
    return GgmlCpu(base, cpu, source, features)


def cpu_from_float(lib: GgmlCpu, qtype: GGMLType | int, x: np.ndarray) -> np.ndarray:
    """ggml-cpu's from_float of `qtype` on float32 rows x (m, n) or (n,): uint8 (m, row_bytes) or (row_bytes,)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    x2 = x.reshape(1, -1) if x.ndim == 1 else x
    m, n = x2.shape
    fn = _FROM_FLOAT(lib.traits(qtype).from_float)
    out = np.zeros((m, lib.row_size(qtype, n)), dtype=np.uint8)
    for i in range(m):
        fn(x2[i].ctypes.data, out[i].ctypes.data, n)
    return out.reshape(-1) if x.ndim == 1 else out


def cpu_vec_dot(lib: GgmlCpu, qtype: GGMLType | int, wblocks: np.ndarray, xq: np.ndarray, n: int) -> np.ndarray:
    """ggml-cpu's vec_dot of weight rows `wblocks` (n_rows, row_bytes) of `qtype` with activation bytes
    `xq` (m, bytes) or (bytes,) of its vec_dot_type, n values per row: float32 (m, n_rows) or (n_rows,)."""
    wblocks = np.ascontiguousarray(wblocks, dtype=np.uint8)
    xq = np.ascontiguousarray(xq, dtype=np.uint8)
    xq2 = xq.reshape(1, -1) if xq.ndim == 1 else xq
    fn = _VEC_DOT(lib.traits(qtype).vec_dot)
    out = np.zeros((len(xq2), len(wblocks)), dtype=np.float32)
    s = ctypes.c_float()
    for i, y in enumerate(xq2):
        for r, w in enumerate(wblocks):
            fn(n, ctypes.addressof(s), 0, w.ctypes.data, 0, y.ctypes.data, 0, 1)
            out[i, r] = s.value
    return out.reshape(-1) if xq.ndim == 1 else out


# ---- inputs


def activation_cases(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Activation rows of WIDTH floats: typical, scaled, and the edges of the Q8 quantizers."""
    n = WIDTH
    normal = rng.standard_normal((6, n)).astype(np.float32)
    edge = np.zeros((12, n), dtype=np.float32)
    edge[1, 37] = 1e4  # one huge value among small ones
    edge[1] += rng.standard_normal(n).astype(np.float32) * 0.01
    edge[2, :] = rng.integers(-127, 128, n) / np.float32(127) * np.float32(3)  # exact multiples of d: ties
    edge[3, :] = (rng.integers(-254, 255, n) + 0.5) / np.float32(254)  # halves after scaling
    edge[4, :] = rng.standard_normal(n) * np.float32(1e-39)  # float32 subnormals
    edge[5, :] = rng.standard_normal(n) * np.float32(1e5)  # d overflows fp16
    edge[6, :] = np.float32(-2.5)  # constant blocks
    edge[7, ::2] = -0.0
    edge[8, :] = rng.standard_normal(n) * np.float32(1e-36)  # 127/amax overflows float32 in some blocks
    edge[9, :] = rng.standard_t(1.5, n) * np.float32(0.1)  # heavy tail
    edge[10, 64] = 3e38  # one near FLT_MAX
    edge[11, :] = np.float32(65519.0) * np.sign(rng.standard_normal(n))  # fp16 rounding boundary
    return {"normal": normal * np.float32(0.5), "edge": edge,
            "narrow": rng.standard_normal((3, 96)).astype(np.float32)}  # leftovers past ggml's 64-float steps


def non_finite_cases(rng: np.random.Generator) -> np.ndarray:
    """Rows with NaN and infinities: the x86 quantizers' lane order and saturation show here."""
    x = rng.standard_normal((4, WIDTH)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 40] = np.inf
    x[2, 100] = -np.inf
    x[3, 200] = np.frombuffer(np.uint32(0x7F812345).tobytes(), dtype=np.float32)[0]  # a signalling NaN
    x[3, 201] = np.nan
    return x


def _f16_bytes(v: np.ndarray | float) -> np.ndarray:
    """Little-endian fp16 bytes of v (a scalar gives 2 bytes)."""
    return np.atleast_1d(np.asarray(v, dtype="<f2")).view(np.uint8)


def weight_cases(rng: np.random.Generator, qtype: GGMLType, n: int) -> dict[str, np.ndarray]:
    """Weight blocks (n_rows, row_bytes) of `qtype`: quantized normal rows, random bytes and edge blocks."""
    name = qtype.name
    normal = (rng.standard_normal((24, n)) * 0.05).astype(np.float32)
    if name in ("F32", "F16", "BF16"):
        raw = quantize(normal, qtype)
        tiny = quantize((rng.standard_normal((4, n)) * 1e-39).astype(np.float32), qtype)  # subnormal weights
        big = quantize((rng.standard_normal((4, n)) * 6e4).astype(np.float32), qtype)
        zeros = np.zeros((2, raw.shape[1]), dtype=np.uint8)
        return {"quantized": raw, "edge": np.concatenate([tiny, big, zeros])}
    quantized = quantize(normal, qtype)
    row_bytes = quantized.shape[1]
    block = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34}[name]
    nb = row_bytes // block
    rand = rng.integers(0, 256, (16, row_bytes), dtype=np.uint8).reshape(16, nb, block)
    scales = _f16_bytes(rng.standard_normal((16, nb, 2)) * 0.01).reshape(16, nb, 4)
    head = 4 if name in ("Q4_1", "Q5_1") else 2
    rand[..., :head] = scales[..., :head]
    edge = rng.integers(0, 256, (8, nb, block), dtype=np.uint8)
    edge[..., :head] = scales[:8, :, :head]
    edge[0] = 0  # all-zero blocks
    edge[1, :, :2] = _f16_bytes(65504.0)  # max fp16 scale
    if head == 4:
        edge[1, :, 2:4] = _f16_bytes(-65504.0)  # max |m|
    edge[2, :, head:] = 0x00  # every weight at the low extreme
    edge[3, :, head:] = 0xFF  # every weight at the high extreme
    if name == "Q8_0":
        edge[2, :, 2:] = 0x81  # -127
        edge[3, :, 2:] = 0x7F  # 127
    edge[4, :, :2] = _f16_bytes(6e-8)  # subnormal fp16 scale
    edge[5, ::2] = 0  # zero blocks between random ones
    return {"quantized": quantized, "random": rand.reshape(16, -1), "edge": edge.reshape(8, -1)}


def main() -> None:
    """Ask ggml-cpu for the activation bytes and the dot products of every case and write the .npz files."""
    lib = load_ggml_cpu()
    rng = np.random.default_rng(20240612)
    OUT_DIR.mkdir(parents=True, exist_ok=True)

    acts = activation_cases(rng)
    acts["nonfinite"] = non_finite_cases(rng)
    arrays: dict[str, np.ndarray] = {f"x_{case}": x for case, x in acts.items()}
    for name in ACTIVATION_TYPES:
        for case, x in acts.items():
            arrays[f"{name}_{case}"] = cpu_from_float(lib, GGMLType[name], x)
    np.savez_compressed(OUT_DIR / "activations.npz", **arrays)

    for name in WEIGHT_TYPES:
        qtype = GGMLType[name]
        vec_dot_type = GGMLType(lib.traits(qtype).vec_dot_type)
        dots: dict[str, np.ndarray] = {}
        x_cases = {"normal": acts["normal"][:4], "edge": acts["edge"]}
        for xcase, x in x_cases.items():
            dots[f"x_{xcase}"] = x
            dots[f"xq_{xcase}"] = cpu_from_float(lib, vec_dot_type, x)
        for wcase, w in weight_cases(rng, qtype, WIDTH).items():
            dots[f"w_{wcase}"] = w
            for xcase in x_cases:
                dots[f"dot_{wcase}_{xcase}"] = cpu_vec_dot(lib, qtype, w, dots[f"xq_{xcase}"], WIDTH)
        narrow_w = weight_cases(rng, qtype, 96)["quantized"][:8]
        narrow_xq = cpu_from_float(lib, vec_dot_type, acts["narrow"])
        dots.update(w_narrow=narrow_w, x_narrow=acts["narrow"], xq_narrow=narrow_xq,
                    dot_narrow_narrow=cpu_vec_dot(lib, qtype, narrow_w, narrow_xq, 96))
        np.savez_compressed(OUT_DIR / f"dot_{name}.npz", **dots)

    meta = {"source": lib.source, "features": lib.features,
            "vec_dot_type": {n: GGMLType(lib.traits(GGMLType[n]).vec_dot_type).name for n in WEIGHT_TYPES},
            "script": "tools/make_kernel_fixtures.py"}
    (OUT_DIR / "source.json").write_text(json.dumps(meta, indent=2) + "\n")
    total = sum(p.stat().st_size for p in OUT_DIR.iterdir())
    print(f"{lib.source}, features {lib.features}: {total / 1e3:.0f} kB in {OUT_DIR}")


if __name__ == "__main__":
    main()
