"""The logit lens on a synthetic head with a known answer, and on SmolLM2 (the last layer is the model's logits)."""
from __future__ import annotations

import numpy as np
import pytest

from engine.observe.logit_lens import decode_layer, logit_lens, window_positions


def _head(x: np.ndarray) -> np.ndarray:
    """A 'vocabulary' of 6 tokens whose logits are the first 6 components of the stream."""
    return np.asarray(x, np.float32)[:, :6]


def test_ranks_probabilities_and_top_k_on_a_known_head() -> None:
    x = np.array([[5, 1, 0, 0, 0, 0, 9], [0, 3, 2, 1, 0, 0, 9]], np.float32)
    rank, prob, top, top_p = decode_layer(_head, x, np.array([0, 2]), k=3, chunk=1)
    assert rank.tolist() == [0, 1]
    e = np.exp(x[1, :6] - 3)
    assert prob[1] == pytest.approx(e[2] / e.sum(), rel=1e-6)
    assert top.tolist() == [[0, 1, 2], [1, 2, 3]]
    assert top_p[0, 0] == pytest.approx(np.exp(5) / (np.exp(5) + np.exp(1) + 4), rel=1e-6)


def test_targets_follow_the_context_and_the_decision_layer() -> None:
    # 3 layers, 3 positions; tokens [4, 2, 5]: targets of positions 0, 1 are 2 and 5; position 2 uses the final logits
    hidden = {}
    for layer, best in enumerate(([0, 0, 0], [2, 1, 1], [2, 5, 3])):
        h = np.zeros((3, 6), np.float32)
        h[np.arange(3), best] = 4.0
        hidden[layer] = h
    final = np.zeros((1, 6), np.float32)
    final[0, 3] = 1.0
    lens = logit_lens(_head, hidden, [4, 2, 5], [0, 1, 2], final_logits=final)
    assert lens.targets.tolist() == [2, 5, 3] and lens.target_known.tolist() == [True, True, False]
    assert lens.rank[:, 0].tolist() == [1, 0, 0] and lens.rank[2].tolist() == [0, 0, 0]
    assert lens.decided_at().tolist() == [1, 2, 2]
    assert window_positions(100, 50, 8).tolist() == list(range(43, 51))
    assert window_positions(5, 2, 8).tolist() == [0, 1, 2, 3, 4]


def test_smollm2_last_layer_is_the_models_own_logits(smollm2_model) -> None:
    from app.records.logit_lens import make_logit_lens_record
    from engine.generate import prefill

    model = smollm2_model
    ids = model.tokenizer.encode("The capital of France is Paris. The capital of Italy is", add_special=True)
    logits = prefill(model, ids, model.new_cache(64), all_logits=True)
    memo: dict = {}
    rec = make_logit_lens_record(model, ids, None, width=6, memo=memo)
    again = make_logit_lens_record(model, ids, len(ids) - 3, width=6, memo=memo)  # the streams are reused
    lens = rec.lens
    assert len(lens.layers) == 30 and lens.positions.tolist() == list(range(len(ids) - 6, len(ids)))
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_array_equal(lens.top_ids[-1, :, 0], logits[lens.positions].argmax(1))
    np.testing.assert_allclose(lens.top_probs[-1, :, 0], p[lens.positions].max(1), rtol=1e-4)
    assert rec.text(lens.targets[-1]).strip() == "Rome" and lens.rank[-1, -1] == 0
    assert lens.rank[0, -1] > 100  # the embedding layer's stream does not know yet
    assert again.lens.positions[-1] == len(ids) - 3 and memo["key"][2] == tuple(ids)


def test_gemma2_lens_goes_through_the_final_soft_cap(tmp_path) -> None:
    """Gemma 2 caps its logits (tanh(x / cap) * cap): the last layer's lens is the capped logits, as the model's."""
    from app.records.logit_lens import make_logit_lens_record
    from engine.generate import prefill
    from engine.model import load_model
    from tests.engine.models.arch_cases import model_file

    model = load_model(model_file(tmp_path, "gemma2", "F16"))
    try:
        cap = model.args.final_softcap
        assert cap is not None
        ids = list(range(3, 40))
        logits = prefill(model, ids, model.new_cache(64), all_logits=True)
        lens = make_logit_lens_record(model, ids, None, width=8).lens
    finally:
        model.close()
    assert np.abs(logits).max() <= cap
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_array_equal(lens.top_ids[-1, :, 0], logits[lens.positions].argmax(1))
    np.testing.assert_allclose(lens.top_probs[-1], np.sort(p[lens.positions], 1)[:, ::-1][:, :5], rtol=1e-3)  # another batch shape: float sums in another order
