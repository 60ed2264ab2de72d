"""The first start's split compile (engine.kernels.precompile): the dry pass, and a cold start end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.kernels import precompile
from engine.kernels.dispatch import BlockProduct, compiled
from engine.kernels.activations import KERNEL_LOCK
from engine.model import load_model
from engine.quant import quantize
from engine.quant.types import GGMLType
from tests.tiny_models import make_tiny_llama

ROOT = Path(__file__).resolve().parents[3]
needs_kernels = pytest.mark.skipif(not compiled(), reason="needs the compiled (numba) kernels")


def _product() -> tuple[BlockProduct, np.ndarray]:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((32, 64)).astype(np.float32)
    blocks = quantize(w, GGMLType.Q8_0).reshape(32, -1)
    return BlockProduct(GGMLType.Q8_0, blocks, 64), rng.standard_normal((3, 64)).astype(np.float32)


def test_dry_products_give_zeros_on_this_thread_only():
    product, x = _product()
    real = product(x)
    assert np.abs(real).max() > 0
    seen: dict[str, np.ndarray] = {}
    with precompile.dry_products():
        assert precompile.is_dry()
        dry = product(x, out=np.full((3, 32), 7.0, np.float32))
        other = threading.Thread(target=lambda: seen.setdefault("x", product(x)))
        other.start()
        other.join()
    assert not precompile.is_dry()
    assert np.array_equal(dry, np.zeros((3, 32), np.float32))
    assert np.array_equal(seen["x"], real)  # another thread (a second model's job) is not dry
    assert np.array_equal(product(x), real)


@needs_kernels
def test_dry_bind_runs_nothing():
    product, x = _product()
    from engine.kernels.dispatch import Activation  # noqa: PLC0415

    xq = Activation(x[:1]).bytes_for(GGMLType.Q8_0).copy()
    out = np.full((1, 32), 5.0, np.float32)
    with precompile.dry_products():
        run = product.bind(xq, out)
    assert run is not None
    with KERNEL_LOCK:
        run()
    assert np.all(out == 5.0)
    real = product.bind(xq, out)
    with KERNEL_LOCK:
        real()
    assert np.allclose(out, product(x[:1]), atol=0)


def test_no_helper_when_switched_off_or_cached(monkeypatch):
    monkeypatch.setenv("GGUF_LENS_PRECOMPILE", "0")
    assert precompile.start({(GGMLType.Q8_0, 32)}, object()) is None
    monkeypatch.setenv("GGUF_LENS_PRECOMPILE", "1")
    monkeypatch.setattr(precompile, "is_cached", lambda probe: True)
    assert precompile.start({(GGMLType.Q8_0, 32)}, object()) is None


def test_is_cached_says_no_for_what_is_not_a_compiled_function():
    assert precompile.is_cached(object()) is False


# a cold start in a fresh numba cache: the helper compiles the products, this process the rest
CHILD = r"""
import json, logging, sys
import numpy as np
notes = []
class Keep(logging.Handler):
    def emit(self, record):
        notes.append(record.getMessage())
log = logging.getLogger("engine.kernels.precompile")
log.addHandler(Keep()); log.setLevel(logging.INFO)
from engine.model import load_model
from engine.kernels.legacy import products as legacy_products
from engine.kernels.legacy import q8_0_x16
model = load_model(sys.argv[1])
cache = model.new_cache(64)
ids = np.array([5, 60, 61, 9, 70], np.int64)
logits = model.forward(ids, cache)
from engine.kernels import precompile
from engine.kernels.legacy.gemm import GEMM_INT
from engine.kernels.variants import serial_twin
batch = GEMM_INT[8]  # Q8_0's integer batch kernel: before the late kernels, its serial twin ran
first = {"late": precompile.late_ready(), "parallel": len(batch.signatures),
         "serial": len(serial_twin(batch).signatures)}
cache.commit(ids.tolist())
step = model.forward(np.array([11], np.int64), cache)
from engine.kernels import isa
from engine.kernels.floats import vec_dot
here = {f.py_func.__name__: sum(f.stats.cache_misses.values())
        for f in (legacy_products.PRODUCT[8], q8_0_x16.gemv_q8_0_x16)}
here["attention"] = sum(vec_dot._F16_SERIAL[4 * isa.lanes()].stats.cache_misses.values())
print(json.dumps({"notes": notes, "compiled_here": here, "first": first, "logits": np.asarray(logits)[-1].tolist(),
                  "step": np.asarray(step)[-1].tolist()}))
"""


@needs_kernels
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the split needs two cores")
def test_cold_start_splits_the_compile_and_gives_the_same_numbers(tmp_path):
    path = make_tiny_llama(tmp_path / "q8_0.gguf", qtype=GGMLType.Q8_0, dim=64, hidden=128)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "GGUF_LENS_PRECOMPILE": "1",
           "GGUF_LENS_LATE_KERNELS": "background"}  # what a first start does (the suite's default: "now")
    env.pop("GGUF_LENS_KERNELS", None)
    done = subprocess.run([sys.executable, "-c", CHILD, str(path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert any("compiled in a second process" in n for n in child["notes"]), child["notes"]
    assert any("in the background" in n for n in child["notes"]), child["notes"]  # the late kernels: in a third
    # loaded from the helper's cache, the F16 cache's attention products too (its attention:F16 job)
    assert child["compiled_here"] == {"_product_q8_0": 0, "gemv_q8_0_x16": 0, "attention": 0}
    assert any("attention:F16" in n for n in child["notes"]), child["notes"]
    if not child["first"]["late"]:  # the prompt ran before the late helper ended (always, but on a very fast machine)
        assert child["first"]["parallel"] == 0 and child["first"]["serial"] >= 1, child["first"]
    model = load_model(path)  # this process: the usual (warm) cache
    cache = model.new_cache(64)
    ids = np.array([5, 60, 61, 9, 70], np.int64)
    logits = model.forward(ids, cache)
    cache.commit(ids.tolist())
    step = model.forward(np.array([11], np.int64), cache)
    assert np.array_equal(np.float32(child["logits"]), np.asarray(logits)[-1])
    assert np.array_equal(np.float32(child["step"]), np.asarray(step)[-1])


@needs_kernels
def test_dry_attention_gives_zeros_on_this_thread_only():
    from engine.ops import attention_ggml  # noqa: PLC0415 - compiled kernels only

    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 64)).astype(np.float16)
    y = rng.standard_normal((3, 64)).astype(np.float32)
    want = attention_ggml._vec_dot(w, y)
    assert np.abs(want).max() > 0
    seen = {}
    with precompile.dry_attention():
        assert not attention_ggml._vec_dot(w, y).any()
        other = threading.Thread(target=lambda: seen.setdefault("other", attention_ggml._vec_dot(w, y)))
        other.start()
        other.join()
    assert np.array_equal(seen["other"], want)
    assert np.array_equal(attention_ggml._vec_dot(w, y), want)


def test_product_families_split_the_legacy_quants_from_the_rest():
    """Gemma 3's weights: the legacy quants (one shared batch kernel) in one helper, the k-quants in another."""
    names = ["Q4_K:640", "Q5_0:1024", "Q5_0:256", "Q6_K:640", "Q8_0:262144"]
    assert precompile.families(names) == [["Q5_0:1024", "Q5_0:256", "Q8_0:262144"], ["Q4_K:640", "Q6_K:640"]]
    assert precompile.families(["Q4_1:576", "Q8_0:576"]) == [["Q4_1:576", "Q8_0:576"]]
    assert precompile.families(["F16:64"]) == [["F16:64"]]
