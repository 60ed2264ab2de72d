"""Direct logit attribution on every decoder architecture: the parts sum to the engine's own logit (difference) from
its normal forward, each layer's parts to the residual update the run recorded, and what the linear parts leave
unexplained (the remainders) is rounding in float32 numerics."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.attribute.api import Attribution, attribute
from engine.generate import prefill
from engine.intervene.ablation import Ablation, ablate
from engine.intervene.control_vector import ControlVector, apply
from engine.intervene.hooks import run_with_cache
from engine.model import load_model
from engine.observe.recorder import Recorder
from tests.engine.arch_files import arch_file
from tests.engine.attribute.conftest import ARCHS, IDS


def _ids(model) -> list[int]:  # noqa: ANN001
    return [3 + i % (model.args.n_vocab - 3) for i in IDS]


def _forward_logits(model, ids: list[int]) -> np.ndarray:  # noqa: ANN001
    """The engine's normal forward (no hooks, no recorder): every position's logits."""
    return prefill(model, ids, model.new_cache(len(ids)), all_logits=True)


def _pick(logits: np.ndarray, p: int) -> tuple[int, int]:
    """A target and a contrast the model separates at p: its top token and its tenth."""
    order = np.argsort(-logits[p], kind="stable")
    return int(order[0]), int(order[9])


def _layer_updates(model, ids: list[int], p: int, target: int, contrast: int | None) -> np.ndarray:  # noqa: ANN001
    """Each block's recorded residual update at p along the logit direction, from the engine's hooks on the prompt up
    to p (what attribute runs: the model is causal) (Gemma 4: the block's output scale applied to what came before,
    and to the update by the blocks after it)."""
    net, n = model.net, model.args.n_layers
    _, acts = run_with_cache(model, ids[: p + 1])
    p = -1
    x = acts[f"blocks.{n - 1}.hook_resid_post"][p].astype(np.float64)
    w = net.output.weight.rows([target] + ([contrast] if contrast is not None else [])).astype(np.float64)
    u = (w[0] - (w[1] if contrast is not None else 0.0)) * net.out_norm / np.sqrt(np.mean(x * x) + model.args.norm_eps)
    scales = [1.0 if s is None else float(s) for s in getattr(net, "out_scales", [None] * n)]
    out = []
    for i in range(n):
        pre = acts[f"blocks.{i}.hook_resid_pre"][p].astype(np.float64)
        post = acts[f"blocks.{i}.hook_resid_post"][p].astype(np.float64)
        out.append(float((post - scales[i] * pre) @ u) * float(np.prod(scales[i + 1:])))
    return np.array(out)


def _check_sums(a: Attribution, forward: np.ndarray, cap: float | None) -> None:
    """The components sum to logit_diff, and logit_diff is the forward's (through the cap where there is one)."""
    assert abs(float(np.sum(a.values)) - a.logit_diff) < 1e-9
    row = forward[a.position].astype(np.float64)
    if cap is None:
        want = row[a.target.id] - (row[a.contrast.id] if a.contrast is not None else 0.0)
        assert abs(a.logit_diff - want) < 1e-4, (a.logit_diff, want)
    else:  # attributed before the cap: capped, it is the forward's logit
        assert a.contrast is None
        assert abs(cap * np.tanh(a.logit_diff / cap) - row[a.target.id]) < 1e-4  # gemma2.cpp's cap


@pytest.mark.parametrize("name", ARCHS + ("gemma3",))
def test_parts_sum_to_the_forward_logit_and_layers_to_their_updates(arch_dir: Path, name: str) -> None:
    model = load_model(arch_file(arch_dir, name), numerics="float32", warm=False)
    try:
        ids = _ids(model)
        forward = _forward_logits(model, ids)
        cap = getattr(model.args, "final_softcap", None)
        for p in (len(ids) - 1, 4):
            target, contrast = _pick(forward, p)
            got = attribute(model, ids, f"#{target}", None if cap else contrast, position=p)
            _check_sums(got, forward, cap)
            n = model.args.n_layers
            per_layer = np.array([got.values[got.layers == i].sum() for i in range(n)])
            want = _layer_updates(model, ids, p, target, None if cap else contrast)
            np.testing.assert_allclose(per_layer, want, rtol=0, atol=1e-6)
            np.testing.assert_allclose(got.layer_updates, want, rtol=0, atol=1e-6)
            # float32 numerics: the heads, FFNs and experts explain each block's update up to rounding
            scale = 1.0 + float(np.max(np.abs(got.values)))
            rest = np.abs(got.values[got.kinds == "remainder"])
            assert rest.max() < 1e-4 * scale, (name, rest.max(), scale)
            heads = got.kinds == "head"
            assert heads.sum() >= n and np.abs(got.values[heads]).max() > 1e-3 * scale  # the heads carry weight
    finally:
        model.close()


