"""The Attention lens tells one story and draws it whole at 1280x800 (a lens pane of about 590 x 640 px).

The logit lens's header and table agree (one wording, one selected position), "hide sinks" is the user's own
tick, busy and empty texts are never drawn over (or cut by) a plot, and the step-through view's header, plot
titles, "Why ÷ √d_k" paragraph, chart titles and bar labels are drawn whole.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QApplication

from app.records.attention import make_attention_record, make_step_record
from app.records.head_roles import make_head_roles_record
from app.records.logit_lens import LogitLensRecord, on_top_text
from app.views.attention.lens import AttentionLens
from app.views.attention.scaling import title_fits
from app.views.lenses import LensSlot
from engine.observe.logit_lens import LogitLens
from tests.app.test_lenses_common import fake_run, synthetic_model_record

PANE = (590, 640)  # the lens pane beside the chat at 1280x800


def _settle(qtbot) -> None:
    for _ in range(3):
        QApplication.processEvents()
    qtbot.wait(20)


def _lens(qtbot, run, size=PANE) -> AttentionLens:
    slot = LensSlot(AttentionLens)  # in its scroll area, as in the app
    qtbot.addWidget(slot)
    slot.resize(*size)
    slot.show()
    lens = slot.widget
    lens.slot = slot  # qtbot keeps a weak reference only
    n_layers, n_heads = len(run.recorder.q), run.recorder.q[0].shape[0]
    lens.set_model(synthetic_model_record(n_layers, n_heads, run.cache.n_kv_heads))
    lens.set_attention(make_attention_record(run.model, run.recorder, run.cache, run.texts, thumb=16))
    _settle(qtbot)
    return lens


def _record(n: int, selected: int, ranks: dict[int, list[int]], n_layers: int = 6, width: int = 11) -> LogitLensRecord:
    """A logit-lens record of positions ending at `selected`; ranks[c] gives the target's rank per layer at column c."""
    positions = np.arange(max(0, selected - width + 1), selected + 1)
    p = len(positions)
    rank = np.full((n_layers, p), 7, np.int64)
    for c, col in ranks.items():
        rank[:, c] = col
    targets = np.arange(p, dtype=np.int64) + 1
    top_ids = np.zeros((n_layers, p, 5), np.int64)
    for li in range(n_layers):
        for c in range(p):
            top_ids[li, c] = [targets[c] if rank[li, c] == 0 else 90 + k for k in range(5)]
    prob = np.where(rank == 0, 0.6, 0.01).astype(np.float32)
    lens = LogitLens(tuple(range(n_layers)), positions.astype(np.int64), targets, np.ones(p, bool), rank, prob,
                     top_ids, np.full((n_layers, p, 5), 0.1, np.float32))
    ids = {int(t): f"v{int(t)}" for t in np.unique(np.concatenate([targets, top_ids.ravel()]))}
    return LogitLensRecord(lens, selected, tuple(f"t{i}" for i in range(n)), ids, "m", "", n, 0.0)


def test_the_header_never_says_never_while_the_table_ranks_the_token_first(qtbot) -> None:
    rec = _record(11, 10, {10: [4, 0, 0, 0, 0, 3]})  # on top after layers 1-4, not after the last
    assert on_top_text(rec.lens, 10) == "the top token at layers 1–4 only, not after the last layer (5)"
    assert on_top_text(_record(11, 10, {10: [3, 2, 0, 1, 0, 0]}).lens, 10) == \
        "the top token from layer 4 on (and at layer 2 before)"
    assert on_top_text(_record(11, 10, {}).lens, 10) == "not the top token at any layer"
    lens = _lens(qtbot, fake_run(11))
    lens.views.setCurrentWidget(lens.logit)
    lens.set_logit_lens(rec)
    panel = lens.logit.panel
    ranks = [panel.table.item(li, 1).text() for li in range(6)]
    assert ranks[1:5] == ["1"] * 4  # the table ranks it first at layers 1-4...
    assert "never" not in panel.title.text() and "layers 1–4 only" in panel.title.text()  # ...and the header agrees


