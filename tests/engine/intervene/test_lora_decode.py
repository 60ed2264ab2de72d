"""LoRA adapters and control vectors in the compiled decode step (engine.runtime.decode_lora, decode_plan).

The compiled step with adapters gives the op-by-op path's bits (which tests/engine/intervene/test_lora.py holds to
llama.cpp) token by token after a prompt: on small models of the catalog's architectures with adapters of every kind
the step binds (F32 and F16 halves in one call, a rank under and at the dot's step; BF16 and Q8_0 halves through the
bound products) on every matrix the plan binds, the output head and a hybrid's mixer included, with a control vector;
and on SmolLM2 with the llama.cpp fixtures' adapters. The adapters change the logits (both paths apply them), and the
plan follows them as they are applied, replaced and removed.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from benchmarks.synthetic_model import spec, write_synthetic
from engine.gguf import write_gguf
from engine.intervene import control_vector as cv
from engine.intervene import lora
from engine.kernels.dispatch import compiled
from engine.model import load_model
from engine.quant import quantize
from engine.quant.types import TYPES, GGMLType
from engine.runtime import decode_plan
from tests.engine.models.arch_cases import model_file
from tests.engine.models.test_ggml_decode import _steps
from tests.tiny_models import make_tiny_llama
from tools.make_cvec_fixtures import write_cvec
from tools.make_lora_fixtures import write_lora

T = GGMLType
pytestmark = pytest.mark.skipif(not compiled(), reason="the compiled decode step needs numba")
PROMPT = list(range(11, 19))
STEPS = list(range(40, 50))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lora-decode")


def _models(folder: Path) -> dict[str, Callable[[], Path]]:
    smol = spec("smollm2-135m-instruct", dim=64, hidden=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                n_vocab=300, n_ctx=512)
    gemma = spec("gemma3-270m", dim=64, hidden=256, n_layers=3, n_heads=2, n_kv_heads=1, head_dim=128, n_vocab=300,
                 n_ctx=512, window=8)
    return {
        "smollm2-types": lambda: write_synthetic(folder / "smol.gguf", smol, seed=1),
        "gemma3-types": lambda: write_synthetic(folder / "gemma.gguf", gemma, seed=2),
        "llama-q4_0-untied": lambda: make_tiny_llama(folder / "q4_0.gguf", qtype=T.Q4_0, tied=False),
        "qwen35-q8_0": lambda: model_file(folder, "qwen35", "Q8_0"),
    }


def write_adapter(path: Path, model, rank: int, qtype: GGMLType, seed: int,  # noqa: ANN001
                  pick: Callable[[str], bool] = lambda name: True, strength: float = 0.05) -> Path:
    """A LoRA adapter in llama.cpp's format on every matrix of `model` that `pick` takes and `qtype`'s blocks fit."""
    rng = np.random.default_rng(seed)
    block = TYPES[qtype].block_size
    tensors = []
    for name, lin in sorted(model.net.linears().items()):
        if name == "token_embd.weight" or not pick(name) or lin.n_in % block or rank % block:
            continue
        a = rng.standard_normal((rank, lin.n_in)).astype(np.float32) / np.float32(math.sqrt(lin.n_in))
        b = rng.standard_normal((lin.n_out, rank)).astype(np.float32) * np.float32(strength)
        tensors += [(name + ".lora_a", qtype, (lin.n_in, rank), quantize(a, qtype)),
                    (name + ".lora_b", qtype, (rank, lin.n_out), quantize(b, qtype))]
    assert tensors
    md = {"general.architecture": model.arch, "general.type": "adapter", "adapter.type": "lora",
          "adapter.lora.alpha": np.float32(2 * rank)}
    write_gguf(path, md, tensors)
    return path


def _bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _both(model) -> tuple[np.ndarray, np.ndarray, int]:  # noqa: ANN001
    """Op by op, then compiled: the steps' logits of each and how many steps the compiled plan ran."""
    ran = [0]
    step = decode_plan.DecodePlan.step

    def counted(self, *args):  # noqa: ANN001, ANN002, ANN202
        ran[0] += 1
        return step(self, *args)

    slow, _ = _steps(model, STEPS, fast=False, prompt=PROMPT)
    decode_plan.DecodePlan.step = counted
    try:
        fast, _ = _steps(model, STEPS, fast=True, prompt=PROMPT)
    finally:
        decode_plan.DecodePlan.step = step
    return slow, fast, ran[0]


