"""Gradient attributions: input x gradient and integrated gradients per prompt token, attribution patching against
real activation patching, and their place in `attribute(...)` and `gguf-lens attribute --method`."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.attribute.api import attribute
from engine.attribute.attribution_patching import attribution_patching, spearman, top_overlap
from engine.attribute.inputs import input_x_gradient, integrated_gradients
from engine.cli.main import main
from engine.errors import LensError
from engine.grad.backward import gradient
from engine.intervene.hooks import run_with_cache, run_with_hooks
from engine.model import load_model
from tests.engine.arch_files import arch_file
from tests.tiny_models import make_tiny_llama

IDS = [5, 17, 3, 40, 9, 23, 11, 30]
CORRUPT = [5, 17, 8, 40, 9, 6, 11, 30]  # two tokens changed
TARGET, CONTRAST = 7, 12


@pytest.fixture(scope="module")
def llama(arch_dir: Path):  # noqa: ANN201
    m = load_model(arch_file(arch_dir, "llama3"), numerics="float32", warm=False)
    yield m
    m.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("methods") / "tiny.gguf")


def test_input_x_gradient_is_each_tokens_directional_derivative(llama) -> None:  # noqa: ANN001
    a = input_x_gradient(llama, IDS, TARGET, CONTRAST, dtype=np.float64)
    x = gradient(llama, IDS, TARGET, CONTRAST, dtype=np.float64, backward=False).embeddings
    eps = 1e-5
    for i in range(len(IDS)):  # d/dt f(x + t * (row i of x)) at 0 is sum_j x_ij df/dx_ij
        step = np.zeros_like(x)
        step[i] = eps * x[i]
        up, down = (gradient(llama, IDS, TARGET, CONTRAST, embeddings=x + s * step, dtype=np.float64,
                             backward=False).value for s in (1.0, -1.0))
        fd = (up - down) / (2 * eps)
        assert abs(a.values[i] - fd) <= 1e-3 * max(1.0, abs(fd)), (i, a.values[i], fd)
    assert a.method == "ixg" and a.completeness_error is None and len(a.values) == len(IDS)


def test_integrated_gradients_completeness(llama) -> None:  # noqa: ANN001
    uniform = integrated_gradients(llama, IDS, TARGET, CONTRAST, steps=32, dtype=np.float64)
    log = integrated_gradients(llama, IDS, TARGET, CONTRAST, steps=128, rule="log", dtype=np.float64)
    for a in (uniform, log):
        gap = a.value - a.baseline_value
        assert a.completeness_error == pytest.approx(abs(float(np.sum(a.values)) - gap))
    assert log.value == uniform.value and log.baseline_value == uniform.baseline_value
    # RMSNorm makes f steep next to the zero baseline: the log-spaced panels integrate it, the uniform rule cannot
    assert log.completeness_error <= 0.05 * abs(log.value - log.baseline_value)
    assert log.completeness_error < uniform.completeness_error


@pytest.mark.parametrize("arch", ["llama3", "gemma2"])
def test_attribution_patching_ranks_like_real_patching(arch_dir: Path, arch: str) -> None:
    model = load_model(arch_file(arch_dir, arch), warm=False)  # ggml numerics: real patching runs the model's own
    try:
        est = attribution_patching(model, IDS, CORRUPT, TARGET, validate=("heads", "resid_pre"))
        n_layers, n_heads = model.args.n_layers, model.args.n_heads
        assert est.heads.shape == (n_layers, n_heads, len(IDS)) and est.resid.shape == (n_layers, len(IDS))
        heads, resid = est.checks["heads"], est.checks["resid_pre"]
        assert heads.real.shape == (n_layers, n_heads)
        # a linear estimate of patching's effect on a random model: it ranks the cells, roughly (a random map: ~0)
        assert heads.spearman >= 0.6, heads.spearman
        assert resid.spearman > 0.0, resid.spearman  # a token swapped in block 0 is far from linear (0.24-0.44 here)
        assert heads.top_overlap >= 0.5 and resid.top_overlap >= 0.5
        # positions where the prompts agree carry nothing into block 0: their estimate is exactly 0
        same = [p for p in range(len(IDS)) if IDS[p] == CORRUPT[p]]
        assert np.all(est.resid[0, same] == 0.0) and np.any(est.resid[0] != 0.0)
    finally:
        model.close()


def test_estimate_is_the_derivative_of_patching_a_head(llama) -> None:  # noqa: ANN001
    """Patching a head part-way, corrupted + t (clean - corrupted): the effect's slope at t = 0 is the estimate."""
    est = attribution_patching(llama, IDS, CORRUPT, TARGET, CONTRAST, validate=())
    span = est.clean_diff - est.corrupt_diff
    _, clean = run_with_cache(llama, IDS, ["blocks.1.attn.hook_z"])
    _, corrupt = run_with_cache(llama, CORRUPT, ["blocks.1.attn.hook_z"])
    delta = clean["blocks.1.attn.hook_z"] - corrupt["blocks.1.attn.hook_z"]
    t = 1e-2
    for head in range(llama.args.n_heads):
        diffs = []
        for sign in (1.0, -1.0):
            def part_way(z, name, sign=sign, head=head):  # noqa: ANN001, ANN202 - a hook
                z = z.copy()
                z[:, head] += sign * t * delta[:, head]
                return z
            row = run_with_hooks(llama, CORRUPT, [("blocks.1.attn.hook_z", part_way)])[-1].astype(np.float64)
            diffs.append(row[TARGET] - row[CONTRAST])
        slope = (diffs[0] - diffs[1]) / (2 * t) / span
        assert abs(est.per_head()[1, head] - slope) <= 0.02 * max(0.1, abs(slope)), (head, est.per_head()[1], slope)


