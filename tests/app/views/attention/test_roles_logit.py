"""Head roles, the logit lens, sinks, the row window, the step-through query and stale state, in the Attention lens."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt

from app.records.attention import make_attention_record, make_head_record
from app.records.head_roles import make_head_roles_record
from app.records.logit_lens import LogitLensPair, LogitLensRecord
from app.views.attention.lens import AttentionLens
from app.views.attention.logit_pair import LogitPairView
from engine.observe.logit_lens import logit_lens
from tests.app.test_lenses_common import fake_run, synthetic_model_record


def _lens(qtbot, run):
    lens = AttentionLens()
    qtbot.addWidget(lens)
    lens.resize(1280, 760)
    n_layers, n_heads = len(run.recorder.q), run.recorder.q[0].shape[0]
    lens.set_model(synthetic_model_record(n_layers, n_heads, run.cache.n_kv_heads))
    asked: list = []
    lens.head_requested.connect(lambda l, h, r: (asked.append((l, h, r)), lens.set_head(
        make_head_record(run.model, run.recorder, run.cache, l, h, r, run.texts))))
    return lens, asked


def _sunk(run):
    """Every query gets a shared component and key 0 a large one along it: key 0 becomes a real sink."""
    for layer, q in run.recorder.q.items():
        q[:, :, 0] += 3.0
        k = run.cache.keys(layer, run.cache.length).copy()
        k[:, 0, 0] = 8.0
        run.cache.write(layer, 0, k, np.zeros_like(k))
    return run


def _attention(run, n=None, hidden=(0,)):
    if n is not None:
        run.recorder.length = n  # the grid covers min(recorder, cache) positions
    return make_attention_record(run.model, run.recorder, run.cache, run.texts, thumb=16, hidden_keys=hidden)


def test_empty_state_then_clear_on_chat_and_model_change(qtbot) -> None:
    run = fake_run(40)
    lens, _ = _lens(qtbot, run)
    assert lens.overview.currentWidget() is lens.empty and "Send a message" in lens.empty.text()
    lens.set_attention(_attention(run))
    assert lens.overview.currentWidget() is lens.splitter and lens.head is not None
    lens.roles.set_record(make_head_roles_record(run.model, run.recorder, run.cache, run.texts))
    assert lens.roles.table.rowCount() == 3 * 4
    lens.clear_chat()  # another chat: nothing of the old tokens stays
    assert lens.attention is None and lens.head is None and lens.grid.record is None
    assert lens.head_view.record is None and lens.text_view.toPlainText() == ""
    assert lens.roles.record is None and lens.roles.table.rowCount() == 0 and lens.logit.panel.record is None
    assert lens.overview.currentWidget() is lens.empty and lens.steps.texts == ()
    lens.set_attention(_attention(run))
    lens.set_model(synthetic_model_record(2, 2, 1))  # another model: the same
    assert lens.attention is None and lens.grid.record is None and lens.overview.currentWidget() is lens.empty
    assert lens.layer_box.count() == 2 + 2


def test_row_window_follows_the_reply_unless_pinned(qtbot) -> None:
    run = fake_run(130)
    lens, asked = _lens(qtbot, run)
    lens.rows_box.setCurrentIndex(lens.rows_box.findData(64))
    lens.set_attention(_attention(run, 45))
    assert lens.end_spin.value() == 44
    lens.set_attention(_attention(run, 124))
    assert lens.end_spin.value() == 123 and lens.end_spin.maximum() == 123
    qtbot.waitUntil(lambda: asked and asked[-1][2] is not None and asked[-1][2].stop == 124, timeout=120_000)
    lens.end_spin.setValue(80)
    lens._end_edited()  # the user pins the window
    lens.set_attention(_attention(run, 124))
    assert lens.end_spin.value() == 80


def test_step_through_opens_on_the_clicked_query(qtbot) -> None:
    run = fake_run(61)
    lens, _ = _lens(qtbot, run)
    lens.set_attention(_attention(run, 45))  # a live grid of 45 tokens...
    run.recorder.length = 61
    lens.set_head(make_head_record(run.model, run.recorder, run.cache, 1, 2, None, run.texts))  # ...a head of 61
    lens.show_token_attention(60)
    assert lens.steps.query_spin.value() == 60 and lens.steps.picks()[2] == 60


def test_hover_readout_is_reset_when_the_selection_changes(qtbot) -> None:
    run = fake_run(30)
    lens, _ = _lens(qtbot, run)
    lens.set_attention(_attention(run))
    lens.status.setText(lens.head_view.describe(10, 4, 0.25))
    lens.layer_box.setCurrentIndex(lens.layer_box.findData("mean"))
    lens.request_head()
    assert "query 10" not in lens.status.text() and "mean of layers" in lens.info.text()
    assert lens.info.text().count("head 0") == 1


def test_head_roles_table_map_and_open(qtbot) -> None:
    run = _sunk(fake_run(40, n_layers=3, n_heads=4))
    lens, asked = _lens(qtbot, run)
    lens.set_attention(_attention(run))
    asked.clear()
    wanted: list[str] = []
    lens.roles_requested.connect(wanted.append)
    lens.views.setCurrentWidget(lens.roles)  # on screen and out of date: it asks for the chat's scores
    assert wanted == ["chat"]
    rec = make_head_roles_record(run.model, run.recorder, run.cache, run.texts)
    lens.set_roles(rec)
    view = lens.roles
    assert view.image.image.shape == (3, 4) and view.table.rowCount() == 12
    col = 2 + 1  # 'sink': the fake run's key 0 is a strong sink
    view.set_role("sink")
    values = [view.table.item(r, col).value for r in range(12)]
    assert values == sorted(values, reverse=True)
    assert rec.roles.sinks and rec.roles.sinks[0].key == 0 and view.sinks.count() == len(rec.roles.sinks)
    assert "sink" in view.about.text() and "strongest" in view.about.text()
    view._row_clicked(0, 0)  # a table row opens its head in the overview
    assert lens.views.currentWidget() is lens.overview and asked[-1][:2] == (
        int(view.table.item(0, 0).value), int(view.table.item(0, 1).value))
    assert view.describe(1, 2).startswith("layer 1, head 2: previous")


def test_sinks_ticked_are_hidden_everywhere(qtbot) -> None:
    run = _sunk(fake_run(40))
    lens, _ = _lens(qtbot, run)
    lens.set_attention(_attention(run))
    lens.show_token_attention(30)
    roles = make_head_roles_record(run.model, run.recorder, run.cache, run.texts)
    sent: list = []
    lens.hidden_keys_changed.connect(sent.append)
    lens.set_roles(roles)
    assert not lens.sink_check.isChecked()  # scores arriving tick sinks in their list, never "hide sinks" itself
    from PySide6.QtWidgets import QListWidgetItem

    item = QListWidgetItem("key 7")  # a second sink, as a frequent word would be
    item.setData(Qt.ItemDataRole.UserRole, 7)
    item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
    item.setCheckState(Qt.CheckState.Unchecked)
    lens.roles.sinks.addItem(item)
    item.setCheckState(Qt.CheckState.Checked)  # the user ticks it
    assert sent[-1] == lens.roles.hidden_keys() and 7 in sent[-1] and not lens.sink_check.isChecked()
    lens.sink_check.setChecked(True)  # only the user ticks "hide sinks": then the ticked keys are hidden
    shown = lens.head_view.shown
    assert lens.head_view.first_col == 1 and np.isnan(shown[:, 7 - 1]).all()  # key 0 dropped, key 7 blank
    seen: list = []
    lens.text_view.show_row = lambda *a, **kw: seen.append(kw["hidden"])
    lens._show_row(30)
    assert seen == [(0, 7)]  # the context text leaves both out of its tint and its scale
    att = _attention(run, hidden=(0, 7))  # the bridge pools the grid again without them
    assert np.isnan(att.thumbs_nosink).sum() > np.isnan(att.thumbs).sum() or att.thumbs_nosink.shape == att.thumbs.shape
    k7 = 7 * 16 // 40  # the bin of key 7
    full = _attention(run, hidden=())
    assert (att.thumbs_nosink_mean[..., k7] <= full.thumbs_nosink_mean[..., k7] + 1e-6)[
        np.isfinite(att.thumbs_nosink_mean[..., k7])].all()


def _logit_record(n_layers=4, n=10, vocab=12, seed=0) -> LogitLensRecord:
    rng = np.random.default_rng(seed)
    hidden = {i: rng.standard_normal((n, vocab)).astype(np.float32) * (1 + i) for i in range(n_layers)}
    tokens = list(rng.integers(0, vocab, n))
    lens = logit_lens(lambda x: x, hidden, tokens, range(n))
    return LogitLensRecord(lens, n - 1, tuple(f"t{t}" for t in tokens), {i: f"v{i}" for i in range(vocab)}, "m", "", n, 0.0)


def test_logit_lens_view_draws_ranks_and_top5(qtbot) -> None:
    run = fake_run(10)
    lens, _ = _lens(qtbot, run)
    lens.set_attention(_attention(run))
    asked: list = []
    lens.logit_requested.connect(lambda p, w: asked.append((p, w)))
    lens.views.setCurrentWidget(lens.logit)  # on screen with no record: it asks for the last position
    assert asked and asked[0][0] == 9
    rec = _logit_record()
    lens.set_logit_lens(rec)
    panel = lens.logit.panel
    assert panel.image.image.shape == (4, 10) and panel.table.rowCount() == 4
    c = 9
    assert panel.table.item(3, 1).text() == str(int(rec.lens.rank[3, c]) + 1)
    assert panel.table.item(0, 3).text().startswith(f"v{int(rec.lens.top_ids[0, c, 0])}")
    assert "model's own top token" in panel.title.text()
    lens.logit.show_position(4)  # decoded already: no new request
    assert len(asked) == 1 and "position 4" in panel.title.text()
    lens.logit.metric_box.setCurrentIndex(1)
    assert panel.image.image.max() <= 4.0 and panel.metric_key == "rank"
    lens.clear_chat()
    assert panel.record is None and panel.table.rowCount() == 0


def test_logit_pair_side_by_side(qtbot) -> None:
    view = LogitPairView()
    qtbot.addWidget(view)
    assert not view.run.isEnabled()
    view.set_tokens(10)
    a, b = _logit_record(seed=1), _logit_record(seed=1)
    view.set_pair(LogitLensPair(a, b))
    assert "the same top token at every layer" in view.summary.text()
    view.set_pair(LogitLensPair(a, _logit_record(seed=2)))
    assert "differ after layer" in view.summary.text() or "ends on" in view.summary.text()
    view.show_position(3)
    assert view.a.column == 3 and view.b.column == 3
    view.clear()
    assert view.a.record is None and view.b.record is None


def test_a_probe_on_its_way_is_not_replaced_by_the_chat_scores(qtbot) -> None:
    run = fake_run(30)
    lens, _ = _lens(qtbot, run)
    lens.set_attention(_attention(run))
    wanted: list[str] = []
    lens.roles_requested.connect(wanted.append)
    lens.views.setCurrentWidget(lens.roles)
    lens.roles.probe_button.click()
    lens.set_attention(_attention(run))  # the grid after the reply lands while the probe runs
    assert wanted == ["chat", "probe"] and lens.roles.asked == "probe"


def test_a_failed_computation_says_why(qtbot) -> None:
    run = fake_run(20)
    lens, _ = _lens(qtbot, run)
    lens.set_attention(_attention(run))
    lens.roles.probe_button.click()
    lens.lens_failed("roles", "no model is loaded")
    assert lens.roles.asked is None and "no model is loaded" in lens.roles.empty.text()
    lens.lens_failed("logit", "the logit lens run was cancelled")
    assert "cancelled" in lens.logit.panel.empty.text()


def test_rows_can_be_the_last_replys_reasoning_or_answer(qtbot) -> None:
    """A reasoning model's chat: 'last reasoning' asks for the tokens inside the last <think> block, 'last answer'
    for those after it up to the end of the turn; a chat without reasoning says so and shows every row."""
    run = fake_run(40)
    texts = ["<|im_start|>", "user", "\n", "Hi", "<|im_end|>", "<|im_start|>", "assistant", "\n", "<think>", "\n", "Let",
             " me", " think", "</think>", "\n\n", "Hello", "!", "<|im_end|>"]
    run.texts[: len(texts)] = texts
    lens, asked = _lens(qtbot, run)
    lens.set_attention(_attention(run))
    for label, want in (("last reasoning", slice(9, 13)), ("last answer", slice(14, 17))):
        lens.rows_box.setCurrentIndex(lens.rows_box.findText(label))
        lens.request_head()
        assert asked[-1][2] == want
        assert lens.head.row_start == want.start and lens.head.row_stop == want.stop
    run.texts[: len(texts)] = [t.replace("think>", "thought>") for t in texts]  # no reasoning in this chat
    lens.set_attention(_attention(run))
    lens.request_head()
    assert asked[-1][2] is None and "no answer in this chat" in lens.info.text()
