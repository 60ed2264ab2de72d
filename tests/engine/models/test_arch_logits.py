"""Every architecture and quantization against llama.cpp's logits on the same file (tools/make_arch_models.py).

For each test model (llama as Llama 3 uses it, with linear and YaRN scaling; qwen2; qwen3; gemma2; phi3; the
Mixture-of-Experts qwen3moe, qwen2moe, a Mixtral-style llama and gpt-oss) in F16,
Q8_0, Q4_K_M and IQ4_XS (and MXFP4_MOE for the Mixture-of-Experts ones): our quantizer writes llama.cpp's file byte for byte, and our logits at every position of 200
tokens (a 128-token prompt, then decode steps) are llama.cpp's within the issue's bounds in both numerics.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine.models.arch_cases import (
    F32_BOUNDS,
    GGML_BOUNDS,
    MOE_F32_BOUNDS,
    MOE_GGML_KLD_MAX,
    OAI_F32_BOUNDS,
    QUANTS,
    model_file,
    our_logits,
    reference,
    sha256,
    stats,
)
from tools.make_arch_models import SPECS

# MXFP4_MOE (gpt-oss's file type: the experts in MXFP4, every other matrix Q8_0) on the Mixture-of-Experts models
CASES = [(name, quant) for name in SPECS for quant in QUANTS + (("MXFP4_MOE",) if SPECS[name].n_expert else ())]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("arch")


@pytest.mark.parametrize(("name", "quant"), CASES, ids=[f"{n}-{q}" for n, q in CASES])
def test_our_quantized_file_is_llama_cpps(folder: Path, name: str, quant: str) -> None:
    """The file the suite runs is byte-identical to the one llama.cpp quantized and ran for the fixture."""
    assert sha256(model_file(folder, name, quant)) == reference(name, quant).sha256


@pytest.mark.parametrize("numerics", ["float32", "ggml"])
@pytest.mark.parametrize(("name", "quant"), CASES, ids=[f"{n}-{q}" for n, q in CASES])
def test_logits_match_llama_cpp(folder: Path, name: str, quant: str, numerics: str) -> None:
    ref = reference(name, quant)
    got = stats(ref, our_logits(model_file(folder, name, quant), ref.ids, numerics))
    moe = SPECS[name].n_expert > 0
    f32_bounds = OAI_F32_BOUNDS if SPECS[name].arch == "gpt-oss" else MOE_F32_BOUNDS if moe else F32_BOUNDS
    kld_bound, top_bound = f32_bounds if numerics == "float32" else GGML_BOUNDS
    print(f"{name} {quant} {numerics}: {got}")
    assert got["kld_mean"] <= kld_bound
    assert got["same_top"] >= top_bound
    if moe and numerics == "ggml":  # the experts as MUL_MAT_ID computes them: llama.cpp's logits to the bit
        assert got["kld_max"] <= MOE_GGML_KLD_MAX
