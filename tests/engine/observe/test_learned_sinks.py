"""gpt-oss's learned attention sinks in the lenses: each head's share of "attention to nothing", recomputed from the
recorded queries and the cache as the graph computed it (one more logit per softmax row that carries no value)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from engine.model import load_model
from engine.observe import attention_maps as amaps
from engine.observe.attention_steps import attention_cell
from engine.observe.recorder import Recorder
from tests.engine.models.arch_cases import model_file
from tools.make_arch_models import token_ids

N = 48


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    folder = tmp_path_factory.mktemp("sinks")
    out = {}
    for name in ("gpt_oss", "qwen3moe"):
        model = load_model(model_file(folder, name, "F16"), numerics="float32")
        rec, cache = Recorder(), model.new_cache(64)
        rec.begin(0, N)
        model.net.forward(token_ids()[:N], cache, rec)
        cache.commit(token_ids()[:N])
        rec.commit()
        out[name] = (model, rec, cache)
    yield out
    for model, _, _ in out.values():
        model.close()


def _by_hand(rec: Recorder, cache, layer: int, head: int, row: int) -> float:  # noqa: ANN001
    """The sink's softmax share of one row, from the recorded query and cached keys, in float64."""
    spec = rec.specs[layer]
    q = rec.q[layer][head, row].astype(np.float64)
    k = cache.keys(layer, N)[head // spec.group][: row + 1].astype(np.float64)
    scores = k @ q * spec.scale
    if spec.window is not None:
        scores = scores[max(0, row - spec.window + 1) :]
    logits = np.append(scores, spec.sinks[head])
    e = np.exp(logits - logits.max())
    return float(e[-1] / e.sum())


def test_sink_share_is_the_sinks_softmax_share(run) -> None:  # noqa: ANN001
    model, rec, cache = run["gpt_oss"]
    rows = np.arange(N)
    for layer in range(model.args.n_layers):
        share = amaps.sink_share(rec, cache, layer, rows)
        weights = amaps.attention_rows(rec, cache, layer, rows)
        assert share.shape == (model.args.n_heads, N) and ((share > 0) & (share < 1)).all()
        assert np.allclose(share + weights.sum(-1), 1.0, atol=1e-5)
        for head, row in [(0, 0), (3, 17), (7, N - 1)]:
            want = _by_hand(rec, cache, layer, head, row)
            assert math.isclose(share[head, row], want, abs_tol=2e-5)
            cell = attention_cell(rec, cache, layer, head, row)
            assert math.isclose(cell.sink_share, want, abs_tol=2e-5) and cell.sink == rec.specs[layer].sinks[head]
            assert math.isclose(float(rec.attention(cache, layer, head, [row]).sum()), 1 - want, abs_tol=2e-5)
    grid = amaps.attention_grid(rec, cache, list(range(model.args.n_layers)), thumb=8)
    assert grid.learned_sink is not None
    assert np.allclose(grid.learned_sink[1], amaps.sink_share(rec, cache, 1, rows).mean(-1), atol=1e-5)


def test_a_model_without_sinks_has_no_sink_share(run) -> None:  # noqa: ANN001
    model, rec, cache = run["qwen3moe"]
    assert amaps.sink_share(rec, cache, 0, np.arange(N)) is None
    assert amaps.attention_grid(rec, cache, [0, 1], thumb=8).learned_sink is None
    assert np.allclose(amaps.attention_rows(rec, cache, 0, np.arange(N)).sum(-1), 1.0, atol=1e-5)
    assert attention_cell(rec, cache, 0, 0, 5).sink is None
