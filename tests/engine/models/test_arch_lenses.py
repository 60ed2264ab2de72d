"""The lenses on the new architectures: the recorder and attention maps (Gemma 2's windows and soft-capping),
and the Positions lens's RoPE scaling (Llama 3's factor curve)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.records.model import make_model_record
from engine.generate import prefill
from engine.model import load_model
from engine.observe.attention_maps import attention_rows
from engine.observe.attention_steps import attention_cell
from engine.observe.positions import scaled_freqs, scaling_profile
from engine.observe.recorder import Recorder
from engine.models.rope import rope_freqs
from tests.engine.models.arch_cases import model_file, our_logits
from tools.make_arch_models import llama3_factors, token_ids


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("arch_lenses")


@pytest.mark.parametrize("name", ["llama3", "qwen2", "qwen3", "gemma2", "phi3"])
def test_attention_maps_and_cells_on_each_architecture(folder: Path, name: str) -> None:
    model = load_model(model_file(folder, name, "F16"), numerics="float32")
    try:
        ids = token_ids()[:80]
        rec, cache = Recorder(), model.new_cache(128)
        prefill(model, ids, cache, recorder=rec)
        a = model.args
        for layer in range(a.n_layers):
            maps = attention_rows(rec, cache, layer, np.arange(80))  # (H, R, N)
            np.testing.assert_allclose(maps.sum(-1), 1.0, rtol=1e-5)
            spec = rec.specs[layer]
            visible = (maps[0] > 0).sum(-1)
            want = np.minimum(np.arange(80) + 1, spec.window or 10**9)
            np.testing.assert_array_equal(visible, want)  # causal, and the sliding window where the layer has one
            cell = attention_cell(rec, cache, layer, a.n_heads - 1, 70)
            np.testing.assert_allclose(cell.weights, maps[-1, 70], rtol=1e-4, atol=1e-7)
        if name == "gemma2":  # even layers slide over 32 keys, odd ones see everything; the scores are capped
            assert rec.specs[0].window == 32 and rec.specs[1].window is None and rec.specs[0].softcap == 50.0
    finally:
        model.close()


def test_gemma2_maps_apply_the_soft_cap(folder: Path) -> None:
    """The map is softmax(scale * cap * tanh(q.k / cap)): recomputed by hand from the recorded q and cached k."""
    model = load_model(model_file(folder, "gemma2", "F16"), numerics="float32")
    try:
        rec, cache = Recorder(), model.new_cache(64)
        prefill(model, token_ids()[:40], cache, recorder=rec)
        spec = rec.specs[1]
        q = rec.q[1][0, 39]
        k = cache.keys(1, 40)[0]
        s = spec.scale * spec.softcap * np.tanh((k @ q) / spec.softcap)
        w = np.exp(s - s.max())
        np.testing.assert_allclose(rec.attention(cache, 1, 0, [39])[0], w / w.sum(), rtol=1e-4, atol=1e-7)
    finally:
        model.close()


def test_positions_record_carries_llama3_factor_curve(folder: Path) -> None:
    model = load_model(model_file(folder, "llama3", "F16"), numerics="float32")
    try:
        record = make_model_record(model)
        factors = llama3_factors(64, 500000.0)
        np.testing.assert_allclose(record.rope_ratio, 1.0 / factors, rtol=1e-6)
        assert "frequency factors 1 to 8" in record.rope_scaling
        np.testing.assert_allclose(scaled_freqs(64, 500000.0, record.rope_ratio), rope_freqs(64, 500000.0) / factors,
                                   rtol=1e-6)
    finally:
        model.close()


def test_scaling_profile_names_yarn_and_linear(folder: Path) -> None:
    for name, words in (("llama_yarn", ("YaRN x4", "original context of 64", "magnitude")), ("llama_linear", ("linear",))):
        model = load_model(model_file(folder, name, "F16"), numerics="float32")
        try:
            prof = scaling_profile(model.net.rope_scaling, model.args.rope_dim, model.args.rope_base)
            assert all(w in prof.text for w in words), prof.text
        finally:
            model.close()
    assert make_model_record(load_model(model_file(folder, "qwen2", "F16"))).rope_scaling == ""


def _prompt_then_steps(model, ids: list[int], n_prompt: int) -> np.ndarray:
    cache = model.new_cache(1024)
    rows = [prefill(model, ids[:n_prompt], cache, all_logits=True)]
    for tok in ids[n_prompt:]:
        rows.append(model.net.forward([tok], cache))
        cache.commit([tok])
    return np.concatenate(rows)


@pytest.mark.parametrize("name", ["phi3", "qwen2", "gemma2"])
def test_requantizing_in_memory_equals_the_requantized_file(folder: Path, name: str) -> None:
    """The Quantization lens's in-memory requantize (fused attn_qkv / ffn_up included) gives the logits of the file
    llama-quantize's preset would write, bit for bit, with ggml numerics and the compiled decode step where it runs."""
    from engine.quality.requantize import Requantizer, quantize_file  # noqa: PLC0415

    src = model_file(folder, name, "F16")
    dst = folder / f"{name}.F16-to-Q4_K_M.gguf"
    quantize_file(src, dst, "Q4_K_M")
    ids = token_ids()[:40]
    model = load_model(dst, numerics="ggml")
    try:
        want = _prompt_then_steps(model, ids, 30)
    finally:
        model.close()
    model = load_model(src, numerics="ggml")
    try:
        rq = Requantizer(model)
        assert rq.apply(rq.plan("Q4_K_M"))
        got = _prompt_then_steps(model, ids, 30)
    finally:
        model.close()
    np.testing.assert_array_equal(got, want)


def test_model_record_layers_carry_gemma2_windows_and_gqa(folder: Path) -> None:
    """What the Attention lens draws: Gemma 2's sliding window on even layers, full attention on odd ones."""
    model = load_model(model_file(folder, "gemma2", "F16"), numerics="float32")
    try:
        record = make_model_record(model)
        assert [layer.window for layer in record.layers] == [32, None]
        assert record.group == 2 and record.rope_mode == "neox"
    finally:
        model.close()