def test_rank_statistics() -> None:
    a = np.array([[0.1, -3.0], [2.0, np.nan]])
    assert spearman(a, a * 2 + 1) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    assert spearman(np.array([1.0, 1.0, 2.0]), np.array([0.0, 0.0, 5.0])) == pytest.approx(1.0)  # ties averaged
    assert top_overlap(np.arange(20.0), np.arange(20.0)[::-1], n=10) == 0.0
    assert top_overlap(np.arange(20.0), -np.arange(20.0), n=10) == 1.0  # by |value|


def test_attribute_adds_inputs_or_patching_to_its_json(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = load_model(tiny, numerics="float32", warm=False)
    try:
        a = attribute(model, "the cat sat on", " the", " a", position=-2, method="ixg")
        out = a.to_json()
        assert [t["position"] for t in out["inputs"]["tokens"]] == list(range(len(a.tokens) - 1))
        assert out["inputs"]["method"] == "ixg" and out["inputs"]["completeness_error"] is None
        # the float32 reference gradient is of the same logit difference the decomposition splits
        assert out["inputs"]["f"] == pytest.approx(a.logit_diff, abs=1e-3)
    finally:
        model.close()
    assert main(["attribute", str(tiny), "--prompt", "the cat sat", "--target", " the", "--method", "ig",
                 "--steps", "8", "--json"]) == 0
    ig = json.loads(capsys.readouterr().out)["inputs"]
    assert ig["method"] == "ig" and ig["steps"] == 8 and ig["completeness_error"] >= 0
    assert ig["completeness_error"] == pytest.approx(abs(ig["sum"] - (ig["f"] - ig["f_baseline"])), abs=1e-6)
    assert main(["attribute", str(tiny), "--prompt", "the cat sat", "--target", " the", "--method", "patching",
                 "--corrupt", "the dog sat", "--json"]) == 0
    patching = json.loads(capsys.readouterr().out)["patching"]
    assert set(patching["validation"]["heads"]) == {"spearman", "top10_overlap", "real"}
    assert np.array(patching["heads"]).shape[:2] == (2, 4)
    assert main(["attribute", str(tiny), "--prompt", "the cat sat", "--target", " the", "--method", "patching",
                 "--corrupt", "the dog sat", "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "attribution patching" in text and "Spearman" in text and "top-10 overlap" in text


@pytest.mark.parametrize("arch", ["qwen35", "gemma4"])
def test_a_method_on_a_hybrid_runs_and_leaves_the_model_as_it_was(arch_dir: Path, arch: str) -> None:
    model = load_model(arch_file(arch_dir, arch), numerics="float32", warm=False)
    try:
        before = attribute(model, IDS, "#7")
        got = attribute(model, IDS, "#7", method="ixg")  # DeltaNet layers / Gemma 4's per-layer inputs traced
        assert got.inputs is not None and len(got.inputs.values) == len(IDS)
        assert np.all(np.isfinite(got.inputs.values)) and np.abs(got.inputs.values).max() > 0
        again = attribute(model, IDS, "#7")
        np.testing.assert_array_equal(again.values, before.values)
        assert again.inputs is None and model.net.hooks == {}
    finally:
        model.close()


def test_integrated_gradients_leaves_a_ggml_model_as_it_was(arch_dir: Path) -> None:
    model = load_model(arch_file(arch_dir, "qwen3"), warm=False)
    try:
        net = model.net
        before = run_with_hooks(model, IDS, [])[-1]
        a = integrated_gradients(model, IDS, TARGET, CONTRAST, steps=2)
        assert np.all(np.isfinite(a.values)) and a.completeness_error is not None
        assert all(lin._dense is None and lin.numerics == "ggml" for lin in net.linears().values())
        assert all(f._stacked is None for layer in net.layers for f in layer.fused())
        np.testing.assert_array_equal(run_with_hooks(model, IDS, [])[-1], before)
    finally:
        model.close()
