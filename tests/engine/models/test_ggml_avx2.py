"""The AVX2 build's order (engine.kernels.isa.forced_bits("avx2")) against llama.cpp built with AVX2 flags only.

Fixtures: tests/fixtures/taps_avx2 (tools/make_layer_taps.py --isa avx2: the same prompt, phases and layers as
tests/fixtures/taps, from an AVX2-only build of llama-cpp-python 0.3.36) and golden_<model>_avx2.* (tools/make_golden.py
--isa avx2: the golden prose's top-128 log-probabilities). Each op is fed that build's input and must give its output
bit for bit, through the compiled kernels and through the NumPy fallback; the whole catalog models must give its
log-probabilities exactly. The `*_discriminate` tests show that the AVX-512 order misses these fixtures, so they
can fail.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.synthetic_model import spec, write_synthetic
from engine.generate import prefill
from engine.kernels import isa
from engine.kernels.dispatch import compiled
from engine.model import load_model
from engine.ops import ggml as ggml_ops
from engine.ops import ggml_math
from engine.ops.attention_ggml import attention, kq, kqv
from engine.ops.ggml import geglu, soft_max, swiglu
from engine.quant.types import GGMLType
from tests.engine.golden import FIXTURES, log_softmax
from tests.engine.models.test_ggml_decode import GEMMA_TINY, _same_bits, _steps
from tests.engine.models.test_ggml_ops import RUNS, TAPS, assert_bits, differs, kernels, layers, tap  # noqa: F401
from tests.engine.models.test_ggml_prefill import _chunks
from tests.tiny_models import make_tiny_llama

TAPS_AVX2 = TAPS.with_name("taps_avx2")
PHASES = ["prefill", "decode", "chunk", "decode_long"]


@pytest.fixture(autouse=True)
def avx2_bits():
    with isa.forced_bits("avx2"):
        yield


def test_the_fixtures_come_from_an_avx2_build() -> None:
    import json  # noqa: PLC0415

    for key in ("smollm2", "gemma3"):
        info = json.loads((FIXTURES / f"golden_{key}_avx2.json").read_text())["system_info"]
        assert "AVX2 = 1" in info and "AVX512" not in info
    assert isa.lanes() == 8 and isa.describe().bits_of == isa.BUILDS["avx2"]


@pytest.mark.parametrize("model,cache", [("smollm2", "f32"), ("gemma3", "f32")])
def test_glu(model: str, cache: str, kernels: str) -> None:
    t = tap(model, cache, TAPS_AVX2)
    fn, name = (geglu, "ffn_geglu") if t.gemma else (swiglu, "ffn_swiglu")
    for i in layers(t):
        assert_bits(fn(t.rows(f"prefill/ffn_gate-{i}"), t.rows(f"prefill/ffn_up-{i}")), t.rows(f"prefill/{name}-{i}"),
                    f"{name}-{i}")


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("model,cache", RUNS)
def test_kq_soft_max_kqv(model: str, cache: str, phase: str, kernels: str) -> None:
    t = tap(model, cache, TAPS_AVX2)
    for i in layers(t):
        keys, values, n_kv = t.keys_values(phase, i)
        assert_bits(kq(t.q(phase, i), keys, n_kv), t[f"{phase}/kq-{i}"], f"{phase} kq-{i}")
        w = soft_max(t[f"{phase}/kq-{i}"], t.scale(), t.mask(phase, n_kv))
        assert_bits(w, t[f"{phase}/kq_soft_max-{i}"], f"{phase} kq_soft_max-{i}")
        assert_bits(kqv(t[f"{phase}/kq_soft_max-{i}"], values), t[f"{phase}/kqv-{i}"], f"{phase} kqv-{i}")
        out, _ = attention(t.q(phase, i), keys, values, t.mask(phase, n_kv)[:, : keys.shape[1]], t.scale(), n_kv)
        assert_bits(out, t[f"{phase}/kqv-{i}"], f"{phase} attention-{i}")


def test_the_avx512_order_misses_the_avx2_build() -> None:
    """On the AVX2 build's own inputs the AVX-512 order gives other bits: the softmax, SwiGLU and the attention
    products of a chunk (tinyBLAS) and of a decode step (vec_dot_f16) each differ somewhere."""
    t = tap("smollm2", "f16", TAPS_AVX2)
    misses = {"soft_max": False, "swiglu": False, "kq chunk": False, "kqv decode_long": False}
    for i in layers(t):
        for bits in ("avx2", "avx512"):
            with isa.forced_bits(bits):
                _, values, n_kv = t.keys_values("decode_long", i)
                keys, _, n_chunk = t.keys_values("chunk", i)
                got = {"soft_max": (soft_max(t[f"prefill/kq-{i}"], t.scale(), t.mask("prefill", 256)),
                                    t[f"prefill/kq_soft_max-{i}"]),
                       "kq chunk": (kq(t.q("chunk", i), keys, n_chunk), t[f"chunk/kq-{i}"]),
                       "kqv decode_long": (kqv(t[f"decode_long/kq_soft_max-{i}"], values), t[f"decode_long/kqv-{i}"])}
                f32 = tap("smollm2", "f32", TAPS_AVX2)
                got["swiglu"] = (swiglu(f32.rows(f"prefill/ffn_gate-{i}"), f32.rows(f"prefill/ffn_up-{i}")),
                                 f32.rows(f"prefill/ffn_swiglu-{i}"))
            for what, (ours, ref) in got.items():
                if bits == "avx2":
                    assert not differs(ours, ref), what
                elif differs(ours, ref):
                    misses[what] = True
    assert all(misses.values()), misses


def test_v_expf8_compiled_and_numpy_agree_and_part_from_the_avx512_variant() -> None:
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(4000) * 40, [0.0, -0.0, 87.0, 88.7, 89.0, 120.0, -87.0, -90.0, -104.0,
                        -120.0, -140.0, 1e-30, np.inf, -np.inf, np.nan]]).astype(np.float32)
    ref = ggml_math.v_expf8(x)
    assert np.array_equal(ggml_math.v_expf(x, 8), ref, equal_nan=True)
    finite = np.isfinite(x) & (np.abs(x) < 80)
    assert np.allclose(ref[finite], np.exp(x[finite].astype(np.float64)), rtol=3e-7, atol=0)
    assert ref[-3] == np.inf and ref[-2] == 0.0 and np.isnan(ref[-1])
    assert differs(ref, ggml_math.v_expf(x, 16))
    if ggml_ops._compiled():
        from engine.ops.ggml_kernels import v_expf8_1  # noqa: PLC0415

        lanes = np.array([v_expf8_1(np.float32(v)) for v in x], np.float32)
        same = (lanes.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(lanes) & np.isnan(ref))
        assert same.all(), x[~same][:5]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("avx2")
    smol = spec("smollm2-135m-instruct", dim=64, hidden=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=24,
                n_vocab=300, n_ctx=512)
    return {"smollm2-types": write_synthetic(tmp / "smol.gguf", smol, seed=1),
            "gemma3-types": write_synthetic(tmp / "gemma.gguf", GEMMA_TINY, seed=2),
            "llama-f16": make_tiny_llama(tmp / "f16.gguf", qtype=GGMLType.F16, hidden=136)}


@pytest.mark.skipif(not compiled(), reason="the compiled kernels need numba")
@pytest.mark.parametrize("name", ["smollm2-types", "gemma3-types", "llama-f16"])
def test_compiled_step_and_prompt_equal_the_numpy_path(tiny: dict[str, Path], name: str) -> None:
    """Widths of 8 but not 16 (24-wide heads; an F16 model's 136-wide FFN) take the compiled paths in this order
    only. (Logits of models this small rarely move between the two orders: the fp16 rounding of the softmax
    weights hides most last-bit differences; the taps and the catalog models show them.)"""
    model = load_model(tiny[name])
    try:
        ids = list(range(5, 25))
        slow, _ = _steps(model, ids, fast=False)
        fast, _ = _steps(model, ids, fast=True)
        assert model.net.ops.decode_plan.ok and _same_bits(slow, fast)
        sizes = [7, 13]
        assert _same_bits(_chunks(model, ids, sizes, False), _chunks(model, ids, sizes, True))
    finally:
        model.close()


@pytest.mark.slow
@pytest.mark.parametrize("key,fixture", [("smollm2", "smollm2_path"), ("gemma3", "gemma3_path")])
def test_the_catalog_models_give_the_avx2_builds_logits(key: str, fixture: str,
                                                        request: pytest.FixtureRequest) -> None:
    """The golden prose through the whole model with the default F16 cache: the AVX2 build's top-128 log-probabilities
    at every position, bit for bit (the logits are its logits: the same float64 log-softmax makes the same bits). The
    F32 cache's products are held to that build's taps above (its golden file has them too)."""
    import json  # noqa: PLC0415

    z = np.load(FIXTURES / f"golden_{key}_avx2.npz")
    meta = json.loads((FIXTURES / f"golden_{key}_avx2.json").read_text())
    model = load_model(request.getfixturevalue(fixture))
    try:
        ids = z["ids"].tolist()
        assert model.tokenizer.encode(FIXTURES.joinpath("prose.txt").read_text(encoding="utf-8"), add_special=True,
                                      parse_special=False) == ids
        for cache in ("f16",):
            logits = prefill(model, ids, model.new_cache(1024, cache.upper()), all_logits=True, chunk_size=512)
            logp = log_softmax(logits)
            top = np.take_along_axis(logp, z[f"{cache}_top_ids"].astype(np.int64), axis=-1).astype(np.float32)
            assert_bits(top, z[f"{cache}_top_logp"], f"{key} {cache} cache")
            nll = -logp[np.arange(len(ids) - 1), np.asarray(ids[1:])]
            assert abs(float(np.exp(nll.mean())) / meta[f"{cache}_ppl"] - 1) < 1e-9
    finally:
        model.close()
