"""The compiled decode step on the hybrids (engine.runtime.decode_plan with engine.runtime.decode_mixer): a recurrent
block's mixer and gated attention give the op-by-op graph's bits, its recurrent states and its recordings.

The logits against llama.cpp's are tests/engine/models/test_hybrid_logits.py's (their decode steps take this path);
here the two paths of our own are held to each other token by token, the state carried from a prompt, with an
ablated value head (the op-by-op layer then) and with the recorder on.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.intervene.ablation import Ablation, ablate
from engine.kernels.dispatch import compiled
from engine.model import load_model
from engine.observe.recorder import Recorder
from engine.runtime import decode_plan as ggml_decode
from tests.engine.models.arch_cases import model_file
from tests.engine.models.test_ggml_decode import _steps

pytestmark = pytest.mark.skipif(not compiled(), reason="the compiled decode step needs numba")
PROMPT = list(range(11, 27))
STEPS = list(range(40, 52))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hybrid-decode")


def _run(model, fast: bool, recorder: Recorder | None = None):
    """A prompt in one batch, then one token per step on the compiled plan (fast) or op by op."""
    return _steps(model, STEPS, fast, recorder, prompt=PROMPT)


def _both(model):
    """Both paths with recorders: (slow logits, fast logits, their caches, their recorders, the product inputs each
    recorded in order)."""
    seen: tuple[list, list] = ([], [])
    recs = [Recorder(capture_hidden=True, on_input=lambda names, x, got=got: got.append((names, x.copy())))
            for got in seen]
    (slow, c_slow), (fast, c_fast) = _run(model, False, recs[0]), _run(model, True, recs[1])
    return slow, fast, (c_slow, c_fast), recs, seen


def _same_inputs(seen: tuple[list, list]) -> bool:
    """The same products' inputs, in the same order, bit for bit (what an importance matrix reads)."""
    return ([names for names, _ in seen[0]] == [names for names, _ in seen[1]]
            and all(_bits(a, b) for (_, a), (_, b) in zip(*seen)))


def _bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(np.ascontiguousarray(a, np.float32).view(np.uint32),
                                                 np.ascontiguousarray(b, np.float32).view(np.uint32))


@pytest.mark.parametrize(("name", "quant"), [("qwen35", "Q4_K_M"), ("qwen35", "Q8_0"), ("qwen35moe", "Q4_K_M"),
                                             ("qwen35moe", "MXFP4_MOE"), ("qwen35moe_fused", "Q4_K_M"),
                                             ("qwen3next", "Q4_K_M"),
                                             ("qwen3next_legacy", "Q8_0")])
def test_compiled_hybrid_step_equals_the_graph(folder: Path, name: str, quant: str) -> None:
    model = load_model(model_file(folder, name, quant))
    try:
        slow, fast, (c_slow, c_fast), (r_slow, r_fast), seen = _both(model)
        plan = model.net.ops.decode_plan
        assert plan is not None and plan.ok
        assert any(lay.mixer is not None for lay in plan.layers) and any(lay.q_gated is not None for lay in plan.layers)
        assert _bits(slow, fast)
        for i in model.net.mixers:
            assert _bits(c_slow.state(i).ssm, c_fast.state(i).ssm) and _bits(c_slow.state(i).conv, c_fast.state(i).conv)
            a, b = r_slow.recurrent_inputs(i), r_fast.recurrent_inputs(i)
            for key in ("q", "k", "v", "g", "beta"):
                assert _bits(a[key], b[key]), (i, key)
        n = len(PROMPT) + len(STEPS)
        for layer in range(model.net.args.n_layers):
            assert _bits(r_slow.hidden[layer][:n], r_fast.hidden[layer][:n]), layer
            if layer not in model.net.mixers:
                assert _bits(r_slow.q[layer][:, :n], r_fast.q[layer][:, :n])
                assert np.array_equal(c_slow.k[layer][:, :n], c_fast.k[layer][:, :n])
        assert _same_inputs(seen)
    finally:
        model.close()


def test_an_ablated_value_head_takes_the_graph(folder: Path) -> None:
    """A zeroed DeltaNet head is the op-by-op layer's work: the plan says it does not fit, the logits change."""
    model = load_model(model_file(folder, "qwen35", "Q8_0"))
    try:
        plain, _ = _run(model, fast=True)
        ablate(model, Ablation(heads=((0, 1),)))
        cache = model.new_cache(256)
        plan = ggml_decode.plan_for(model.net, model.net.ops)
        assert not plan.fits(cache, 0)
        ablated, _ = _run(model, fast=True)
        assert not np.array_equal(plain, ablated)
        ablate(model, Ablation())
        again, _ = _run(model, fast=True)
        assert _bits(plain, again)
    finally:
        model.close()


def test_fused_gate_up_experts_give_the_split_files_bits(folder: Path) -> None:
    """ffn_gate_up_exps (convert_hf_to_gguf.py --fuse-gate-up-exps) holds the same weights as the split file here
    (tools/make_hybrid_models.py draws them alike): one product per expert, split into gate and up, gives the same
    logits bit for bit, prompt and steps."""
    fused, split = (load_model(model_file(folder, name, "Q8_0")) for name in ("qwen35moe_fused", "qwen35moe"))
    try:
        assert all(lay.ffn.fused_gate_up and lay.ffn.gate is None for lay in fused.net.layers)
        assert not any(lay.ffn.fused_gate_up for lay in split.net.layers)
        assert _bits(_run(fused, fast=True)[0], _run(split, fast=True)[0])
    finally:
        fused.close()
        split.close()


@pytest.mark.parametrize(("name", "quant"), [("gemma4", "Q4_K_M"), ("gemma4", "Q8_0"), ("gemma4_moe", "Q4_K_M")])
def test_compiled_gemma4_step_equals_the_graph(folder: Path, name: str, quant: str) -> None:
    """Gemma 4 in the compiled step: its sliding and global blocks of their own shapes and RoPE, the KV-sharing
    blocks reading their source's rows, V norm, the FFN seam (the dense FFN bound; with experts, the seam called on
    the residual) and the per-layer inputs after each block: the graph's bits, cache and recordings."""
    model = load_model(model_file(folder, name, quant))
    try:
        slow, fast, (c_slow, c_fast), (r_slow, r_fast), seen = _both(model)
        plan = model.net.ops.decode_plan
        assert plan is not None and plan.ok
        if name == "gemma4":  # blocks 4-7 read blocks 2's and 3's rows
            assert [lay.kv_layer for lay in plan.layers][4:] == [2, 2, 2, 3]
        else:  # experts beside the dense FFN: the seam called between the compiled calls
            assert any(lay.seam is not None for lay in plan.layers)
        assert all(lay.finish for lay in plan.layers) and len({lay.q_rot.shape for lay in plan.layers}) == 2
        assert _bits(slow, fast)
        n = len(PROMPT) + len(STEPS)
        for layer in range(model.net.args.n_layers):
            assert _bits(r_slow.hidden[layer][:n], r_fast.hidden[layer][:n]), layer
            assert _bits(r_slow.q[layer][:, :n], r_fast.q[layer][:, :n]), layer
        for layer in c_slow.kv_layers:
            assert np.array_equal(c_slow.k[layer][:, :n], c_fast.k[layer][:, :n])
            assert np.array_equal(c_slow.v[layer][:, :n], c_fast.v[layer][:, :n])
        assert _same_inputs(seen)
    finally:
        model.close()
