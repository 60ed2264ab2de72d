"""The compiled prompt attention (engine.ops.attention_prefill) gives the NumPy path's bits."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.synthetic_model import spec, write_synthetic
from engine.kernels.dispatch import compiled
from engine.model import load_model
from engine.ops import attention_prefill as ggml_prefill
from tests.conftest import model_path

pytestmark = pytest.mark.skipif(not compiled(), reason="the compiled prompt attention needs numba")


def _chunks(model, ids: list[int], sizes: list[int], fast: bool, n_ctx: int = 512) -> np.ndarray:
    """All-position logits of the prompt run in chunks of `sizes`, with or without the compiled attention."""
    before = ggml_prefill.takes
    if not fast:
        ggml_prefill.takes = lambda *a: False
    try:
        cache, rows, start = model.new_cache(n_ctx), [], 0
        for n in sizes:
            part = ids[start : start + n]
            rows.append(model.forward(part, cache, all_logits=True))
            cache.commit(part)
            start += n
        return np.concatenate(rows)
    finally:
        ggml_prefill.takes = before


def test_takes_only_what_tinyblas_and_a_tail_free_softmax_take() -> None:
    assert ggml_prefill.takes(2, 64, 256)
    assert not ggml_prefill.takes(1, 64, 256)  # one query: vec_dot, the decode step's business
    assert not ggml_prefill.takes(8, 72, 256)  # head_dim not a multiple of 16
    assert not ggml_prefill.takes(8, 64, 40)  # a softmax row with a scalar tail


@pytest.fixture(scope="module")
def gemma_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    s = spec("gemma3-270m", dim=64, hidden=256, n_layers=6, n_heads=2, n_kv_heads=1, head_dim=128, n_vocab=300,
             n_ctx=512, window=8)
    return write_synthetic(tmp_path_factory.mktemp("prefill") / "gemma.gguf", s, seed=3)


@pytest.mark.parametrize("sizes", [[20], [7, 13], [3, 1, 16]])
def test_compiled_prompt_attention_equals_the_numpy_path(gemma_tiny: Path, sizes: list[int]) -> None:
    model = load_model(gemma_tiny)
    try:
        ids = list(range(5, 25))  # past the window of 8, in chunks that start mid-window
        slow, fast = _chunks(model, ids, sizes, False), _chunks(model, ids, sizes, True)
        assert np.array_equal(slow.view(np.uint32), fast.view(np.uint32))
    finally:
        model.close()


@pytest.mark.parametrize("fname", ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"])
def test_compiled_prompt_attention_on_the_real_models(fname: str) -> None:
    path = model_path(fname)
    if path is None:
        pytest.skip(f"{fname} is not downloaded")
    model = load_model(path)
    try:
        ids = model.tokenizer.encode("Attention, softmax and the fp16 cache, computed as llama.cpp does. " * 4,
                                     add_special=True)
        sizes = [len(ids) - 9, 9]
        slow, fast = _chunks(model, ids, sizes, False), _chunks(model, ids, sizes, True)
        assert np.array_equal(slow.view(np.uint32), fast.view(np.uint32))
    finally:
        model.close()


def test_compiled_prompt_attention_caps_gemma2_scores_as_the_numpy_path(tmp_path: Path) -> None:
    """Gemma 2's attention soft-cap (cap * tanhf(kq / cap)) inside the compiled call: the same bits."""
    from tests.engine.models.arch_cases import model_file  # noqa: PLC0415 - the architecture test models

    model = load_model(model_file(tmp_path, "gemma2", "Q8_0"))
    try:
        assert model.net.attn_softcap
        ids = list(range(5, 45))  # past its sliding window of 32
        slow, fast = _chunks(model, ids, [40], False), _chunks(model, ids, [40], True)
        assert np.array_equal(slow.view(np.uint32), fast.view(np.uint32))
    finally:
        model.close()
