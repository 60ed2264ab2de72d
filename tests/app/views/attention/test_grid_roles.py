"""The overview grid framed by the score chosen in Head roles: a frame per thumbnail, a legend, cleared with no role."""
from __future__ import annotations

import numpy as np

from app.records.head_roles import make_head_roles_record
from engine.observe.head_roles import ROLES
from tests.app.views.attention.test_roles_logit import _attention, _lens, _sunk
from tests.app.test_lenses_common import fake_run


def test_grid_frames_follow_the_chosen_role_and_clear(qtbot) -> None:
    run = _sunk(fake_run(40, n_layers=3, n_heads=4))
    lens, _ = _lens(qtbot, run)
    lens.set_attention(_attention(run))
    grid, view = lens.grid, lens.roles
    assert grid.frames == [] and not grid.legend.isVisible() and grid.frame_score(0, 0) is None
    rec = make_head_roles_record(run.model, run.recorder, run.cache, run.texts)
    view.set_role("sink")
    lens.set_roles(rec)
    sink = rec.roles.scores["sink"]
    assert grid.role == "sink" and len(grid.frames) == int(np.isfinite(sink).sum()) == 12
    assert grid.legend.isVisible() and "sink" in grid.legend.axis.labelText
    for li in range(3):
        for h in range(4):
            assert grid.frame_score(li, h) == float(sink[li, h])
    # the strongest head's frame is the thickest, the weakest the thinnest
    widths = {(f.rect().center().x(), f.rect().center().y()): f.pen().widthF() for f in grid.frames}
    assert max(widths.values()) > min(widths.values())
    strong = np.unravel_index(np.nanargmax(sink), sink.shape)
    assert max(grid.frames, key=lambda f: f.pen().widthF()).zValue() == max(f.zValue() for f in grid.frames)
    assert f"frame: sink {sink[strong]:.2f}" in grid.describe(int(strong[0]), int(strong[1]))
    view.set_role("previous")  # another role: the frames follow
    assert grid.role == "previous" and grid.frame_score(1, 2) == float(rec.roles.scores["previous"][1, 2])
    grid.redraw()  # a redraw (new tokens, another pooling) keeps the frames
    assert len(grid.frames) == 12
    view.frame_check.setChecked(False)  # no role chosen for the grid: no frames, no legend
    assert grid.role is None and grid.frames == [] and not grid.legend.isVisible()
    view.frame_check.setChecked(True)
    assert len(grid.frames) == 12
    lens.clear_chat()  # another chat: its scores go, and so do the frames
    assert grid.role is None and grid.frames == []


def test_scores_of_some_layers_frame_only_those(qtbot) -> None:
    run = fake_run(30, n_layers=3, n_heads=4)
    lens, _ = _lens(qtbot, run)
    lens.set_attention(_attention(run))
    scores = np.full((3, 4), np.nan, np.float32)
    scores[1] = [0.1, 0.9, 0.5, 0.0]
    lens.grid.set_role_scores(ROLES[0], scores)
    assert len(lens.grid.frames) == 4 and lens.grid.frame_score(0, 0) is None
    assert lens.grid.frame_score(1, 1) == np.float32(0.9)
    lens.grid.set_role_scores(None)
    assert lens.grid.frames == []


def test_head_roles_and_logit_tables_never_scroll_sideways_in_a_narrow_pane(qtbot) -> None:
    from PySide6.QtWidgets import QApplication

    from tests.app.views.attention.test_roles_logit import _logit_record

    run = _sunk(fake_run(40, n_layers=3, n_heads=4))
    lens, _ = _lens(qtbot, run)
    lens.resize(580, 700)  # the Attention pane beside the chat at 1280x800
    lens.show()
    lens.set_attention(_attention(run))
    lens.info.setText("layer 0, head 0 (KV 0, shared with h0–h2) · query rows 0–93 of 94 · 0.5 ms " * 3)
    lens.status.setText("query 93 “.” → key 52 “⏎”: 0.3127 " * 4)
    lens.set_attention_path("plain")
    assert lens.minimumSizeHint().width() <= 580  # long readouts never widen the lens past its pane
    lens.set_roles(make_head_roles_record(run.model, run.recorder, run.cache, run.texts))
    lens.views.setCurrentWidget(lens.roles)
    QApplication.processEvents()
    table = lens.roles.table
    assert table.isVisible() and not table.horizontalScrollBar().isVisible()
    path = lens.path_label
    assert path.mapTo(lens, path.rect().topRight()).x() > 0.9 * lens.width()  # on the right, info hidden or not
    assert path.width() <= path.sizeHint().width() + 2  # its text there too, not at the left of a wide label
    assert table.horizontalHeader().length() <= table.viewport().width() + 1
    assert "previous token" in table.horizontalHeaderItem(2).toolTip() or "just before" in table.horizontalHeaderItem(2).toolTip()
    lens.logit.panel.set_record(_logit_record(n_layers=30, n=24))
    lens.views.setCurrentWidget(lens.logit)
    QApplication.processEvents()
    t = lens.logit.panel.table
    assert t.isVisible() and not t.horizontalScrollBar().isVisible() and not t.isColumnHidden(7)
    assert t.item(0, 3).toolTip().startswith("layer ")


def test_head_labels_thin_out_when_the_thumbnails_are_narrow(qtbot) -> None:
    from PySide6.QtWidgets import QApplication

    run = fake_run(30, n_layers=3, n_heads=8, n_kv=2)
    lens, _ = _lens(qtbot, run)
    lens.show()
    lens.set_attention(_attention(run))
    grid = lens.grid

    def labels(width: int) -> list[str]:
        lens.splitter.setSizes([width, 1280 - width])
        for _ in range(3):
            QApplication.processEvents()
        grid._head_ticks()
        return [text for _pos, text in grid.plot.getAxis("top")._tickLevels[0]]

    assert labels(900) == [f"h{h}" for h in range(8)]
    narrow = labels(120)
    assert 1 <= len(narrow) < 8 and narrow[0] == "h0"
