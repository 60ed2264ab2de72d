"""One attention cell step by step, and the sqrt(d_k) argument measured."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.observe.attention_steps import attention_cell, scaling_stats, textbook_attention
from engine.generate import prefill
from engine.model import load_model
from engine.observe.recorder import Recorder
from tests.tiny_models import make_tiny_gemma3, make_tiny_llama


def test_textbook_three_tokens() -> None:
    q = [1.2, 0.4]
    keys = [[1.1, 0.3], [0.2, 1.4], [0.7, 0.8]]
    values = [[2.0, 0.5], [0.5, 3.0], [1.5, 1.5]]
    w, out = textbook_attention(q, keys, values)
    assert np.round(w, 3).tolist() == [0.407, 0.259, 0.334]
    assert np.round(out, 3).tolist() == [1.445, 1.481]
    assert abs(w.sum() - 1.0) < 1e-12


@pytest.mark.parametrize("maker", [make_tiny_llama, make_tiny_gemma3])
def test_cell_matches_the_model_and_the_recorder(tmp_path: Path, maker) -> None:
    model = load_model(maker(tmp_path / "m.gguf"))
    ids = list(range(5, 45))
    rec, cache = Recorder(), model.new_cache(64)
    prefill(model, ids, cache, recorder=rec)
    layer, head, qi = 1, model.args.n_heads - 1, 30
    cell = attention_cell(rec, cache, layer, head, qi)
    assert cell.kv_head == head // (model.args.n_heads // model.args.n_kv_heads)
    assert abs(cell.weights.sum() - 1.0) < 1e-5
    assert not cell.visible[qi + 1 :].any() and cell.weights[qi + 1 :].sum() == 0
    np.testing.assert_allclose(cell.weights, rec.attention(cache, layer, head, [qi])[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(cell.output, cell.weights @ cell.values, rtol=1e-5)
    np.testing.assert_allclose(cell.scaled, cell.dots * cell.scale, rtol=1e-6)
    assert cell.shapes()["K"] == (len(ids), model.args.head_dim)
    if cell.window is not None:  # gemma3's local layers see only the last `window` keys
        assert cell.visible.sum() == min(qi + 1, cell.window)
    model.close()


def test_scaling_stats_show_the_variance_argument(tmp_path: Path) -> None:
    model = load_model(make_tiny_llama(tmp_path / "m.gguf", dim=128, n_heads=2, n_kv_heads=1))
    rec, cache = Recorder(), model.new_cache(128)
    prefill(model, list(range(5, 100)), cache, recorder=rec)
    s = scaling_stats(rec, cache, 0, 0)
    assert s.d_k == 64 and s.n_pairs == 95 * 96 // 2
    assert s.var_scaled == pytest.approx(s.var_raw / 64, rel=1e-6)
    assert s.entropy_unscaled < s.entropy_scaled <= s.entropy_uniform + 1e-9
    model.close()