def _cvec(model, seed: int) -> cv.ControlVector:  # noqa: ANN001
    rng = np.random.default_rng(seed)
    n = model.args.n_layers
    dirs = {il: (rng.standard_normal(model.args.dim) * 0.5).astype(np.float32) for il in range(1, n)}
    return cv.ControlVector(dirs, (("synthetic", 1.0),), model.args.dim)


@pytest.mark.parametrize("name", ["smollm2-types", "gemma3-types", "llama-q4_0-untied", "qwen35-q8_0"])
def test_the_compiled_step_with_adapters_gives_the_op_by_op_bits(folder: Path, name: str) -> None:
    model = load_model(_models(folder)[name]())
    try:
        plain, _, _ = _both(model)
        files = [  # F32 on everything at ranks under and at the step, F16, BF16 and Q8_0 (bound products) on some
            (write_adapter(folder / f"{name}-f32.gguf", model, 8, T.F32, 1), 1.0),
            (write_adapter(folder / f"{name}-f32-r64.gguf", model, 64, T.F32, 2, lambda n: "ffn_up" in n), 0.5),
            (write_adapter(folder / f"{name}-f16.gguf", model, 4, T.F16, 3, lambda n: "attn" in n or "ssm" in n), 2.0),
            (write_adapter(folder / f"{name}-f16-r64.gguf", model, 64, T.F16, 4, lambda n: "ffn_down" in n), 1.0),
            (write_adapter(folder / f"{name}-bf16.gguf", model, 4, T.BF16, 5, lambda n: "ffn" in n), 1.0),
            (write_adapter(folder / f"{name}-q8_0.gguf", model, 32, T.Q8_0, 6), 0.75),
        ]
        adapters = [lora.load(model, path, scale) for path, scale in files]
        lora.apply(model, adapters)
        cv.apply(model, _cvec(model, 7))
        slow, fast, ran = _both(model)
        assert ran == len(STEPS) and model.net.ops.decode_plan.ok
        assert _bits(slow, fast)
        assert not np.allclose(slow, plain, atol=1e-2)  # the adapters and the direction moved the logits
        adapted = {name for name, lin in model.net.linears().items() if lin.loras}
        if name == "llama-q4_0-untied":
            assert "output.weight" in adapted
        if name == "qwen35-q8_0":
            assert {"blk.0.attn_qkv.weight", "blk.0.ssm_out.weight", "blk.3.attn_q.weight"} <= adapted
    finally:
        for ad in lora.current(model):
            ad.file.close()
        model.close()


def test_a_control_vector_alone_takes_the_compiled_step(folder: Path) -> None:
    model = load_model(_models(folder)["gemma3-types"]())  # post-norms: the residual add normed before the direction
    try:
        cv.apply(model, _cvec(model, 8), layer_start=1)
        slow, fast, ran = _both(model)
        assert ran == len(STEPS) and _bits(slow, fast)
    finally:
        model.close()


def test_the_plan_follows_the_adapters(folder: Path) -> None:
    model = load_model(_models(folder)["smollm2-types"]())
    try:
        plain, _, _ = _both(model)
        path = write_adapter(folder / "follow.gguf", model, 8, T.F16, 9)
        first = lora.load(model, path, 1.0)
        lora.apply(model, [first])
        slow, fast, _ = _both(model)
        assert _bits(slow, fast) and not _bits(fast, plain)
        again = lora.load(model, path, 0.25)  # another adapter object at another scale: the plan is rebuilt
        lora.apply(model, [again])
        slow_q, fast_q, _ = _both(model)
        assert _bits(slow_q, fast_q) and not _bits(fast_q, fast)
        lora.apply(model, [])
        _, none, ran = _both(model)
        assert ran == len(STEPS) and _bits(none, plain)
        first.file.close()
        again.file.close()
    finally:
        model.close()


def test_smollm2_with_the_llama_cpp_fixtures_adapters(smollm2_path: Path, folder: Path) -> None:
    """The fixtures' adapters (F32 rank 8 on attn_q / attn_v, F16 rank 4 on ffn_up / ffn_down) and control vector
    on the real model: the compiled step gives the op-by-op path's bits."""
    model = load_model(smollm2_path)
    try:
        adapters = [lora.load(model, write_lora(folder, "a"), 0.5), lora.load(model, write_lora(folder, "b"), 1.0)]
        lora.apply(model, adapters)
        a = model.args
        cv.apply(model, cv.load([(write_cvec(folder, "a"), 0.8)], a.dim, a.n_layers, model.arch))
        slow, fast, ran = _both(model)
        assert ran == len(STEPS) and _bits(slow, fast)
    finally:
        for ad in lora.current(model):
            ad.file.close()
        model.close()
