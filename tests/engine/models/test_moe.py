"""Mixture-of-Experts: each feature the graph has moves llama.cpp's answer, experts stay mapped, bad files are refused.

test_arch_logits holds qwen3moe, qwen2moe and the Mixtral-style llama to llama.cpp's logits (to the bit in ggml
numerics). Here: switching off any one feature of build_moe_ffn (the renormalisation, the shared expert, its
sigmoid gate, k) moves our logits away from llama.cpp's by far more than rounding, so those tests would see it
missing; a token builds the products of its chosen experts only; and each broken MoE file gets a refusal that
names the field.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.gguf import write_gguf
from engine.model import load_model
from engine.models.experts import WEIGHT_SUM_MIN, MoEFFN, route
from engine.runtime.numerics import numerics_for
from engine.tensor import Linear
from tests.engine.models.arch_cases import model_file, our_logits, reference, stats
from tools.make_arch_models import U32, build

CORRECT_KLD_MAX = 1e-9  # ggml numerics with every feature: llama.cpp's logits (test_arch_logits)
MOVED_KLD_MEAN = 1e-3  # one feature left out: the mean KLD to llama.cpp's answer is at least this


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("moe")


def _ablated(monkeypatch: pytest.MonkeyPatch, change: Callable[[MoEFFN], None]) -> None:
    """Every MoE layer of the next model loaded changed by `change` (a feature left out)."""
    import engine.models.experts as experts

    real = experts.load_moe

    def load(*args: Any) -> MoEFFN:
        ffn = real(*args)
        change(ffn)
        return ffn

    monkeypatch.setattr("engine.models.transformer.load_moe", load)


class _Ungated(Linear):
    """The shared expert's gate product made constant: sigmoid(30) = 1, the shared expert added ungated."""

    def __call__(self, x: Any) -> np.ndarray:
        return np.full((np.asarray(x).shape[0], 1), 30.0, np.float32)


def _no_gate(f: MoEFFN) -> None:
    gate = copy.copy(f.shared_gate)
    gate.__class__ = _Ungated
    f.shared_gate = gate


ABLATIONS = {
    "qwen3moe-no-renormalisation": ("qwen3moe", lambda f: setattr(f, "normalize", False)),
    "mixtral-no-renormalisation": ("mixtral", lambda f: setattr(f, "normalize", False)),
    "qwen2moe-renormalised": ("qwen2moe", lambda f: setattr(f, "normalize", True)),
    "qwen2moe-no-shared-expert": ("qwen2moe", lambda f: setattr(f, "shared", None)),
    "qwen2moe-shared-gate-constant": ("qwen2moe", _no_gate),
    "qwen3moe-one-expert-fewer": ("qwen3moe", lambda f: setattr(f, "n_used", f.n_used - 1)),
}