def test_one_selected_position_for_the_box_the_header_and_the_table(qtbot) -> None:
    lens = _lens(qtbot, fake_run(15))
    view, panel = lens.logit, lens.logit.panel
    asked: list[tuple[int, int]] = []
    lens.logit_requested.connect(lambda p, w: asked.append((p, w)))
    lens.views.setCurrentWidget(view)
    assert view.position.value() == 14 and asked[-1][0] == 14
    view.set_record(_record(15, 10, {}))  # a record decoded for position 10 arrives (asked before the box moved)
    assert view.position.value() == 10 and "after position 10 " in panel.title.text()
    view.show_position(6)  # decoded already: the box, the header and the table follow at once
    assert view.position.value() == 6 and "after position 6 " in panel.title.text() and panel.column == 6
    view.set_record(_record(15, 12, {}))  # a record that covers the box's position: shown there, not at 12
    assert view.position.value() == 6 and "after position 6 " in panel.title.text()
    view.show_position(14)  # past the record: asked for, and the header says so instead of naming position 6
    assert asked[-1][0] == 14 and "position 14" in panel.title.text() and "after position 6" not in panel.title.text()
    view.set_record(_record(15, 14, {}))
    view.set_tokens(20)  # the context grew and the box follows the end: the header does not name the old position
    assert view.position.value() == 19 and "Position 19" in panel.title.text() and "Decode layers" in panel.title.text()


def test_decode_layers_with_no_tokens_yet_still_asks(qtbot) -> None:
    lens = AttentionLens()
    qtbot.addWidget(lens)
    asked: list[tuple[int, int]] = []
    lens.logit_requested.connect(lambda p, w: asked.append((p, w)))
    lens.logit.run.click()  # a chat reopened: no tokens known here, the bridge reads the chat shown first
    assert asked and asked[-1][0] == -1 and "Decoding" in lens.logit.panel.empty.text()
    lens.lens_failed("logit", "this chat has no tokens yet: send a message first")
    assert "send a message first" in lens.logit.panel.empty.text()


def test_scores_arriving_never_tick_hide_sinks(qtbot) -> None:
    run = fake_run(40)
    for layer, q in run.recorder.q.items():  # two real sinks, key 0 and key 7, as the chat's scores find them
        q[:, :, 0] += 3.0
        k = run.cache.keys(layer, run.cache.length).copy()
        k[:, 0, 0] = k[:, 7, 0] = 8.0
        run.cache.write(layer, 0, k, np.zeros_like(k))
    lens = _lens(qtbot, run)
    lens.set_roles(make_head_roles_record(run.model, run.recorder, run.cache, run.texts))
    assert lens.roles.hidden_keys() != (0,)  # sinks past key 0 are listed, ticked for "hide sinks" to hide...
    assert not lens.sink_check.isChecked() and not lens.grid.hide_sink  # ...which only the user ticks


def test_empty_and_busy_texts_are_whole_and_never_over_a_plot(qtbot) -> None:
    run = fake_run(40)
    lens = _lens(qtbot, run)
    roles = lens.roles
    lens.views.setCurrentWidget(roles)
    _settle(qtbot)
    empty = roles.empty  # a word-wrapped label in place of the map, as tall as its lines need
    assert empty.isVisible() and empty.wordWrap() and not roles.map.isVisible()
    assert empty.heightForWidth(empty.width()) <= empty.height()
    roles.set_record(make_head_roles_record(run.model, run.recorder, run.cache, run.texts))
    roles.chat_button.click()  # scores are on screen: the busy line goes above the map, not onto it
    assert roles.map.isVisible() and not empty.isVisible() and "Scoring" in roles.about.text()
    lens.views.setCurrentWidget(lens.logit)
    panel = lens.logit.panel
    lens.set_logit_lens(_record(40, 39, {}))
    _settle(qtbot)
    lens.logit.request()
    assert panel.plot.isVisible() and not panel.empty.isVisible() and "Decoding" in panel.title.text()


