"""What a first start compiles less of (engine.kernels.variants): the serial twins of the parallel product kernels,
which run before the late kernels may (their numba parallel lowering is half of a product's compile), with the same
bits; and the lane-order helpers, which compile only the order a literal w8 asks for."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.kernels import precompile
from engine.kernels.dispatch import BlockProduct, compiled
from engine.kernels.variants import early, serial_twin
from engine.quant import quantize
from engine.quant.types import GGMLType

ROOT = Path(__file__).resolve().parents[3]
needs_kernels = pytest.mark.skipif(not compiled(), reason="needs the compiled (numba) kernels")
_T = GGMLType


@needs_kernels
def test_a_serial_twin_keeps_the_kernels_options_but_its_threads():
    from engine.kernels.activations import f16_to_f32  # noqa: PLC0415 - a plain (not parallel) compiled function
    from engine.kernels.kquant import dot  # noqa: PLC0415 - compiled kernels only

    twin = serial_twin(dot.gemv_q6_k)
    assert twin is serial_twin(dot.gemv_q6_k)  # made once
    assert twin is not dot.gemv_q6_k and not twin.targetoptions.get("parallel")
    assert twin.targetoptions.get("error_model") == dot.gemv_q6_k.targetoptions.get("error_model") == "numpy"
    assert twin.py_func.__name__ == "gemv_q6_k_serial"
    assert serial_twin(f16_to_f32) is f16_to_f32  # nothing to twin: not parallel
    assert serial_twin(len) is len  # nor a Python function
    assert early(dot.gemv_q6_k) is dot.gemv_q6_k  # the late kernels may run: the kernel itself
    with precompile.without_late():
        assert early(dot.gemv_q6_k) is twin


def _product(qtype: GGMLType, n_rows: int, n: int, seed: int) -> BlockProduct:
    rng = np.random.default_rng(seed)
    blocks = quantize(rng.standard_normal((n_rows, n)).astype(np.float32), qtype)
    blocks.flags.writeable = False
    return BlockProduct(qtype, blocks, n)


# Gemma 3's types: Q4_K rows in eights (the repacked gemv and gemm), Q6_K (vec_dot, and the tiled path from 8 rows),
# the legacy quants' integer batches; one row, a short prompt and a longer one (Q8_K's threaded quantizer from 16)
@needs_kernels
@pytest.mark.parametrize("qtype", [_T.Q4_K, _T.Q6_K, _T.Q5_0, _T.Q8_0])
def test_the_serial_twins_give_the_parallel_kernels_bits(qtype):
    product = _product(qtype, 64, 512, int(qtype))
    x = np.random.default_rng(7).standard_normal((20, 512)).astype(np.float32)
    for m in (1, 5, 20):
        want = product(x[:m])
        with precompile.without_late():
            got = product(x[:m])
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (qtype.name, m)
    for kernel in _first_kernels(product):  # each ran as its twin
        assert kernel.targetoptions.get("parallel") and serial_twin(kernel).signatures, (qtype.name, kernel)


def _first_kernels(product: BlockProduct) -> list:
    """The parallel kernels whose twins a first start's products run: the legacy quants' integer batches (their
    one-row product too, until the late kernels), Q4_K's repacked gemv and plain gemm, the others' gemv, gemm and
    tiled batches."""
    if product.batch is not None:
        from engine.kernels.legacy.gemm import GEMM_INT  # noqa: PLC0415 - compiled kernels only

        return [GEMM_INT[product.kind]]
    if product.path == "repack_8x8":
        from engine.kernels.kquant import repack  # noqa: PLC0415 - compiled kernels only

        return [product.gemv, repack.gemm_q4_k_8x8]
    return [k for k in (product.gemv, product.gemm, product.tiled) if k is not None]


# in a fresh process and numba cache: a literal w8 types (and so compiles) one side of each lane-order helper
CHILD = r"""
import json
import numpy as np
from numba import njit
from engine.ops import ggml_kernels as gk

@njit
def avx2(x, a, cols, dst):
    gk.reduce_columns(cols, dst, True)
    return gk.v_expf_lane(x, True), gk.reduce_lanes(a, 0, True)

@njit
def either(x, a, w8):
    return gk.v_expf_lane(x, w8), gk.reduce_lanes(a, 0, w8)

a = np.arange(16, dtype=np.float32) / np.float32(7)
x = np.float32(-1.25)
cols, dst = np.arange(128, dtype=np.float32).reshape(16, 8) / np.float32(3), np.zeros(8, np.float32)
e, s = avx2(x, a, cols.copy(), dst)
compiled = {f.py_func.__name__: len(f.signatures) for f in (gk.v_expf1, gk.reduce16, gk.reduce16_columns)}
want = [float(gk.v_expf8_1(x)), float(gk.hsum8(a, 0))]
ref_dst = np.zeros(8, np.float32)
gk.hsum8_columns(cols.copy(), ref_dst)
runtime = [[float(v) for v in either(x, a, w8)] for w8 in (True, False)]
print(json.dumps({"compiled": compiled, "got": [float(e), float(s)], "want": want, "cols": dst.tolist(),
                  "want_cols": ref_dst.tolist(), "runtime": runtime,
                  "want_512": [float(gk.v_expf1(x)), float(gk.reduce16(a, 0))]}))
"""


@needs_kernels
def test_a_literal_lane_order_compiles_only_that_order(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["compiled"] == {"v_expf1": 0, "reduce16": 0, "reduce16_columns": 0}  # AVX-512's: never typed
    assert got["got"] == got["want"]
    assert got["cols"] == got["want_cols"]
    assert got["runtime"] == [got["want"], got["want_512"]]  # a w8 known at run time: both, chosen per call


@needs_kernels
def test_a_moe_models_experts_run_the_twins_before_the_late_kernels(tmp_path, monkeypatch):
    """MUL_MAT_ID's products (engine.models.experts) call the experts' kernels directly: before the late kernels they
    take the twins too (else a first start compiled the parallel ones in the app's process at the first prompt: a
    Qwen3-30B-A3B-shaped file's first token 23.3 s instead of 17.2 s), with the same bits."""
    import engine.models.experts as experts  # noqa: PLC0415
    from engine.model import load_model  # noqa: PLC0415
    from tests.engine.models.arch_cases import model_file  # noqa: PLC0415

    model = load_model(model_file(tmp_path, "qwen3moe", "Q8_0"))
    asked = []
    monkeypatch.setattr(experts, "early", lambda k: asked.append(k) or early(k))

    def run() -> tuple[np.ndarray, np.ndarray]:
        cache = model.new_cache(64)
        ids = np.array([3, 17, 5, 40, 9, 22], np.int64)
        prompt = np.asarray(model.forward(ids, cache))[-1].copy()
        cache.commit(ids.tolist())
        return prompt, np.asarray(model.forward(np.array([11], np.int64), cache))[-1].copy()

    want = run()
    with precompile.without_late():
        got = run()
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(got, want))
    parallel = [k for k in asked if getattr(k, "targetoptions", {}).get("parallel")]
    assert parallel and all(serial_twin(k).signatures for k in parallel)
