"""The numerics switch end to end: ggml (products on the blocks) against float32, fused products, swaps, fallback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.kernels.dispatch import GEMV_MAX_ROWS, Activation, BlockProduct
from engine.model import load_model
from engine.quant import dequantize_rows, quantize
from engine.quant.types import GGMLType
from engine.tensor import QTensor
from tests.tiny_models import make_tiny_llama

T = GGMLType
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def tiny_q(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama whose matrices are Q4_1 blocks (the catalog SmolLM2's type): rows of 256, 4 layers."""
    return make_tiny_llama(tmp_path_factory.mktemp("q") / "tiny_q4_1.gguf", n_layers=3, dim=256, n_heads=4,
                           n_kv_heads=2, hidden=512, qtype=T.Q4_1, n_ctx=128)


def _logits(model, ids, chunk: int | None = None) -> np.ndarray:
    from engine.generate import prefill

    return prefill(model, ids, model.new_cache(128), all_logits=True, chunk_size=chunk or len(ids))


def test_ggml_numerics_keep_no_float_copy_and_differ_from_float32(tiny_q: Path) -> None:
    ids = list(range(5, 45))
    g, f = load_model(tiny_q), load_model(tiny_q, numerics="float32")
    try:
        assert g.numerics == "ggml" and f.numerics == "float32"
        lg, lf = _logits(g, ids), _logits(f, ids)
        assert all(lin._dense is None for lin in g.net.linears().values())  # nothing dequantized and kept
        assert g.budget.used == 0 and f.budget.used > 0
        assert g.new_cache(8).cache_type == "F16" and f.new_cache(8).cache_type == "F32"
        assert not np.array_equal(lg, lf)  # 8-bit activations and the F16 cache change the numbers ...
        assert (lg.argmax(-1) == lf.argmax(-1)).mean() >= 0.9  # ... a little
        np.testing.assert_allclose(lg, lf, atol=0.1 * float(np.abs(lf).max()))
    finally:
        g.close()
        f.close()


def test_unknown_numerics_is_a_setting_error(tiny_q: Path) -> None:
    with pytest.raises(SettingError, match="numerics"):
        load_model(tiny_q, numerics="float16")


def _rows(qtype: GGMLType, n_rows: int, n_cols: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n_rows, n_cols)).astype(np.float32)
    out = quantize(x, qtype).reshape(n_rows, -1)
    out.flags.writeable = False  # as the memory map
    return out


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q8_0, T.Q4_K, T.Q6_K, T.F16])
def test_fused_product_equals_the_separate_ones(qtype: GGMLType) -> None:
    """q/k/v stacked into one call give each part's own result to the bit (each row's dot is independent)."""
    n = 256
    parts = [_rows(qtype, r, n, s) for s, r in enumerate((64, 32, 32))]
    x = np.random.default_rng(9).standard_normal((3, n)).astype(np.float32)
    for rows in (x[:1], x):
        act = Activation(rows)
        alone = np.concatenate([BlockProduct(qtype, p, n)(act) for p in parts], axis=1)
        if BlockProduct.can_fuse(qtype):
            fused = BlockProduct.fused(qtype, parts, n)(act)
            assert fused.shape == alone.shape and np.array_equal(fused, alone)
    many = np.random.default_rng(10).standard_normal((GEMV_MAX_ROWS + 3, n)).astype(np.float32)
    if BlockProduct.can_fuse(qtype):  # the prefill path: the fused copy's tiles (and Q4_1's block mins) are the same
        act = Activation(many)
        alone = np.concatenate([BlockProduct(qtype, p, n)(act) for p in parts], axis=1)
        np.testing.assert_allclose(BlockProduct.fused(qtype, parts, n)(act), alone, rtol=1e-6,
                                   atol=1e-5 * float(np.abs(alone).max()))  # BLAS sums in a shape-dependent order


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_0, T.Q4_K, T.Q3_K])
def test_prefill_tiles_agree_with_the_integer_kernels(qtype: GGMLType) -> None:
    """Many rows take dequantized tiles x BLAS; the values multiplied are ggml's, so only the sum order differs."""
    n = 512
    w = _rows(qtype, 96, n, 3)
    x = np.random.default_rng(4).standard_normal((GEMV_MAX_ROWS + 4, n)).astype(np.float32)
    product = BlockProduct(qtype, w, n)
    tiled = product(x)
    one_by_one = np.concatenate([product(x[i : i + 1]) for i in range(len(x))])
    np.testing.assert_allclose(tiled, one_by_one, rtol=2e-5, atol=2e-5 * float(np.abs(one_by_one).max()))
    exact_f32 = x @ dequantize_rows(w, qtype).T  # what float32 numerics would give: further away
    assert np.abs(tiled - one_by_one).max() < np.abs(exact_f32 - one_by_one).max()


def test_requantized_blocks_reach_the_kernels_at_once(tiny_q: Path) -> None:
    model = load_model(tiny_q)
    try:
        ids = list(range(3, 20))
        before = _logits(model, ids)
        layer = model.net.layers[1]
        assert [len(members) for _, members in layer.qkv._groups] == [3]  # q, k, v of one type: one call
        w = layer.wq.weight
        new = quantize(dequantize_rows(w.blocks, w.qtype), T.Q8_0).reshape(w.n_rows, -1)
        layer.wq.replace(QTensor(w.name, T.Q8_0, w.shape, new))
        after = _logits(model, ids)
        assert not np.array_equal(before, after)
        groups = layer.qkv._groups  # rebuilt: q alone (Q8_0, its own product), then k and v still fused (Q4_1)
        assert [members for _, members in groups] == [[layer.wq], [layer.wk, layer.wv]] and groups[0][0] is layer.wq.product()
    finally:
        model.close()


def test_numpy_fallback_stays_close_to_the_kernels(tiny_q: Path) -> None:
    """GGUF_LENS_KERNELS=numpy: no compiled product, one warning; ggml's values, summed in BLAS's order instead of
    vec_dot's (so an 8-bit rounding can flip), nearer the kernels than float32 numerics are."""
    ids = list(range(7, 40))
    model, reference = load_model(tiny_q), load_model(tiny_q, numerics="float32")
    try:
        ours, f32 = _logits(model, ids), _logits(reference, ids)
    finally:
        model.close()
        reference.close()
    code = (
        "import json, sys, numpy as np\n"
        "from engine.model import load_model\nfrom engine.generate import prefill\nfrom engine.kernels import dispatch\n"
        f"m = load_model({str(tiny_q)!r})\n"
        f"ids = {ids!r}\n"
        "lg = prefill(m, ids, m.new_cache(128), all_logits=True, chunk_size=len(ids))\n"
        "np.save(sys.argv[1], lg)\n"
        "print(json.dumps({'compiled': dispatch.compiled(), 'note': dispatch.kernel_note()}))\n"
    )
    out = REPO / ".pytest_fallback_logits.npy"
    try:
        env = dict(os.environ, GGUF_LENS_KERNELS="numpy")
        r = subprocess.run([sys.executable, "-c", code, str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr
        info = json.loads(r.stdout.strip().splitlines()[-1])
        assert info == {"compiled": False, "note": "NumPy fallback (GGUF_LENS_KERNELS=numpy)"}
        assert r.stderr.count("NumPy fallback") == 1
        fallback = np.load(out)
        assert np.abs(fallback - ours).mean() < np.abs(f32 - ours).mean()
        assert (fallback.argmax(-1) == ours.argmax(-1)).mean() >= 0.9
    finally:
        out.unlink(missing_ok=True)
