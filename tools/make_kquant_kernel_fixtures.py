"""Golden Q8_K activations and k-quant dot products from llama.cpp's ggml-cpu, for tests/engine/kernels.

Through the ctypes binding of tools/make_kernel_fixtures.py (libggml-cpu from llama-cpp-python):
`from_float` of Q8_K (quantize_row_q8_K) for the activation bytes, and `vec_dot` of each k-quant type
(ggml_vec_dot_q*_K_q8_K) for the products, one weight row at a time. Weight blocks come from
llama.cpp's own ggml_quantize_chunk (no imatrix) on normal and heavy-tailed rows, from random bytes
with sane fp16 scales, and from hand-made edge blocks. Writes, in tests/fixtures/kernels/:

  kquant_q8k.npz      x_<case> float32 rows and xq_<case> ggml's Q8_K bytes
  kquant_<TYPE>.npz   w_<wcase> weight rows, x_<xcase> / xq_<xcase> activations and their Q8_K
                      bytes, dot_<wcase>_<xcase> (m, n_rows) float32 vec_dot results, and a
                      `long` case of 16 super-blocks per row (bytes only); `meta` (JSON)

The products depend on ggml-cpu's SIMD path (its lane order fixes the float additions): these come
from an AVX2 + AVX-512 build, whose k-quant vec_dots take the __AVX2__ branch of
ggml-cpu/arch/x86/quants.c. `meta` records the llama-cpp-python version and the CPU features.

Run with a Python that has llama-cpp-python (built from source) installed:
  /tmp/llvenv/bin/python tools/make_kquant_kernel_fixtures.py
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from make_kernel_fixtures import GgmlCpu, cpu_from_float, cpu_vec_dot, load_ggml_cpu  # noqa: E402
from make_quant_fixtures import ggml_quantize  # noqa: E402

from engine.quant import TYPES, GGMLType  # noqa: E402

OUT_DIR = ROOT / "tests" / "fixtures" / "kernels"
KQUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
WIDTH = 512  # two super-blocks per row
LONG = 4096  # sixteen: the float accumulation over many blocks
# byte offsets of the fp16 super-block scales (d, and dmin where the type has one), ggml-common.h
FP16_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
# byte range of the quantized sub-block scales
SCALE_BYTES = {"Q2_K": (0, 16), "Q3_K": (96, 108), "Q4_K": (4, 16), "Q5_K": (4, 16), "Q6_K": (192, 208)}


def _f16(v) -> np.ndarray:
    return np.atleast_1d(np.asarray(v, dtype="<f2")).view(np.uint8)


# ---- activations


def activation_cases(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Typical rows and the edges of quantize_row_q8_K: zero blocks, one huge value, ties, tiny values."""
    normal = rng.standard_normal((4, n)).astype(np.float32)
    edge = np.zeros((9, n), dtype=np.float32)  # row 0: all zero (d = 0 in every block)
    edge[1] = rng.standard_normal(n) * np.float32(0.01)
    edge[1, 37] = 1e4  # one huge value: every other quant rounds to 0
    edge[2] = np.float32(-2.5)  # constant: all quants -127... with iscale from a negative max
    edge[3] = rng.standard_t(1.5, n) * np.float32(0.1)  # heavy tail
    edge[4, 256:] = rng.standard_normal(n - 256)  # a zero block next to a normal one
    edge[5] = (rng.integers(-254, 255, n) + 0.5) / np.float32(254)  # halves after scaling: ties
    edge[6] = rng.standard_normal(n) * np.float32(1e-39)  # float32 subnormals
    edge[7, ::3] = 5.0
    edge[7, 1::3] = -5.0  # the same magnitude with both signs: the first one sets the sign of d
    edge[8] = rng.standard_normal(n) * np.float32(3e37)  # iscale * x near the float32 range
    return {"normal": normal, "edge": edge}


def q8k_cases(rng: np.random.Generator) -> dict[str, np.ndarray]:
    cases = activation_cases(rng, WIDTH)
    nonfinite = rng.standard_normal((4, 256)).astype(np.float32)
    nonfinite[0, 3] = np.nan
    nonfinite[1, 40] = np.inf
    nonfinite[2, 100] = -np.inf
    nonfinite[3, 200] = np.frombuffer(np.uint32(0x7FC12345).tobytes(), dtype=np.float32)[0]  # NaN payload
    cases["nonfinite"] = nonfinite
    cases["long"] = rng.standard_normal((2, LONG)).astype(np.float32)
    return cases


# ---- weights