@pytest.mark.parametrize("name", ("llama3", "gemma2", "qwen3moe", "qwen35", "gemma4_moe"))
def test_ggml_numerics_sum_exactly_with_the_quantization_in_the_remainders(arch_dir: Path, name: str) -> None:
    """Q4_K_M weights: llama.cpp's numerics quantize every product's activations (Q8_K), which the float64 parts do
    not; the remainders carry it (1-3% of the largest part on these models) and the sums stay exact."""
    model = load_model(arch_file(arch_dir, name, "Q4_K_M"), numerics="ggml")
    try:
        ids = _ids(model)
        forward = _forward_logits(model, ids)
        cap = getattr(model.args, "final_softcap", None)
        target, contrast = _pick(forward, len(ids) - 1)
        got = attribute(model, ids, f"#{target}", None if cap else contrast)
        _check_sums(got, forward, cap)
        want = _layer_updates(model, ids, len(ids) - 1, target, None if cap else contrast)
        np.testing.assert_allclose([got.values[got.layers == i].sum() for i in range(model.args.n_layers)], want,
                                   rtol=0, atol=1e-6)
        rest = np.abs(got.values[got.kinds == "remainder"]).max()
        assert 1e-4 < rest < 0.1 * np.abs(got.values).max()  # 8-bit activations: there, and small next to the parts
        first = attribute(model, ids, f"#{target}", position=0)  # one token: the decode step's paths, hooked
        row = _forward_logits(model, ids[:1])[0].astype(np.float64)
        assert abs((first.logit_diff if cap is None else cap * np.tanh(first.logit_diff / cap)) - row[target]) < 1e-4
        assert abs(float(first.values.sum()) - first.logit_diff) < 1e-9
    finally:
        model.close()


def test_experts_are_the_routed_ones(arch_dir: Path) -> None:
    model = load_model(arch_file(arch_dir, "qwen2moe"), numerics="float32", warm=False)
    try:
        ids = _ids(model)
        rec = Recorder(capture_q=False)
        model.forward(ids, model.new_cache(len(ids)), rec, all_logits=True)
        rec.commit()
        got = attribute(model, ids, "#7", "#8", position=5)
        for i in range(model.args.n_layers):
            experts = got.indices[(got.kinds == "expert") & (got.layers == i)]
            assert sorted(experts.tolist()) == sorted(rec.routing_of(i)[0][5].tolist())
            assert ((got.kinds == "shared_expert") & (got.layers == i)).sum() == 1
    finally:
        model.close()


@pytest.mark.parametrize(("name", "layer", "head"), [("llama3", 1, 2), ("qwen35", 0, 1)])
def test_an_ablated_head_contributes_nothing_and_the_sums_still_hold(arch_dir: Path, name: str, layer: int,
                                                                      head: int) -> None:
    model = load_model(arch_file(arch_dir, name), numerics="float32", warm=False)
    try:
        ids = _ids(model)
        before = attribute(model, ids, "#7", "#8")
        ablate(model, Ablation(heads=((layer, head),)))
        forward = _forward_logits(model, ids)
        got = attribute(model, ids, "#7", "#8")
        one = (got.kinds == "head") & (got.layers == layer) & (got.indices == head)
        assert one.sum() == 1 and got.values[one][0] == 0.0
        assert before.values[one][0] != 0.0
        _check_sums(got, forward, None)
    finally:
        model.close()


def test_a_control_vector_is_a_part_of_its_own(arch_dir: Path) -> None:
    model = load_model(arch_file(arch_dir, "llama3"), numerics="float32", warm=False)
    try:
        ids = _ids(model)
        vec = np.random.default_rng(5).normal(0, 0.5, model.args.dim).astype(np.float32)
        apply(model, ControlVector({1: vec}, (("test", 1.0),), model.args.dim))
        forward = _forward_logits(model, ids)
        target, contrast = _pick(forward, len(ids) - 1)
        got = attribute(model, ids, f"#{target}", f"#{contrast}")
        _check_sums(got, forward, None)
        control = got.values[got.kinds == "control"]
        assert control.shape == (1,) and abs(control[0]) > 1e-3
        assert got.layers[got.kinds == "control"][0] == 1
        assert np.abs(got.values[got.kinds == "remainder"]).max() < 1e-4  # explained, not left to the remainder
    finally:
        model.close()
