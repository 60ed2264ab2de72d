"""Flash attention in the AVX2 build's order (engine.kernels.isa.forced_bits("avx2")) against llama.cpp built with
the AVX2 flags only: tools/make_flash_fixtures.py --isa avx2 (tests/fixtures/flash/NAME_avx2.*), the same models,
batches and steps as test_flash_attention (the one-row kernel, the tiled one, then one token per step, and on the
real models the split-KV path past 256 cells). Our logits at llama.cpp's top-K ids must be its float32 values bit
for bit with flash on (the fixtures hold flash off too); `test_the_avx512_order_misses_them` shows they can fail."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engine.kernels import isa
from tests.engine.models.test_flash_attention import REAL, folder, model_path, run  # noqa: F401 - a fixture
from tools.make_flash_fixtures import FIXTURES, RANDOM

CASES = ["smollm2", "gemma3", *RANDOM]


def fixture(name: str) -> tuple[dict[str, np.ndarray], dict]:
    return dict(np.load(FIXTURES / f"{name}_avx2.npz")), json.loads((FIXTURES / f"{name}_avx2.json").read_text())


@pytest.fixture(scope="module", params=CASES)
def logits(request: pytest.FixtureRequest, folder) -> tuple[str, dict, dict[str, np.ndarray]]:  # noqa: F811
    name = request.param
    z, meta = fixture(name)
    assert "AVX2 = 1" in meta["system_info"] and "AVX512" not in meta["system_info"]
    path = model_path(request, name, folder)
    if name not in REAL:
        from tests.engine.models.arch_cases import sha256  # noqa: PLC0415

        assert sha256(path) == meta["sha256"]  # the file llama.cpp ran
    ids = z["ids"].tolist()
    with isa.forced_bits("avx2"):
        got = run(path, ids, "on", meta["threads"])
    return name, z, got


def test_flash_logits_are_the_avx2_builds_bit_for_bit(logits) -> None:
    """(Flash off in the AVX2 order: test_ggml_avx2's goldens.)"""
    name, z, got = logits
    top = z["flash_top_ids"].astype(np.int64)
    ours = np.take_along_axis(got, top, axis=1)
    wrong = np.nonzero((ours != z["flash_top_logits"]).any(1))[0]
    assert wrong.size == 0, f"{name}: {wrong.size} positions differ, first {wrong[:8]}"


def test_the_avx512_order_misses_them(request: pytest.FixtureRequest, folder) -> None:  # noqa: F811
    """The AVX-512 build's order on the same model and tokens: some top logit differs (the fixture can fail)."""
    z, meta = fixture("gemma3_swa")
    got = run(model_path(request, "gemma3_swa", folder), z["ids"].tolist(), "on", meta["threads"])
    top = z["flash_top_ids"].astype(np.int64)
    assert (np.take_along_axis(got, top, axis=1) != z["flash_top_logits"]).any()


@pytest.mark.parametrize("name", ["smollm2", "llama3"])  # SmolLM2's differ from the AVX-512 build's (gemma3's do not)
def test_a_q8_0_cache_gives_the_avx2_builds_bits(request: pytest.FixtureRequest, folder, name: str) -> None:  # noqa: F811
    """Flash over a Q8_0 K and V cache (llama.cpp's -ctk/-ctv q8_0, its Hadamard rotation), the AVX2 build's order:
    tools/make_flash_fixtures.py --isa avx2 --kv q8_0."""
    z = dict(np.load(FIXTURES / f"{name}.kv_q8_0_avx2.npz"))
    meta = json.loads((FIXTURES / f"{name}.kv_q8_0_avx2.json").read_text())
    assert "AVX512" not in meta["system_info"]
    path = model_path(request, name, folder)
    with isa.forced_bits("avx2"):
        got = run(path, z["ids"].tolist(), "on", meta["threads"], "q8_0")
    top = z["top_ids"].astype(np.int64)
    wrong = np.nonzero((np.take_along_axis(got, top, axis=1) != z["top_logits"]).any(1))[0]
    assert wrong.size == 0, f"{name}: {wrong.size} positions differ, first {wrong[:8]}"
