"""Llama 3's rope_freqs, RoPE scaling and the compiled decode step on the architecture test models."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.kernels.dispatch import compiled
from engine.model import load_model
from engine.ops import ggml as ggml_ops
from engine.models.rope import RopeScaling, rope_angles, rope_freqs
from tests.engine.golden import log_softmax
from tests.engine.models.arch_cases import model_file, our_logits, reference, stats
from tools.make_arch_models import llama3_factors


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("arch_rope")


def _kld(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


@pytest.mark.parametrize("quant", ["F16", "Q4_K_M"])
def test_rope_freqs_change_the_logits_in_both_engines(folder: Path, quant: str) -> None:
    """The same Llama 3 file with and without rope_freqs.weight: llama.cpp's top tokens differ at many positions,
    ours differ as much, and ours match llama.cpp's on both files (the KLD bound of ggml numerics)."""
    with_f, without = reference("llama3", quant), reference("llama3_nofreqs", quant)
    assert (with_f.top_ids[:, 0] != without.top_ids[:, 0]).mean() >= 0.05  # llama.cpp
    for numerics in ("float32", "ggml"):
        a = our_logits(model_file(folder, "llama3", quant), with_f.ids, numerics)
        b = our_logits(model_file(folder, "llama3_nofreqs", quant), with_f.ids, numerics)
        assert _kld(a, b) >= 0.02  # 20x the float32 bound: far more than any rounding
        assert (a.argmax(-1) != b.argmax(-1)).mean() >= 0.05
        assert stats(with_f, a)["kld_mean"] <= 0.005 and stats(without, b)["kld_mean"] <= 0.005


def test_rope_freqs_tensor_is_used(folder: Path) -> None:
    model = load_model(model_file(folder, "llama3", "F16"), numerics="float32")
    try:
        assert "rope_freqs.weight" not in model.net.weights.unused()
        factors = llama3_factors(64, 500000.0)
        np.testing.assert_allclose(model.net.rope_scaling.factors, factors)
        np.testing.assert_allclose(model.net.freqs, rope_freqs(64, 500000.0) / factors, rtol=1e-6)
    finally:
        model.close()


@pytest.mark.parametrize("scaling", [
    RopeScaling("linear", 0.25),
    RopeScaling("yarn", 0.25, ext_factor=1.0, attn_factor=0.9, n_ctx_orig=64),
    RopeScaling("none", 1.0, factors=np.linspace(1, 8, 32, dtype=np.float32)),
], ids=["linear", "yarn", "factors"])
def test_ggml_rope_tables_agree_with_the_float64_angles(scaling: RopeScaling) -> None:
    """ggml_rope_cache_init's float recurrence with the scaling is the exact angle table up to float rounding."""
    pos = np.arange(0, 300)
    ramp = scaling.ramp(64, 10000.0) if scaling.ext_factor else None
    c, s = ggml_ops.rope_cache(pos, 64, 10000.0, scaling.freq_scale, scaling.factors, scaling.mscale(), ramp)
    c64, s64 = rope_angles(pos, rope_freqs(64, 10000.0, scaling), scaling.mscale())
    np.testing.assert_allclose(c, c64, atol=2e-4)
    np.testing.assert_allclose(s, s64, atol=2e-4)


def test_yarn_blends_interpolated_and_extrapolated_frequencies() -> None:
    sc = RopeScaling("yarn", 0.25, ext_factor=1.0, n_ctx_orig=64)
    r = sc.ramp(64, 10000.0)
    assert r[0] == 1.0 and r[-1] == 0.0 and np.all(np.diff(r) <= 0)  # high frequencies kept, low ones scaled
    f = rope_freqs(64, 10000.0, sc) / rope_freqs(64, 10000.0)
    np.testing.assert_allclose(f[[0, -1]], [1.0, 0.25])
    assert sc.mscale() == pytest.approx(1 + 0.1 * np.log(4.0), rel=1e-6)


@pytest.mark.skipif(not compiled(), reason="the compiled decode step needs numba")
@pytest.mark.parametrize(("name", "takes"), [("llama3", True), ("llama_yarn", True), ("qwen2", True), ("qwen3", True),
                                            ("phi3", True), ("gemma2", True)])
def test_which_architectures_take_the_compiled_decode_step(folder: Path, name: str, takes: bool) -> None:
    """Biases, q/k norms, fused matrices, partial RoPE, frequency factors and Gemma 2's soft-capping all run in the
    compiled step (test_arch_logits holds its numbers to llama.cpp's decode steps)."""
    from engine.runtime.decode_plan import plan_for  # noqa: PLC0415

    model = load_model(model_file(folder, name, "Q8_0"), numerics="ggml")
    try:
        assert plan_for(model.net, model.net.ops).ok is takes
    finally:
        model.close()


def test_phi3_picks_long_factors_past_the_original_context(folder: Path) -> None:
    model = load_model(model_file(folder, "phi3", "F16"), numerics="float32")
    try:
        net = model.net
        net.select_rope(64)
        short = net.rope_scaling.factors.copy()
        net.select_rope(1024)
        assert net.rope_scaling.factors[-1] == pytest.approx(6.0) and short[-1] == pytest.approx(1.5)
    finally:
        model.close()


@pytest.mark.parametrize("name", ["llama3", "llama_yarn", "qwen2", "qwen3", "gemma2", "phi3"])
def test_float32_decode_steps_equal_the_prompt_pass(folder: Path, name: str) -> None:
    """float32 numerics: the one-token path (engine.ops.attention_decode's compiled attention where it runs) gives the
    prompt pass's logits: biases, q/k norms, the fused matrices, partial RoPE, the scaled query, the factors."""
    from engine.generate import prefill  # noqa: PLC0415

    path = model_file(folder, name, "F16")
    ids = reference(name, "F16").ids[:60]
    whole = our_logits(path, ids, "float32")[:60]
    model = load_model(path, numerics="float32")
    try:
        cache = model.new_cache(1024)
        rows = [prefill(model, ids[:20], cache, all_logits=True)]
        for tok in ids[20:]:
            rows.append(model.net.forward([tok], cache))
            cache.commit([tok])
    finally:
        model.close()
    np.testing.assert_allclose(np.concatenate(rows), whole, rtol=2e-3, atol=2e-3)
