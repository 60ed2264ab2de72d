"""The Experts lens on a Mixture-of-Experts model (a random-weight qwen3moe) in the real window, and on a dense one.

After a reply the lens shows the routing of every token in the cache, as the engine recorded it: per token the k
chosen experts with weights summing to one, the layer picker lists the MoE layers; clicking a cell shows that
token's experts in every layer and the tokens the expert was chosen for; a new chat clears it; a dense model says
there is nothing to route.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.views.experts import DENSE_TEXT, EMPTY_TEXT, ExpertsLens
from tests.app.windows import greedy_window
from tests.tiny_models import make_tiny_llama
from tools.make_arch_models import write_arch

REPLY_MS = 120_000


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_arch(tmp_path_factory.mktemp("moe") / "moe.gguf", "qwen3moe")


def test_the_lens_shows_each_tokens_experts_after_a_reply(qtbot, moe: Path, data_dir: Path) -> None:
    w = greedy_window(qtbot, moe, data_dir)
    lens = w.lens_tabs.lens(ExpertsLens)
    w.lens_tabs.select("Experts")  # a hidden lens is handed the model when its tab comes on screen
    assert lens is not None and lens.layer_box.count() == 2 and lens.empty.text() == EMPTY_TEXT
    assert w.conversation.send("route me")
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=REPLY_MS)
    cache = w.engine.session.cache
    qtbot.waitUntil(lambda: lens.record is not None and lens.record.n_tokens == cache.length, timeout=REPLY_MS)
    rec = lens.record
    assert [lr.layer for lr in rec.layers] == [0, 1] and rec.k == 2 and rec.n_expert == 8
    m = lens.matrix()  # experts x tokens, the weights each token gave
    assert m.shape == (8, rec.n_tokens) and np.allclose(m.sum(axis=0), 1.0, atol=1e-5)
    assert ((m > 0).sum(axis=0) == 2).all()
    lens.colour_box.setCurrentIndex(1)  # the router's probabilities over all experts
    assert np.allclose(lens.matrix().sum(axis=0), 1.0, atol=2e-3)
    lens.layer_box.setCurrentIndex(1)
    expert = int(rec.layers[1].experts[3, 0])
    lens.pick(3, expert)
    text = lens.detail.toPlainText()
    assert "Token 3" in text and "L0" in text and "L1" in text and f"Expert {expert} of layer 1" in text
    assert 3 in rec.layers[1].positions_of(expert) and "layer 1: 8 experts, 2 per token" in lens.status.text()
    w.conversation.new_chat()
    assert lens.record is None and lens.stack.currentWidget() is lens.empty
    w.close()


def test_a_dense_model_says_there_is_nothing_to_route(qtbot, tmp_path: Path, data_dir: Path) -> None:
    w = greedy_window(qtbot, make_tiny_llama(tmp_path / "dense.gguf"), data_dir)
    lens = w.lens_tabs.lens(ExpertsLens)
    w.lens_tabs.select("Experts")
    assert lens.empty.text() == DENSE_TEXT and lens.layer_box.count() == 0 and not lens.wants_routing()
    assert w.conversation.send("hi")
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=REPLY_MS)
    qtbot.wait(200)
    assert lens.record is None and lens.empty.text() == DENSE_TEXT
    w.close()


def test_the_tokens_picker_counts_the_last_replys_reasoning_or_answer(qtbot) -> None:
    """A reasoning model's chat (think tags in the tokens): 'last reasoning' counts the expert load over the tokens
    inside the last <think> block and shows them; 'last answer' over those after it; a chat without them says so."""
    import dataclasses as dc

    from app.records.routing import RoutingRecord
    from engine.observe.routing import LayerRouting
    from tests.app.test_lenses_common import synthetic_model_record

    texts = ("<|im_start|>", "user", "\n", "Hi", "<|im_end|>", "<|im_start|>", "assistant", "\n", "<think>", "A", "B",
             "C", "</think>", "D", "E", "<|im_end|>")
    n = len(texts)
    experts = np.array([[t % 4, 4 + t % 2] for t in range(n)], np.int32)  # tokens 9-11 go to experts 1, 2, 3 and 5/4
    probs = np.full((n, 8), 1 / 8, np.float32)
    lr = LayerRouting(0, experts, np.full((n, 2), 0.5, np.float32), probs)
    lens = ExpertsLens()
    qtbot.addWidget(lens)
    lens.resize(1280, 760)
    lens.set_model(dc.replace(synthetic_model_record(1, 4, 2), n_expert=8))
    lens.set_routing(RoutingRecord(n, texts, (lr,), 8, 2))
    assert lens.span() is None and lens.bars.opts["width"].sum() == 2 * n
    lens.part_box.setCurrentIndex(lens.part_box.findData("reasoning"))
    assert lens.span() == (9, 12)
    assert lens.bars.opts["width"].tolist() == np.bincount(experts[9:12].reshape(-1), minlength=8).tolist()
    assert "tokens 9–11 (the last reasoning)" in lens.status.text()
    assert lens.map.viewRange()[0] == pytest.approx([9, 12], abs=0.5)
    lens.part_box.setCurrentIndex(lens.part_box.findData("answer"))
    assert lens.span() == (13, 15) and "(the last answer)" in lens.status.text()
    plain = tuple(t.replace("think>", "thought>") for t in texts)
    lens.set_routing(RoutingRecord(n, plain, (lr,), 8, 2))
    assert lens.span() is None and "no answer in this chat" in lens.status.text()