def test_colour_bar_titles_fit_along_their_bars(qtbot) -> None:
    run = fake_run(40)
    lens = _lens(qtbot, run)
    lens.request_head()
    from app.records.attention import make_head_record

    lens.set_head(make_head_record(run.model, run.recorder, run.cache, 0, 0, None, run.texts))
    _settle(qtbot)
    for axis, length in ((lens.head_view.colorbar.getAxis("left"), lens.head_view.plot.getViewBox().height()),):
        assert QFontMetrics(axis.label.font()).horizontalAdvance(axis.labelText) <= length
    lens.views.setCurrentWidget(lens.logit)
    lens.set_logit_lens(_record(40, 39, {}))
    _settle(qtbot)
    axis = lens.logit.panel.colorbar.getAxis("left")
    assert QFontMetrics(axis.label.font()).horizontalAdvance(axis.labelText) <= lens.logit.panel.plot.height()


def test_step_through_is_drawn_whole_in_the_pane(qtbot) -> None:
    run = fake_run(81, n_layers=3, n_heads=9, n_kv=3, d=64)
    lens = _lens(qtbot, run)
    view = lens.steps
    view.step_requested.connect(lambda layer, head, q: view.set_record(
        make_step_record(run.model, run.recorder, run.cache, run.texts, layer, head, q)))
    lens.views.setCurrentWidget(view)
    view.request()
    _settle(qtbot)
    assert view.record is not None
    slot_width = lens.slot.width()  # the scroll area's viewport: nothing may reach past it
    assert lens.width() <= slot_width
    header = view.header  # two lines (the cell, then the scale) wrapped in the pane: all of them shown
    assert "Scale" in header.text() and header.height() >= header.heightForWidth(header.width())
    text = view.scaling.text  # "Why ÷ √d_k": as tall as its paragraph at its width
    assert "Why" in text.text() and text.height() >= text.heightForWidth(text.width())
    plots = [view.q_plot, view.mix_plot, view.out_plot, *view.plots.values()]
    plots += [view.scaling.variance.getPlotItem(), view.scaling.entropy.getPlotItem()]
    for plot in plots:  # every title whole, inside its own view
        assert title_fits(plot), plot.titleLabel.text
        view_width = plot.scene().views()[0].width()
        assert plot.width() <= view_width, (plot.titleLabel.text, plot.width(), view_width)
    for chart in (view.scaling.variance, view.scaling.entropy):  # bar labels never run into each other
        labels = chart._bar_ticks
        metrics = QFontMetrics(chart.getAxis("bottom").font())
        per_bar = chart.getPlotItem().vb.width() / len(labels)
        assert all(metrics.horizontalAdvance(t) <= per_bar for t in labels), labels


def test_logit_lens_of_a_and_b_shares_the_page_and_its_labels_fit(qtbot) -> None:
    from app.records.logit_lens import LogitLensPair
    from app.views.attention.logit_pair import LogitPairView
    from tests.app.views.attention.test_roles_logit import _logit_record

    view = LogitPairView()
    qtbot.addWidget(view)
    view.resize(576, 530)  # Compare's page at 1280x800
    view.show()
    view.set_tokens(24)
    view.set_pair(LogitLensPair(_logit_record(n_layers=30, n=24, seed=1), _logit_record(n_layers=30, n=24, seed=2)))
    _settle(qtbot)
    assert abs(view.a.width() - view.b.width()) <= 2  # A | B halves, whatever their tables hold
    summary = view.summary  # as tall as its lines: no gap between it and the heatmaps
    assert summary.height() == summary.heightForWidth(summary.width())
    assert view.a.geometry().top() <= summary.geometry().bottom() + 12
    for panel in (view.a, view.b):  # position labels far enough apart to be read
        px = panel.plot.getPlotItem().vb.width() / len(panel.record.lens.positions)
        assert panel.tick_every * px >= panel.fontMetrics().horizontalAdvance("23") + 4, (panel.tick_every, px)