@pytest.mark.parametrize("case", list(ABLATIONS))
def test_each_feature_moves_llama_cpps_answer(folder: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    name, change = ABLATIONS[case]
    ref = reference(name, "F16")
    path = model_file(folder, name, "F16")
    exact = stats(ref, our_logits(path, ref.ids, "ggml"))
    _ablated(monkeypatch, change)
    moved = stats(ref, our_logits(path, ref.ids, "ggml"))
    print(case, exact, moved)
    assert exact["kld_max"] <= CORRECT_KLD_MAX
    assert moved["kld_mean"] >= MOVED_KLD_MEAN


@pytest.mark.parametrize("numerics", ["ggml", "float32"])
def test_a_token_builds_only_its_experts_products(folder: Path, numerics: str) -> None:
    """Experts stay in the memory map: a token adds the products of the k experts it chose, no others (ggml), or
    none at all (float32 dequantizes the chosen ones per call); the recorder says which it chose."""
    from engine.observe.recorder import Recorder

    model = load_model(model_file(folder, "qwen3moe", "Q8_0"), numerics=numerics)
    try:
        before = [[set(e.resident_experts()) for e in layer.ffn.experts()] for layer in model.net.layers]
        rec = Recorder()
        cache = model.new_cache(16)
        rec.begin(0, 1)
        model.net.forward([7], cache, rec)
        rec.commit()
        for i, layer in enumerate(model.net.layers):
            ffn = layer.ffn
            experts, weights, probs = rec.routing_of(i)
            chosen = set(experts[0].tolist())
            assert experts.shape == (1, ffn.n_used) and np.isclose(weights.sum(), 1.0, atol=1e-6)
            assert probs.shape == (1, 8) and probs[0, experts[0, 0]] == probs.max()
            for e, old in zip(ffn.experts(), before[i]):
                now = set(e.resident_experts())
                assert now == (old | chosen if numerics == "ggml" else set()), (i, old, now, chosen)
            assert len(set(ffn.up.resident_experts())) < ffn.up.n_expert or numerics == "float32"
    finally:
        model.close()


def test_routing_takes_the_top_k_in_order_and_renormalises() -> None:
    ops = numerics_for("ggml")
    logits = np.array([[0.0, 3.0, 1.0, 3.0, -2.0]], np.float32)
    r = route(logits, 3, ops, normalize=False)
    assert r.experts.tolist() == [[1, 3, 2]]  # descending; a tie goes to the lower index
    assert np.allclose(r.probs.sum(), 1.0, atol=1e-6) and np.array_equal(r.weights, r.probs[:, [1, 3, 2]])
    n = route(logits, 3, ops, normalize=True)
    total = r.weights.astype(np.float64).sum().astype(np.float32)  # ggml_sum_rows, then ggml_div
    assert np.array_equal(n.weights, r.weights / max(total, WEIGHT_SUM_MIN)) and n.experts.tolist() == [[1, 3, 2]]


# ---- bad files: each refused with the field named


def _variant(folder: Path, name: str, tag: str, md_change: dict[str, Any] | None = None,
             tensor_change: Callable[[list], list] | None = None) -> Path:
    md, ts = build(name)
    for k, v in (md_change or {}).items():
        if v is None:
            md.pop(k, None)
        else:
            md[k] = v
    if tensor_change is not None:
        ts = tensor_change(ts)
    path = folder / f"{name}-{tag}.gguf"
    write_gguf(path, md, ts)
    return path


def _reshape(target: str, shape: tuple[int, ...]) -> Callable[[list], list]:
    def change(ts: list) -> list:
        out = []
        for n, t, s, a in ts:
            if n == target:
                s = shape
                a = np.zeros(tuple(reversed(shape)), np.float32)
            out.append((n, t, s, a))
        return out

    return change


def _add(name: str, shape: tuple[int, ...]) -> Callable[[list], list]:
    return lambda ts: ts + [(name, ts[0][1], shape, np.zeros(tuple(reversed(shape)), np.float32))]


BAD = {
    "no-expert-count": ("qwen3moe", {"qwen3moe.expert_count": None}, None, r"qwen3moe\.expert_count.*missing"),
    "expert-count-0": ("qwen3moe", {"qwen3moe.expert_count": U32(0)}, None, r"qwen3moe\.expert_count = 0"),
    "expert-count-600": ("qwen3moe", {"qwen3moe.expert_count": U32(600)}, None, r"qwen3moe\.expert_count = 600"),
    "used-above-count": ("qwen3moe", {"qwen3moe.expert_used_count": U32(9)}, None, r"qwen3moe\.expert_used_count = 9"),
    "used-0": ("mixtral", {"llama.expert_used_count": U32(0)}, None, r"llama\.expert_used_count = 0"),
    "used-per-layer": ("qwen3moe", {"qwen3moe.expert_used_count": np.array([2, 2], np.uint32)}, None,
                       r"qwen3moe\.expert_used_count.*per-layer"),
    "expert-groups": ("qwen3moe", {"qwen3moe.expert_group_count": U32(2)}, None, r"qwen3moe\.expert_group_count = 2"),
    "third-dim": ("qwen3moe", None, _reshape("blk.1.ffn_up_exps.weight", (256, 256, 7)),
                  r"blk\.1\.ffn_up_exps\.weight.*expected 256x256x8, got 256x256x7"),
    "router-width": ("mixtral", None, _reshape("blk.0.ffn_gate_inp.weight", (256, 5)),
                     r"blk\.0\.ffn_gate_inp\.weight.*expected 256x4, got 256x5"),
    "no-router": ("qwen2moe", None, lambda ts: [x for x in ts if x[0] != "blk.0.ffn_gate_inp.weight"],
                  r"blk\.0\.ffn_gate_inp\.weight.*missing"),
    "shared-expert-in-llama": ("mixtral", None, _add("blk.0.ffn_up_shexp.weight", (256, 64)),
                               r"blk\.0\.ffn_up_shexp\.weight.*not applied"),
    "selection-bias": ("qwen3moe", None, _add("blk.0.exp_probs_b.bias", (8,)), r"blk\.0\.exp_probs_b\.bias.*not applied"),
    "experts-in-dense-qwen3": ("qwen3", {"qwen3.expert_count": U32(8), "qwen3.expert_used_count": U32(2)}, None,
                               r"qwen3\.expert_count = 8.*no Mixture-of-Experts"),
    "experts-without-count": ("mixtral", {"llama.expert_count": None}, None,
                              r"blk\.0\.ffn_(gate|up|down)\.weight.*missing|blk\.\d\.ffn_\w+_exps\.weight.*not applied"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_broken_moe_files_are_refused_by_name(folder: Path, case: str) -> None:
    name, md_change, tensor_change, pattern = BAD[case]
    path = _variant(folder, name, case, md_change, tensor_change)
    with pytest.raises(ModelFormatError, match=pattern):
        load_model(path).close()


# ---- the routing itself against llama.cpp's (tools/make_moe_routing_fixtures.py: its ffn_moe_topk tensors)


ROUTED = [(name, quant) for name in ("qwen3moe", "qwen2moe", "mixtral", "gpt_oss") for quant in ("F16", "Q4_K_M")]


@pytest.mark.parametrize("numerics", ["ggml", "float32"])
@pytest.mark.parametrize(("name", "quant"), [*ROUTED, ("gpt_oss", "MXFP4_MOE")])
def test_chosen_experts_are_llama_cpps(folder: Path, name: str, quant: str, numerics: str) -> None:
    """Every token's experts in every layer, in llama.cpp's order, for a 128-token prompt (ggml numerics: all of
    them; float32: the same set of experts for all but the few near-ties the 8-bit activations decide the other way,
    whose order may differ where two chosen experts are nearly tied)."""
    from engine.generate import prefill
    from engine.observe.recorder import Recorder
    from engine.observe.routing import routing_layers, routing_report
    from tools.make_arch_models import FIXTURES

    z = np.load(FIXTURES / f"{name}_routing.npz")
    ids = z["ids"].tolist()
    model = load_model(model_file(folder, name, quant), numerics=numerics)
    try:
        rec = Recorder(capture_q=False)
        prefill(model, ids, model.new_cache(len(ids)), recorder=rec, chunk_size=256)
        layers = routing_layers(rec, model.args.n_layers)
        assert [lr.layer for lr in layers] == list(range(model.args.n_layers))
        for lr in layers:
            want = z[f"{quant}_layer{lr.layer}"]
            got = lr.experts if numerics == "ggml" else np.sort(lr.experts, axis=1)  # float32: the same set
            same = (got == (want if numerics == "ggml" else np.sort(want, axis=1))).all(axis=1).mean()
            print(name, quant, numerics, lr.layer, same)
            assert same == 1.0 if numerics == "ggml" else same >= 0.9
        report = routing_report(layers, [str(t) for t in ids])
        first = report["layers"][0]
        assert sum(first["load"]) == len(ids) * first["k"] and abs(sum(first["weight_share"]) - 1) < 1e-5
        assert report["tokens"][5]["layers"][1]["experts"] == layers[1].experts[5].tolist()
        assert 0 < first["mean_entropy_bits"] <= np.log2(first["n_expert"])
    finally:
        model.close()


@pytest.mark.parametrize(("name", "quant", "kernel"), [("qwen3moe", "Q4_K_M", "gemv_experts_q4_k_8x8"),
                                                       ("qwen3moe", "Q4_K_M", "gemv_experts_q6_k"),
                                                       ("gpt_oss", "MXFP4_MOE", "gemv_experts_mxfp4_x8")])
def test_a_decode_steps_experts_in_one_parallel_call_give_the_same_bits(folder: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         name: str, quant: str, kernel: str) -> None:
    """A decode step sends each routed expert one row: the Q4_K (repacked), Q6_K and MXFP4 experts then go through
    one kernel call per matrix (gemv_experts_*) instead of one per expert; the logits are the per-expert path's, and
    llama.cpp's (test_arch_logits)."""
    import engine.models.experts as experts

    ref = reference(name, quant)
    path = model_file(folder, name, quant)
    calls: dict[str, int] = {}

    def counted(kernel: Any) -> Any:
        def run(*args: Any) -> Any:
            calls[kernel.__name__] = calls.get(kernel.__name__, 0) + 1
            return kernel(*args)
        return run

    monkeypatch.setattr(experts, "EXPERT_GEMVS", {k: counted(v) for k, v in experts.EXPERT_GEMVS.items()})
    together = our_logits(path, ref.ids, "ggml")
    monkeypatch.setattr(experts, "MAX_ONE_ROW", 0)  # every expert's row on its own, grouped as MUL_MAT_ID groups
    apart = our_logits(path, ref.ids, "ggml")
    print(name, calls)
    assert calls.get(kernel, 0) > 0 and np.array_equal(together, apart)
    assert stats(ref, together)["kld_max"] <= CORRECT_KLD_MAX