def weight_cases(lib: GgmlCpu, rng: np.random.Generator, name: str, n: int) -> dict[str, np.ndarray]:
    """Weight rows of type `name`: llama.cpp-quantized, random bytes, and edge blocks."""
    qtype = GGMLType[name]
    ts = TYPES[qtype].type_size
    nb = n // 256
    normal = (rng.standard_normal((12, n)) * 0.02).astype(np.float32)
    realistic = (rng.standard_t(3.0, (8, n)) * 0.02).astype(np.float32)
    realistic[:, ::97] *= 20  # a few outlier columns, as in real attention and FFN weights
    quantized = ggml_quantize(lib.base, np.concatenate([normal, realistic]), qtype)

    rand = rng.integers(0, 256, (12, nb, ts), dtype=np.uint8)
    for off in FP16_FIELDS[name]:
        rand[..., off : off + 2] = _f16(rng.standard_normal((12, nb)) * 0.005).reshape(12, nb, 2)

    edge = rng.integers(0, 256, (8, nb, ts), dtype=np.uint8)
    for off in FP16_FIELDS[name]:
        edge[..., off : off + 2] = _f16(rng.standard_normal((8, nb)) * 0.005).reshape(8, nb, 2)
    s0, s1 = SCALE_BYTES[name]
    edge[0] = 0  # all-zero blocks
    for off in FP16_FIELDS[name]:
        edge[1, :, off : off + 2] = _f16(65504.0)  # max fp16 super-block scales
    edge[1, :, s0:s1] = 0xFF if name != "Q6_K" else 0x7F  # max sub-block scales (and mins)
    quant_bytes = np.ones(ts, dtype=bool)
    quant_bytes[s0:s1] = False
    for off in FP16_FIELDS[name]:
        quant_bytes[off : off + 2] = False
    edge[2][:, quant_bytes] = 0x00  # every quant at the low extreme
    edge[3][:, quant_bytes] = 0xFF  # every quant at the high extreme
    edge[4, :, s0:s1] = 0x80 if name == "Q6_K" else 0xFF  # Q6_K: scale -128
    for off in FP16_FIELDS[name]:
        edge[5, :, off : off + 2] = _f16(6e-8)  # subnormal fp16 scale
    edge[6, :, s0:s1] = 0  # zero sub-block scales under random quants
    edge[7, ::2] = 0  # zero blocks between random ones
    return {"quantized": quantized, "random": rand.reshape(12, -1), "edge": edge.reshape(8, -1)}


def main() -> None:
    """Ask ggml-cpu for the Q8_K bytes and the k-quant dot products of every case and write the .npz files."""
    lib = load_ggml_cpu()
    rng = np.random.default_rng(20250123)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"source": lib.source, "features": lib.features,
                       "script": "tools/make_kquant_kernel_fixtures.py"})

    q8k = {}
    for case, x in q8k_cases(rng).items():
        q8k[f"x_{case}"] = x
        q8k[f"xq_{case}"] = cpu_from_float(lib, GGMLType.Q8_K, x)
    np.savez_compressed(OUT_DIR / "kquant_q8k.npz", meta=np.array(meta), **q8k)

    for name in KQUANTS:
        qtype = GGMLType[name]
        assert GGMLType(lib.traits(qtype).vec_dot_type) == GGMLType.Q8_K
        arrays: dict[str, np.ndarray] = {"meta": np.array(meta)}
        acts = activation_cases(rng, WIDTH)
        for xcase, x in acts.items():
            arrays[f"x_{xcase}"] = x
            arrays[f"xq_{xcase}"] = cpu_from_float(lib, GGMLType.Q8_K, x)
        for wcase, w in weight_cases(lib, rng, name, WIDTH).items():
            arrays[f"w_{wcase}"] = w
            for xcase in acts:
                arrays[f"dot_{wcase}_{xcase}"] = cpu_vec_dot(lib, qtype, w, arrays[f"xq_{xcase}"], WIDTH)
        long_w = ggml_quantize(lib.base, (rng.standard_normal((4, LONG)) * 0.02).astype(np.float32), qtype)
        long_x = rng.standard_normal((3, LONG)).astype(np.float32)  # only its Q8_K bytes are kept
        arrays.update(w_long=long_w, xq_long=cpu_from_float(lib, GGMLType.Q8_K, long_x))
        arrays["dot_long_long"] = cpu_vec_dot(lib, qtype, long_w, arrays["xq_long"], LONG)
        np.savez_compressed(OUT_DIR / f"kquant_{name}.npz", **arrays)

    total = sum(p.stat().st_size for p in OUT_DIR.glob("kquant_*.npz"))
    print(f"{lib.source}, features {lib.features}: {total / 1e3:.0f} kB of kquant_*.npz in {OUT_DIR}")


if __name__ == "__main__":
    main()
