"""The compiled decode step (engine.runtime.decode_plan) gives the NumPy path's bits: logits, cache, recordings."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from benchmarks.synthetic_model import spec, write_synthetic
from engine.kernels.dispatch import compiled
from engine.model import load_model
from engine.runtime import decode_plan as ggml_decode
from engine.observe.recorder import Recorder
from engine.quant import quantize
from engine.quant.types import GGMLType
from engine.tensor import QTensor
from tests.conftest import model_path
from tests.tiny_models import make_tiny_llama

T = GGMLType
pytestmark = pytest.mark.skipif(not compiled(), reason="the compiled decode step needs numba")


# Gemma 3's layout at test size: a sliding window of 8, one KV head of width 128 (the AVX2 tests use it too)
GEMMA_TINY = spec("gemma3-270m", dim=64, hidden=256, n_layers=6, n_heads=2, n_kv_heads=1, head_dim=128, n_vocab=300,
                  n_ctx=512, window=8)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small models with the catalog models' architectures and tensor types, and a few more types."""
    tmp = tmp_path_factory.mktemp("decode")
    smol = spec("smollm2-135m-instruct", dim=64, hidden=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                n_vocab=300, n_ctx=512)
    return {
        "smollm2-types": write_synthetic(tmp / "smol.gguf", smol, seed=1),
        "gemma3-types": write_synthetic(tmp / "gemma.gguf", GEMMA_TINY, seed=2),
        "llama-q4_0-untied": make_tiny_llama(tmp / "q4_0.gguf", qtype=T.Q4_0, tied=False),
        "llama-q5_1": make_tiny_llama(tmp / "q5_1.gguf", qtype=T.Q5_1),
        "llama-q8_0": make_tiny_llama(tmp / "q8_0.gguf", qtype=T.Q8_0),
        "llama-f16": make_tiny_llama(tmp / "f16.gguf", qtype=T.F16),
        "llama-q4_k": make_tiny_llama(tmp / "q4_k.gguf", qtype=T.Q4_K, dim=256, hidden=512, n_heads=4, n_kv_heads=2),
    }


def _steps(model, ids: list[int], fast: bool, recorder: Recorder | None = None, n_ctx: int = 256,
           prompt: list[int] | None = None):
    """Logits of every token run one at a time (the compiled step, or the NumPy path), and the cache; `prompt`:
    tokens run first in one batch (their logits not returned)."""
    cache = model.new_cache(n_ctx)
    before = ggml_decode.DecodePlan.fits
    if not fast:
        ggml_decode.DecodePlan.fits = lambda self, c, p: False
    try:
        if prompt:
            model.forward(prompt, cache, recorder)
            cache.commit(list(prompt))
            if recorder is not None:
                recorder.commit()
        rows = []
        for tok in ids:
            rows.append(model.forward([tok], cache, recorder))
            cache.commit([tok])
            if recorder is not None:
                recorder.commit()
        return np.concatenate(rows), cache
    finally:
        ggml_decode.DecodePlan.fits = before


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", ["smollm2-types", "gemma3-types", "llama-q4_0-untied", "llama-q5_1", "llama-q8_0",
                                  "llama-f16", "llama-q4_k"])
def test_compiled_step_equals_the_numpy_path(tiny: dict[str, Path], name: str) -> None:
    model = load_model(tiny[name])
    try:
        ids = list(range(5, 25))  # past Gemma's window of 8
        slow, c_slow = _steps(model, ids, fast=False)
        fast, c_fast = _steps(model, ids, fast=True)
        assert model.net.ops.decode_plan.ok  # the compiled step ran
        assert _same_bits(slow, fast)
        for layer in range(model.net.args.n_layers):
            assert np.array_equal(c_slow.k[layer][:, : len(ids)], c_fast.k[layer][:, : len(ids)])
            assert np.array_equal(c_slow.v[layer][:, : len(ids)], c_fast.v[layer][:, : len(ids)])
    finally:
        model.close()


