"""The backward of whole models against central finite differences in float64, on random tiny models of every
architecture it covers; the refusals; the model left as it was."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import LensError, SettingError
from engine.generate import prefill
from engine.grad.backward import TapeNumerics, gradient
from engine.model import load_model
from tests.engine.arch_files import arch_file
from tests.engine.grad.conftest import COVERED, SEQ2SEQ

IDS = [5, 17, 3, 40, 9, 23, 11]  # in every test vocabulary (the smallest has 269 entries)
TARGET, CONTRAST = 7, 12
EPS = 1e-5
TOL = 1e-3  # the bound on every checked entry
POINTS = ("blocks.0.attn.hook_z", "blocks.1.hook_resid_pre", "blocks.1.hook_mlp_out")


def _entries(g: np.ndarray, n: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """n random entries among those at least 1% of the largest |gradient| (an entry near 0 measures only rounding)."""
    big = np.argwhere(np.abs(g) >= 0.01 * np.max(np.abs(g)))
    return [tuple(int(i) for i in big[k]) for k in rng.choice(len(big), size=min(n, len(big)), replace=False)]


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


@pytest.mark.parametrize("arch", COVERED)
def test_gradient_matches_central_differences(grad_dir: Path, arch: str) -> None:
    model = load_model(arch_file(grad_dir, arch), numerics="float32", warm=False)
    rng = np.random.default_rng(0)
    try:
        row = prefill(model, IDS, model.new_cache(len(IDS)), all_logits=True)[-1].astype(np.float64)
        traced = gradient(model, IDS, TARGET, CONTRAST, capped=True, dtype=np.float64, backward=False).value
        assert abs(traced - (row[TARGET] - row[CONTRAST])) < 1e-4 * max(1.0, abs(traced))  # the model's own graph
        g = gradient(model, IDS, TARGET, CONTRAST, points=POINTS, dtype=np.float64)
        g32 = gradient(model, IDS, TARGET, CONTRAST, points=POINTS, dtype=np.float32)
        assert np.all(np.isfinite(g.d_embeddings)) and np.abs(g.d_embeddings).max() > 0
        checks = [("embed", idx) for idx in _entries(g.d_embeddings, 4, rng)]
        checks += [(p, idx) for p in POINTS for idx in _entries(g.d_points[p], 2, rng)]
        for where, idx in checks:
            values = []
            for sign in (1.0, -1.0):
                if where == "embed":
                    x = g.embeddings.copy()
                    x[idx] += sign * EPS
                    values.append(gradient(model, IDS, TARGET, CONTRAST, embeddings=x, dtype=np.float64,
                                           backward=False).value)
                else:
                    delta = np.zeros_like(g.points[where])
                    delta[idx] = sign * EPS
                    values.append(gradient(model, IDS, TARGET, CONTRAST, shift={where: delta}, dtype=np.float64,
                                           backward=False).value)
            fd = (values[0] - values[1]) / (2 * EPS)
            got64 = g.d_embeddings[idx] if where == "embed" else g.d_points[where][idx]
            got32 = g32.d_embeddings[idx] if where == "embed" else g32.d_points[where][idx]
            assert _rel(got64, fd) <= TOL, (arch, where, idx, got64, fd)
            assert _rel(got32, fd) <= TOL, (arch, where, idx, got32, fd)
    finally:
        model.close()


@pytest.mark.parametrize("arch", ["llama3", "gemma2", "qwen2moe"])
def test_traced_pass_is_the_models_own_and_leaves_it_as_it_was(grad_dir: Path, arch: str) -> None:
    model = load_model(arch_file(grad_dir, arch), numerics="ggml", warm=False)
    try:
        net = model.net
        ops, numerics = net.ops, [lin.numerics for lin in net.linears().values()]
        ffns = [layer.ffn for layer in net.layers]
        before = prefill(model, IDS, model.new_cache(len(IDS)), all_logits=True)[-1]
        g = gradient(model, IDS, TARGET, CONTRAST, capped=True)
        assert net.ops is ops and [lin.numerics for lin in net.linears().values()] == numerics
        assert all(layer.ffn is ffn for layer, ffn in zip(net.layers, ffns))  # the experts seam put back
        assert all(lin._dense is None for lin in net.linears().values())  # the copies the pass made are dropped
        assert net.hooks == {}
        after = prefill(model, IDS, model.new_cache(len(IDS)), all_logits=True)[-1]
        np.testing.assert_array_equal(after, before)
        # the traced pass is float32 reference maths on the same graph: close to the ggml run, not bit-equal
        assert abs(g.value - float(before[TARGET] - before[CONTRAST])) < 0.05 * max(1.0, abs(g.value))
    finally:
        model.close()
    ref = load_model(arch_file(grad_dir, arch), numerics="float32", warm=False)
    try:
        row = prefill(ref, IDS, ref.new_cache(len(IDS)), all_logits=True)[-1].astype(np.float64)
        g = gradient(ref, IDS, TARGET, CONTRAST, capped=True)
        assert abs(g.value - (row[TARGET] - row[CONTRAST])) < 1e-4 * max(1.0, abs(g.value))
    finally:
        ref.close()


@pytest.mark.parametrize("arch", SEQ2SEQ)
def test_encoder_decoder_gradient_matches_central_differences(grad_dir: Path, arch: str) -> None:
    model = load_model(arch_file(grad_dir, arch), numerics="float32", warm=False)
    rng = np.random.default_rng(1)
    try:
        net = model.net
        enc, dec = IDS[:6], [net.decoder_start_token, 11, 8]
        cache = model.new_cache(len(dec))
        net.encode(np.asarray(enc), cache)
        row = net.forward(np.asarray(dec), cache)[-1].astype(np.float64)  # the model's own encoder and decoder
        g = gradient(model, enc, TARGET, CONTRAST, decoder=dec, dtype=np.float64)
        assert abs(g.value - (row[TARGET] - row[CONTRAST])) < 1e-4 * max(1.0, abs(g.value))
        assert g.d_embeddings.shape == (len(enc) + len(dec), net.args.dim)
        g32 = gradient(model, enc, TARGET, CONTRAST, decoder=dec)
        picked = [idx for idx in _entries(g.d_embeddings, 8, rng)]
        assert {i < len(enc) for i, _ in picked} == {True, False} or len(picked) < 8  # both stacks are checked
        for idx in picked:
            values = []
            for sign in (1.0, -1.0):
                x = g.embeddings.copy()
                x[idx] += sign * EPS
                values.append(gradient(model, enc, TARGET, CONTRAST, decoder=dec, embeddings=x, dtype=np.float64,
                                       backward=False).value)
            fd = (values[0] - values[1]) / (2 * EPS)
            assert _rel(g.d_embeddings[idx], fd) <= TOL, (arch, idx, g.d_embeddings[idx], fd)
            assert _rel(g32.d_embeddings[idx], fd) <= TOL, (arch, idx, g32.d_embeddings[idx], fd)
        with pytest.raises(SettingError, match="hook points are not available"):
            gradient(model, enc, TARGET, decoder=dec, points=["blocks.0.attn.hook_z"])
    finally:
        model.close()


def test_an_op_without_a_vjp_is_refused_and_the_model_left_as_it_was(grad_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(arch_file(grad_dir, "llama3"), numerics="float32", warm=False)
    try:
        net = model.net
        ops = net.ops
        before = prefill(model, IDS, model.new_cache(len(IDS)), all_logits=True)[-1]
        monkeypatch.setattr(TapeNumerics, "glu", lambda self, kind, gate, up: np.asarray(gate))  # a plain array
        with pytest.raises(LensError, match="gradients through llama: a traced value was turned into a plain array"):
            gradient(model, IDS, TARGET, CONTRAST)
        monkeypatch.undo()
        assert net.ops is ops and net.hooks == {}
        np.testing.assert_array_equal(prefill(model, IDS, model.new_cache(len(IDS)), all_logits=True)[-1], before)
    finally:
        model.close()
