"""Golden repacked-Q4_K products from llama.cpp's ggml-cpu, for tests/engine/kernels/test_kquant_repack.py.

On x86 with AVX2 ggml-cpu keeps a Q4_K weight with a multiple of 8 rows in its CPU_REPACK buffer
(block_q4_Kx8, "q4_K_8x8") and multiplies it through ggml_gemm_q4_K_8x8_q8_K / ggml_gemv_q4_K_8x8_q8_K
(see engine/kernels/kquant/repack_ref.py). This script runs that path itself: through ctypes it builds a
one-node ggml graph, MUL_MAT(W, X), with W allocated in ggml_backend_cpu_repack_buffer_type() (set_tensor
repacks it) and X float32 rows, and computes it on the CPU backend, so forward_mul_mat's split of the rows
(groups of 4 through quantize_mat + gemm, the rest through from_float + gemv) is llama.cpp's own. It also
calls ggml_quantize_mat_t<8, Q8_K> (ggml_quantize_mat_q8_K_4x8) for the interleaved activation bytes.

Writes tests/fixtures/kernels/q4k_repack.npz:
  w_<wcase>            Q4_K weight rows (r, nb * 144): llama.cpp-quantized, random bytes, edge blocks, and
                       the first rows of the first Q4_K ffn_down of gemma-3-270m-q4_k_m.gguf when that file is found
  x_<width>            float32 activation rows (16, width), edge rows among them (sign ties, zero, tiny,
                       huge, constant blocks); products use the first m rows
  y_<wcase>_<m>        llama.cpp's MUL_MAT result (m, r) float32, m in 1, 2, 3, 4, 5, 8, 16
  qx4_<width>          ggml_quantize_mat_q8_K_4x8 bytes of x_<width>, four rows per block_q8_Kx4 run
  meta                 JSON: source, CPU features, which products (repack or not) ran

Run with a Python that has llama-cpp-python (built from source with the AVX-512 flags of README.md):
  /tmp/llvenv/bin/python tools/make_q4k_repack_fixtures.py [--models-dir DIR]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from make_kernel_fixtures import GgmlCpu, load_ggml_cpu
from make_quant_fixtures import ggml_quantize

from engine.quant import GGMLType

OUT = ROOT / "tests" / "fixtures" / "kernels" / "q4k_repack.npz"
ROWS = (1, 2, 3, 4, 5, 8, 16)
GEMMA = "gemma-3-270m-q4_k_m.gguf"
GGML_TYPE_F32 = 0
_QUANTIZE_MAT_Q8_K_4X8 = "_Z19ggml_quantize_mat_tILl8EL9ggml_type15EEvPKfPvll"  # ggml_quantize_mat_t<8, Q8_K>
_REPACK_BUFT = "_Z35ggml_backend_cpu_repack_buffer_typev"  # ggml_backend_cpu_repack_buffer_type()


class _InitParams(ctypes.Structure):
    """struct ggml_init_params (ggml.h)."""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


def _sig(lib: ctypes.CDLL, name: str, restype, *argtypes) -> None:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


def bind_graph_api(lib: GgmlCpu) -> None:
    """Type the ggml / ggml-backend functions this script calls."""
    p, sz, i64 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64
    b = lib.base
    _sig(b, "ggml_init", p, _InitParams)
    _sig(b, "ggml_free", None, p)
    _sig(b, "ggml_tensor_overhead", sz)
    _sig(b, "ggml_graph_overhead", sz)
    _sig(b, "ggml_new_tensor_2d", p, p, ctypes.c_int, i64, i64)
    _sig(b, "ggml_mul_mat", p, p, p, p)
    _sig(b, "ggml_new_graph", p, p)
    _sig(b, "ggml_build_forward_expand", None, p, p)
    _sig(b, "ggml_nbytes", sz, p)
    _sig(b, "ggml_backend_buft_alloc_buffer", p, p, sz)
    _sig(b, "ggml_backend_buffer_get_base", p, p)
    _sig(b, "ggml_backend_buffer_free", None, p)
    _sig(b, "ggml_backend_tensor_alloc", ctypes.c_int, p, p, p)
    _sig(b, "ggml_backend_tensor_set", None, p, p, sz, sz)
    _sig(b, "ggml_backend_tensor_get", None, p, p, sz, sz)
    _sig(b, "ggml_backend_alloc_ctx_tensors", p, p, p)
    _sig(b, "ggml_backend_graph_compute", ctypes.c_int, p, p)
    _sig(b, "ggml_backend_free", None, p)
    c = lib.cpu
    _sig(c, "ggml_backend_cpu_init", p)
    _sig(c, "ggml_backend_cpu_set_n_threads", None, p, ctypes.c_int)
    _sig(c, "ggml_backend_cpu_buffer_type", p)
    _sig(c, _REPACK_BUFT, p)
    _sig(c, _QUANTIZE_MAT_Q8_K_4X8, None, p, p, i64, i64)


def mul_mat(lib: GgmlCpu, qtype: GGMLType, w: np.ndarray, x: np.ndarray, *, repack: bool, threads: int = 1) -> np.ndarray:
    """llama.cpp's MUL_MAT(W, X) on the CPU backend: weight rows w (r, row_bytes) of `qtype`, float32 rows x
    (m, n); W in the CPU_REPACK buffer when `repack` (else the plain CPU buffer). Returns (m, r) float32."""
    w = np.ascontiguousarray(w, dtype=np.uint8)
    x = np.ascontiguousarray(x, dtype=np.float32)
    (r, _), (m, n) = w.shape, x.shape
    b, c = lib.base, lib.cpu
    ctx = b.ggml_init(_InitParams(b.ggml_tensor_overhead() * 8 + b.ggml_graph_overhead() + (1 << 16), None, True))
    wbuf = backend = rest = None
    try:
        tw = b.ggml_new_tensor_2d(ctx, int(qtype), n, r)
        tx = b.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, m)
        ty = b.ggml_mul_mat(ctx, tw, tx)
        buft = getattr(c, _REPACK_BUFT)() if repack else c.ggml_backend_cpu_buffer_type()
        nbytes = b.ggml_nbytes(tw)
        assert nbytes == w.nbytes, (nbytes, w.nbytes)
        wbuf = b.ggml_backend_buft_alloc_buffer(buft, nbytes)
        assert b.ggml_backend_tensor_alloc(wbuf, tw, b.ggml_backend_buffer_get_base(wbuf)) == 0
        b.ggml_backend_tensor_set(tw, w.ctypes.data, 0, nbytes)  # the repack buffer repacks here
        backend = c.ggml_backend_cpu_init()
        c.ggml_backend_cpu_set_n_threads(backend, threads)
        rest = b.ggml_backend_alloc_ctx_tensors(ctx, backend)  # X and Y (W already has its buffer)
        b.ggml_backend_tensor_set(tx, x.ctypes.data, 0, x.nbytes)
        graph = b.ggml_new_graph(ctx)
        b.ggml_build_forward_expand(graph, ty)
        assert b.ggml_backend_graph_compute(backend, graph) == 0
        y = np.empty((m, r), np.float32)
        b.ggml_backend_tensor_get(ty, y.ctypes.data, 0, y.nbytes)
        return y
    finally:
        for buf in (rest, wbuf):
            if buf:
                b.ggml_backend_buffer_free(buf)
        if backend:
            b.ggml_backend_free(backend)
        b.ggml_free(ctx)


def quantize_mat_4x8(lib: GgmlCpu, x: np.ndarray) -> np.ndarray:
    """ggml_quantize_mat_q8_K_4x8 of rows x (4k, n): k runs of n / 256 block_q8_Kx4 (1168 bytes each), (k, bytes)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, n = x.shape
    assert m % 4 == 0 and n % 256 == 0
    out = np.zeros((m // 4, n // 256 * 1168), np.uint8)
    fn = getattr(lib.cpu, _QUANTIZE_MAT_Q8_K_4X8)
    for g in range(m // 4):
        fn(x[4 * g].ctypes.data, out[g].ctypes.data, 4, n)
    return out


# ---- inputs


def _f16(v) -> np.ndarray:
    return np.atleast_1d(np.asarray(v, dtype="<f2")).view(np.uint8)


def activations(rng: np.random.Generator, n: int) -> np.ndarray:
    """16 rows of n floats; rows 0, 2 and 4 hold the 4x8 quantizer's sign tie (they are gemv rows for m < 4
    or m = 5 and gemm rows otherwise), the others typical rows and the edges of the Q8_K quantizers."""
    x = (rng.standard_normal((16, n)) * 0.7).astype(np.float32)
    x[:, ::61] *= 9  # a few outlier channels, as in real hidden states
    for row in (0, 2, 4):  # -amax first, then +amax: the two quantizers pick opposite signs for d
        for blk in range(0, n // 256, 1 + row // 2):
            base = 256 * blk
            top = np.float32(np.abs(x[row, base : base + 256]).max() * 1.25)
            x[row, base + 3 + row], x[row, base + 200 - row] = -top, top
    x[1, :256] = 0.0  # an all-zero block
    x[3, 256:512] = np.float32(-2.5)  # constant negative block: both quantizers take +127 / 2.5
    x[5, :256] = rng.standard_normal(256) * np.float32(1e-39)  # subnormals: 127 / amax overflows
    x[6, 17] = 1e4  # one huge value
    x[7] = (rng.standard_t(1.5, n) * 0.1).astype(np.float32)  # heavy tail
    x[8] = (rng.integers(-254, 255, n) + 0.5) / np.float32(254)  # halves after scaling
    x[9, 256:512] = np.float32(2.5)  # constant positive block
    x[10, 0:256:2], x[10, 1:256:2] = 5.0, -5.0  # +amax first: both pick -127 / 5
    x[11] *= np.float32(1e-3)
    return x


def weights(lib: GgmlCpu, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Q4_K rows of n columns: llama.cpp-quantized (16 rows), random bytes (16) and edge blocks (8)."""
    nb = n // 256
    normal = (rng.standard_normal((8, n)) * 0.02).astype(np.float32)
    heavy = (rng.standard_t(3.0, (8, n)) * 0.02).astype(np.float32)
    heavy[:, ::97] *= 20
    quantized = ggml_quantize(lib.base, np.concatenate([normal, heavy]), GGMLType.Q4_K)
    rand = rng.integers(0, 256, (16, nb, 144), dtype=np.uint8)
    rand[..., 0:4] = _f16(rng.standard_normal((16, nb, 2)) * 0.005).reshape(16, nb, 4)
    edge = rng.integers(0, 256, (8, nb, 144), dtype=np.uint8)
    edge[..., 0:4] = _f16(rng.standard_normal((8, nb, 2)) * 0.005).reshape(8, nb, 4)
    edge[0] = 0  # zero blocks
    edge[1, :, 0:4] = _f16([65504.0, 65504.0])  # max fp16 d and dmin
    edge[1, :, 4:16] = 0xFF  # max 6-bit scales and mins
    edge[2, :, 16:] = 0x00  # every quant 0
    edge[3, :, 16:] = 0xFF  # every quant 15
    edge[3, :, 4:16] = 0xFF
    edge[4, :, 0:4] = _f16([6e-8, 6e-8])  # subnormal fp16 scales
    edge[5, :, 4:16] = 0  # zero scales and mins under random quants
    edge[6, ::2] = 0  # zero blocks between random ones
    return {"quantized": quantized, "random": rand.reshape(16, -1), "edge": edge.reshape(8, -1)}


def gemma_rows(models_dir: str | None) -> np.ndarray | None:
    """The first 24 rows of the first Q4_K ffn_down (2048 columns) of the Gemma 3 file, if found."""
    from engine.gguf import open_gguf

    dirs = [models_dir] if models_dir else []
    dirs += [os.environ.get("GGUF_LENS_MODELS_DIR", ""), str(Path.home() / ".cache" / "gguf-lens" / "models"), "/work/models"]
    for d in dirs:
        path = Path(d) / GEMMA if d else None
        if path is not None and path.is_file():
            with open_gguf(path) as f:
                name = next(t for t, info in f.tensors.items()
                            if t.endswith("ffn_down.weight") and info.qtype == GGMLType.Q4_K)
                return np.array(f.rows(name)[:24])
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models-dir", default=None)
    args = ap.parse_args()
    lib = load_ggml_cpu()
    bind_graph_api(lib)
    rng = np.random.default_rng(20250611)
    arrays: dict[str, np.ndarray] = {}
    cases: dict[str, np.ndarray] = dict(weights(lib, rng, 512))
    real = gemma_rows(args.models_dir)
    if real is not None:
        cases["gemma_ffn_down"] = real
    for wcase, w in cases.items():
        n = w.shape[1] // 144 * 256
        key = f"x_{n}"
        if key not in arrays:
            arrays[key] = activations(rng, n)
            arrays[f"qx4_{n}"] = quantize_mat_4x8(lib, arrays[key])
        arrays[f"w_{wcase}"] = w
        for m in ROWS:
            x = arrays[key][:m]
            y = mul_mat(lib, GGMLType.Q4_K, w, x, repack=True, threads=1)
            again = mul_mat(lib, GGMLType.Q4_K, w, x, repack=True, threads=3)  # the chunking changes nothing
            assert np.array_equal(y.view(np.uint32), again.view(np.uint32)), (wcase, m)
            arrays[f"y_{wcase}_{m}"] = y
    arrays["meta"] = np.array(json.dumps({
        "source": lib.source, "features": lib.features, "rows": list(ROWS),
        "weights": {k: list(v.shape) for k, v in cases.items()},
        "product": "MUL_MAT with src0 in ggml_backend_cpu_repack_buffer_type (q4_K_8x8_q8_K)",
        "script": "tools/make_q4k_repack_fixtures.py"}))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print(f"{lib.source}, features {lib.features}: {OUT.stat().st_size / 1e3:.0f} kB in {OUT}")


if __name__ == "__main__":
    main()