@pytest.mark.parametrize("name", ["smollm2-types", "gemma3-types"])
def test_the_heads_shares_of_the_compiled_attention_give_the_same_bits(tiny: dict[str, Path], name: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's attention spreads the heads over a share per thread; one share, as many as the heads and more
    shares than heads (some empty) give the NumPy path's bits, cache included."""
    import numba  # noqa: PLC0415 - the module the plan asks for its thread count

    model = load_model(tiny[name])
    try:
        ids = list(range(5, 25))
        slow, c_slow = _steps(model, ids, fast=False)
        for parts in (1, 3, model.net.args.n_heads, model.net.args.n_heads + 3):
            monkeypatch.setattr(numba, "get_num_threads", lambda p=parts: p)
            fast, c_fast = _steps(model, ids, fast=True)
            assert model.net.ops.decode_plan.ok, parts
            assert _same_bits(slow, fast), parts
            assert np.array_equal(c_slow.k[0][:, : len(ids)], c_fast.k[0][:, : len(ids)]), parts
    finally:
        model.close()


def _same_recordings(model) -> tuple[Recorder, Recorder]:  # noqa: ANN001
    """12 steps op by op and through the compiled step, each recorded: the rotated q and the hidden states of every
    layer must be the same bits. Returns both recorders."""
    ids = list(range(7, 19))
    r_slow, r_fast = Recorder(capture_hidden=True), Recorder(capture_hidden=True)
    _steps(model, ids, fast=False, recorder=r_slow)
    _steps(model, ids, fast=True, recorder=r_fast)
    n = len(ids)
    for layer in range(model.net.args.n_layers):
        assert _same_bits(r_slow.q[layer][:, :n], r_fast.q[layer][:, :n])
        assert _same_bits(r_slow.hidden[layer][:n], r_fast.hidden[layer][:n])
    return r_slow, r_fast


def test_compiled_step_records_what_the_numpy_path_records(tiny: dict[str, Path]) -> None:
    model = load_model(tiny["gemma3-types"])
    try:
        r_slow, r_fast = _same_recordings(model)
        for layer in range(model.net.args.n_layers):
            assert r_slow.specs[layer] == r_fast.specs[layer]
    finally:
        model.close()


def test_plan_follows_a_swapped_weight(tiny: dict[str, Path]) -> None:
    model = load_model(tiny["smollm2-types"])
    try:
        ids = list(range(5, 12))
        _steps(model, ids, fast=True)
        first = model.net.ops.decode_plan
        lin = model.net.layers[0].wq
        w = lin.weight
        rows = quantize(w.dequantize(), T.Q8_0)
        lin.replace(QTensor(w.name, T.Q8_0, w.shape, rows))  # the Quantization lens swaps blocks like this
        slow, _ = _steps(model, ids, fast=False)
        fast, _ = _steps(model, ids, fast=True)
        assert model.net.ops.decode_plan is not first
        assert _same_bits(slow, fast)
    finally:
        model.close()


def test_quantized_and_f32_caches_take_the_numpy_path_short_caches_pad_to_256(tiny: dict[str, Path]) -> None:
    model = load_model(tiny["gemma3-types"])
    try:
        plan = ggml_decode.plan_for(model.net, model.net.ops)
        assert not plan.fits(model.new_cache(64, "Q8_0"), 0)  # quantized rows: the NumPy path
        assert not plan.fits(model.new_cache(64, "F32"), 0)
        assert plan.fits(model.new_cache(40), 31)
        assert plan.fits(model.new_cache(40), 33)  # llama_context pads 40 cells to 256: n_kv 256, no scalar tail
        ids = list(range(5, 40))
        slow, _ = _steps(model, ids, fast=False, n_ctx=40)
        fast, _ = _steps(model, ids, fast=True, n_ctx=40)
        assert _same_bits(slow, fast)
    finally:
        model.close()


@pytest.mark.parametrize("fname", ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"])
def test_compiled_step_on_the_real_models(fname: str) -> None:
    path = model_path(fname)
    if path is None:
        pytest.skip(f"{fname} is not downloaded")
    model = load_model(path)
    try:
        ids = model.tokenizer.encode("The capital of France is Paris, and the capital of Italy is", add_special=True)
        slow, _ = _steps(model, ids, fast=False)
        fast, _ = _steps(model, ids, fast=True)
        assert _same_bits(slow, fast)
    finally:
        model.close()


@pytest.mark.parametrize("name", ["smollm2-types", "gemma3-types"])
def test_compiled_step_records_the_products_inputs_as_the_graph_does(tiny: dict[str, Path], name: str) -> None:
    """The recorder's input hook (what an importance matrix accumulates) sees the same matrices and the same rows
    in the compiled step as in the graph's op-by-op path."""
    model = load_model(tiny[name])
    try:
        ids = list(range(5, 15))
        seen: dict[bool, list[tuple[tuple[str, ...], np.ndarray]]] = {True: [], False: []}
        for fast in (False, True):
            rec = Recorder(on_input=lambda names, x, f=fast: seen[f].append((names, np.array(x, np.float32).reshape(-1))))
            _steps(model, ids, fast=fast, recorder=rec)
        assert [n for n, _ in seen[True]] == [n for n, _ in seen[False]]
        assert len(seen[True]) == len(ids) * model.net.args.n_layers * 4  # q/k/v, output, gate/up, down per block
        for (_, a), (_, b) in zip(seen[True], seen[False]):
            assert _same_bits(a, b)
    finally:
        model.close()


@pytest.mark.parametrize("name", ["qwen3moe", "qwen2moe", "mixtral"])
@pytest.mark.parametrize("quant", ["F16", "Q4_K_M"])
def test_compiled_step_runs_experts_layers_as_the_graph(tmp_path_factory: pytest.TempPathFactory, name: str,
                                                        quant: str) -> None:
    """Mixture-of-Experts blocks in the compiled step (the experts module between its calls): the NumPy path's
    logits, cache and routing, bit for bit."""
    from tests.engine.models.arch_cases import model_file

    model = load_model(model_file(tmp_path_factory.mktemp("moe-decode"), name, quant))
    try:
        ids = list(range(5, 21))
        r_slow, r_fast = Recorder(), Recorder()
        slow, c_slow = _steps(model, ids, fast=False, recorder=r_slow)
        fast, c_fast = _steps(model, ids, fast=True, recorder=r_fast)
        plan = model.net.ops.decode_plan
        assert plan.ok and any(lay.moe is not None for lay in plan.layers)  # the compiled step ran the experts
        assert _same_bits(slow, fast)
        for layer in range(model.net.args.n_layers):
            assert np.array_equal(c_slow.k[layer][:, : len(ids)], c_fast.k[layer][:, : len(ids)])
            a, b = r_slow.routing_of(layer), r_fast.routing_of(layer)
            assert np.array_equal(a[0], b[0]) and _same_bits(a[1], b[1])
    finally:
        model.close()
