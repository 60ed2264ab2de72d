"""A hybrid model (a random-weight qwen35: gated DeltaNet layers 0-2, attention layer 3) in the real window.

After a chat every lens works on it and says what its recurrent layers are: the Attention grid has a row per
layer (recurrent rows of value-head read maps), a recurrent head opens large with its signed weights in the
hover, a clicked token tints the text by what it reads, Head roles scores recurrent heads on their reads, the
logit lens decodes every layer, Step through lists the attention layer only and says why, the State view shows
the state's bytes and each token's writes and decays, and Positions, the Model lens and the status bar count
the attention layers' KV rows apart from the constant state. The maps are computed on the worker (the window
keeps answering), and a switch to a plain model and back shows each model's own lenses.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import QTimer

import engine.observe.recurrent_maps as recurrent_maps
from app.main_window import MainWindow
from app.views.attention.lens import AttentionLens
from app.views.experts import ExpertsLens
from app.views.positions import PositionsLens
from tests.app.windows import LOAD_MS, greedy_window
from tests.tiny_models import make_tiny_llama
from tools.make_arch_models import write_arch

REPLY_MS = 120_000


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_arch(tmp_path_factory.mktemp("hybrid") / "qwen35.gguf", "qwen35")


def _chat(qtbot, w: MainWindow, text: str) -> AttentionLens:
    lens = w.lens_tabs.lens(AttentionLens)
    w.lens_tabs.select("Attention")
    assert w.conversation.send(text)
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=REPLY_MS)
    n = lambda: w.engine.session.cache.length  # noqa: E731
    qtbot.waitUntil(lambda: lens.attention is not None and lens.attention.n_tokens == n(), timeout=REPLY_MS)
    qtbot.waitUntil(lambda: lens.head is not None, timeout=REPLY_MS)
    qtbot.waitUntil(lambda: lens.grid.record is lens.attention, timeout=REPLY_MS)  # the grid redraws throttled
    return lens


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_every_lens_works_on_a_hybrid_after_a_chat(qtbot, qwen35: Path, data_dir: Path,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    w = greedy_window(qtbot, qwen35, data_dir)
    lens = _chat(qtbot, w, "The cat sat on the mat.")
    n = w.engine.session.cache.length
    rec = lens.attention
    assert rec.layers == (0, 1, 2, 3) and rec.recurrent == (True, True, True, False) and rec.heads == (4, 4, 4, 4)
    assert np.isfinite(rec.thumbs).any(axis=(2, 3)).all()  # every head of every row drawn
    assert len(lens.grid.bands) == 3 and lens.grid.kinds_legend.isVisible()
    assert lens.head.recurrent and lens.head.layer == 0  # the first layer is recurrent: its value head 0 opens
    # an attention head, then a recurrent one, from the grid
    lens._grid_clicked(3, 1)
    qtbot.waitUntil(lambda: lens.head.layer == 3, timeout=REPLY_MS)
    assert lens.head.kind == "attention" and lens.head_box.count() == 4 + 2
    lens._grid_clicked(1, 2)
    qtbot.waitUntil(lambda: lens.head.layer == 1 and lens.head.head == 2, timeout=REPLY_MS)
    head = lens.head
    assert head.recurrent and head.signed is not None and head.weights.shape == (n, n)
    assert lens.head_box.currentText() == "v2 · key 0" and "layer 1 (recurrent), value head 2" in lens.info.text()
    q, k = n - 1, n - 3
    assert "reads v of token" in lens.head_view.describe(q, k, float(head.weights[q, k]))
    lens.show_token_attention(n - 2)
    assert lens.text_view.toPlainText().startswith(f"What token {n - 2} reads")
    # head roles: the recurrent heads scored on their reads, and the view says so
    lens.views.setCurrentWidget(lens.roles)
    qtbot.waitUntil(lambda: lens.roles.record is not None, timeout=REPLY_MS)
    assert lens.roles.record.recurrent == (0, 1, 2) and "Layers marked R (0–2) are recurrent" in lens.roles.about.text()
    assert lens.grid.frame_score(1, 2) is not None  # frames reach the recurrent rows too
    # the logit lens decodes every layer
    lens.views.setCurrentWidget(lens.logit)
    qtbot.waitUntil(lambda: lens.logit.panel.record is not None, timeout=REPLY_MS)
    assert {0, 1, 2, 3} <= {int(x) for x in lens.logit.panel.record.lens.layers}
    assert lens.logit.kinds.isVisible() and lens.logit.panel.layer_text(0) == "0 R"
    # step through: the attention layer only, and why
    lens.views.setCurrentWidget(lens.steps)
    assert [lens.steps.layer_box.itemData(i) for i in range(lens.steps.layer_box.count())] == [3]
    qtbot.waitUntil(lambda: lens.steps.record is not None, timeout=REPLY_MS)
    assert lens.steps.record.cell.layer == 3
    # the State view
    lens.show_state()
    qtbot.waitUntil(lambda: lens.state_view.record is not None, timeout=REPLY_MS)
    st = lens.state_view.record
    assert st.layers == (0, 1, 2) and st.n_tokens == n and st.state_total == w.engine.session.cache.state_bytes
    assert "Recurrent state: 3 layers × 70.0 KiB = 210.0 KiB" in lens.state_view.summary.text()
    # the other lenses and the status bar
    w.lens_tabs.select("Positions")
    assert "(1 attention layer)" in w.lens_tabs.lens(PositionsLens).summary.text()
    model_lens = w.model_lens
    qtbot.waitUntil(lambda: model_lens.layers_form.rowCount() == 2, timeout=LOAD_MS)
    assert "+ state 210.0 KiB" in w.status.kv.text()
    assert not _errors(caplog), _errors(caplog)
    w.close()


def test_recurrent_maps_compute_on_the_worker_while_the_window_answers(qtbot, qwen35: Path, data_dir: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    w = greedy_window(qtbot, qwen35, data_dir)
    lens = _chat(qtbot, w, "Hello there")
    engine = w.engine
    qtbot.waitUntil(lambda: engine._lens is None and not engine._lens_pending, timeout=REPLY_MS)  # the reply's own
    threads: list[str] = []
    real = recurrent_maps.layer_reads_carried

    def slow(recorder, layer, window=recurrent_maps.WINDOW, carry=None):
        threads.append(threading.current_thread().name)
        time.sleep(0.4)  # a long conversation's decomposition, seen from the GUI
        return real(recorder, layer, window, carry)

    monkeypatch.setattr(recurrent_maps, "layer_reads_carried", slow)
    bridge = w.bridge
    bridge._reads_memo.clear()
    seen: list[int] = []  # at each turn of the event loop: how many layers the worker had started

    def tick() -> None:
        seen.append(len(threads))

    timer = QTimer()
    timer.timeout.connect(tick)
    timer.start(20)
    old = lens.attention
    bridge.request_attention(None)  # three recurrent layers: about 1.2 s on the worker
    qtbot.waitUntil(lambda: lens.attention is not old, timeout=REPLY_MS)
    timer.stop()
    assert len(threads) == 3 and threading.main_thread().name not in threads
    assert any(1 <= n < 3 for n in seen), seen  # the event loop kept turning while the worker decomposed
    lens._grid_clicked(2, 1)  # the same recording: the memo has its reads, nothing is decomposed again
    qtbot.waitUntil(lambda: lens.head.layer == 2 and lens.head.head == 1, timeout=REPLY_MS)
    assert len(threads) == 3
    w.close()


def test_a_switch_to_a_plain_model_and_back_shows_each_models_lenses(qtbot, qwen35: Path, data_dir: Path,
                                                                      tmp_path: Path) -> None:
    w = greedy_window(qtbot, qwen35, data_dir)
    lens = w.lens_tabs.lens(AttentionLens)
    state_tab = lens.views.indexOf(lens.state_view)

    def hybrid_shown() -> None:
        assert lens.views.isTabVisible(state_tab)
        assert lens.layer_box.itemText(0) == "0  (recurrent)" and lens.head_box.itemText(0) == "v0 · key 0"
        assert [lens.steps.layer_box.itemData(i) for i in range(lens.steps.layer_box.count())] == [3]

    hybrid_shown()
    _chat(qtbot, w, "hi")
    plain = make_tiny_llama(tmp_path / "plain.gguf")
    w.open_model(str(plain))
    qtbot.waitUntil(lambda: w.state.model_record is not None and not w.state.model_record.hybrid, timeout=LOAD_MS)
    assert not lens.views.isTabVisible(state_tab) and "(recurrent)" not in lens.layer_box.itemText(0)
    assert lens.steps.layer_box.count() == w.state.model_record.n_layers and not lens.logit.kinds.isVisibleTo(lens)
    assert w.lens_tabs.lens(PositionsLens).summary.text().count("recurrent") == 0
    lens2 = _chat(qtbot, w, "hi again")
    assert not lens2.attention.hybrid and lens2.grid.bands == [] and not lens2.grid.kinds_legend.isVisible()
    w.open_model(str(qwen35))
    qtbot.waitUntil(lambda: w.state.model_record is not None and w.state.model_record.hybrid, timeout=LOAD_MS)
    hybrid_shown()
    lens3 = _chat(qtbot, w, "and back")
    assert lens3.attention.hybrid and len(lens3.grid.bands) == 3
    w.close()


def test_the_experts_lens_routes_every_layer_of_a_hybrid_moe(qtbot, tmp_path: Path, data_dir: Path) -> None:
    w = greedy_window(qtbot, write_arch(tmp_path / "qwen35moe.gguf", "qwen35moe"), data_dir)
    experts = w.lens_tabs.lens(ExpertsLens)
    w.lens_tabs.select("Experts")
    assert [experts.layer_box.itemText(i) for i in range(experts.layer_box.count())] == [
        "0 (recurrent)", "1 (recurrent)", "2 (recurrent)", "3"]
    assert w.conversation.send("route me")
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=REPLY_MS)
    qtbot.waitUntil(lambda: experts.record is not None, timeout=REPLY_MS)
    assert [lr.layer for lr in experts.record.layers] == [0, 1, 2, 3]
    assert "layer 0 (recurrent; its FFN routes as in any layer)" in experts.status.text()
    w.close()
