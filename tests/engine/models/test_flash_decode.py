"""Flash attention in the compiled decode step (engine.runtime.decode_flash) gives the op-by-op flash path's bits.

With --flash-attn on a token's attention is ggml_flash_attn_ext's one-row kernel (the split-KV path over 512 cells
or more with more than one llama.cpp thread); the compiled step must give the same logits and cache as the graph run
op by op (engine.ops.attention_flash), which tests/engine/models/test_flash_attention.py holds to llama.cpp.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.synthetic_model import spec, write_synthetic
from engine.kernels.dispatch import compiled
from engine.model import load_model
from engine.runtime import decode_flash
from tests.engine.models.test_ggml_decode import GEMMA_TINY, _same_bits, _same_recordings, _steps

pytestmark = pytest.mark.skipif(not compiled(), reason="the compiled decode step needs numba")

SMOL_TINY = spec("smollm2-135m-instruct", dim=64, hidden=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                 n_vocab=300, n_ctx=1024)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("flash_decode")
    return {"smollm2": write_synthetic(tmp / "smol.gguf", SMOL_TINY, seed=3),
            "gemma3": write_synthetic(tmp / "gemma.gguf", GEMMA_TINY, seed=4)}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The chunk size of every call of the flash step kernel (both builds' copies counted)."""
    seen: list[int] = []
    for w8, kernel in list(decode_flash.ATTEND_FLASH.items()):
        def counted(*args: object, k: object = kernel) -> None:
            seen.append(int(args[-1]))  # type: ignore[call-overload]
            k(*args)  # type: ignore[operator]

        monkeypatch.setitem(decode_flash.ATTEND_FLASH, w8, counted)
    return seen


def _same_cache(a, b, n: int, layers: int) -> bool:
    return all(np.array_equal(a.k[i][:, :n], b.k[i][:, :n]) and np.array_equal(a.v[i][:, :n], b.v[i][:, :n])
               for i in range(layers))


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_compiled_flash_step_equals_the_op_by_op_flash_path(files: dict[str, Path], name: str,
                                                             calls: list[int]) -> None:
    """20 steps (past Gemma's window of 8, with its q/k norms and query scale): the same logits and cache."""
    model = load_model(files[name], flash_attn="on")
    try:
        ids = list(range(5, 25))
        calls.clear()  # (the load's warm-up step)
        slow, c_slow = _steps(model, ids, fast=False)
        assert not calls  # the op-by-op path never calls the step's kernel
        fast, c_fast = _steps(model, ids, fast=True)
        ops = model.net.ops
        assert ops.decode_plan.ok and ops.attention_path == "flash"
        assert len(calls) == len(ids) * model.net.args.n_layers
        assert _same_bits(slow, fast)
        assert _same_cache(c_slow, c_fast, len(ids), model.net.args.n_layers)
    finally:
        model.close()
    plain = load_model(files[name])
    try:
        off, _ = _steps(plain, ids, fast=True)
        assert not _same_bits(off, fast)  # the flash kernel's bits are not the mul_mat graph's
    finally:
        plain.close()


@pytest.mark.parametrize(("name", "threads"), [("smollm2", 1), ("smollm2", 3), ("smollm2", 8), ("gemma3", 3),
                                               ("gemma3", 5)])
def test_split_kv_steps_past_256_cells_equal_the_op_by_op_path(files: dict[str, Path], name: str, threads: int,
                                                               calls: list[int]) -> None:
    """Past 256 cells n_kv is 512: with more than one llama.cpp thread a step cuts the cells into `threads` chunks,
    merged as ggml merges them. Without a window the first chunks hold keys, the last the token and padding; with
    Gemma's window of 8 every chunk but the token's sees no key at all (skipped, as the op skips -inf entries)."""
    model = load_model(files[name], flash_attn="on")
    try:
        model.net.ops.flash_threads = threads
        prompt = [int(t) for t in np.random.default_rng(7).integers(1, 300, 262)]
        ids = list(range(40, 46))
        calls.clear()
        slow, c_slow = _steps(model, ids, fast=False, n_ctx=512, prompt=prompt)
        fast, c_fast = _steps(model, ids, fast=True, n_ctx=512, prompt=prompt)
        assert _same_bits(slow, fast)
        assert np.isfinite(fast).all()
        assert _same_cache(c_slow, c_fast, len(prompt) + len(ids), model.net.args.n_layers)
        expect = 512 if threads == 1 else -(-512 // threads)
        assert calls and set(calls) == {expect}
    finally:
        model.close()


def test_split_chunks_change_the_bits_as_llamacpps_threads_do(files: dict[str, Path]) -> None:
    """The split-KV merge is another sum order: one thread and three give different logits past 512 cells, and
    neither changes anything below (one partial either way)."""
    model = load_model(files["smollm2"], flash_attn="on")
    try:
        prompt = [int(t) for t in np.random.default_rng(8).integers(1, 300, 258)]
        got = {}
        for threads in (1, 3):
            model.net.ops.flash_threads = threads
            got[threads] = (_steps(model, [9, 10, 11], fast=True, n_ctx=1024, prompt=prompt[:100])[0],
                            _steps(model, [9, 10, 11], fast=True, n_ctx=1024, prompt=prompt)[0])
        assert _same_bits(got[1][0], got[3][0])
        assert not _same_bits(got[1][1], got[3][1])
    finally:
        model.close()


def test_compiled_flash_step_records_what_the_op_by_op_path_records(files: dict[str, Path]) -> None:
    model = load_model(files["gemma3"], flash_attn="on")
    try:
        _same_recordings(model)
    finally:
        model.close()


def test_the_avx2_builds_order_of_the_flash_step_equals_its_op_by_op_path(files: dict[str, Path],
                                                                          calls: list[int]) -> None:
    """With the AVX2 build's bits (vec_dot_f16's 4 x 8 accumulators) the step's copy and the op-by-op kernel's
    copy agree too; past 256 cells, split in three."""
    from engine.kernels import isa  # noqa: PLC0415

    with isa.forced_bits("avx2"):
        model = load_model(files["smollm2"], flash_attn="on")
        try:
            model.net.ops.flash_threads = 3
            prompt = list(range(1, 259))
            calls.clear()
            slow, _ = _steps(model, [7, 8, 9], fast=False, n_ctx=512, prompt=prompt)
            fast, _ = _steps(model, [7, 8, 9], fast=True, n_ctx=512, prompt=prompt)
            assert calls and _same_bits(slow, fast)
        finally:
            model.close()
