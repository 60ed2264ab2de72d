"""The Attention lens's views on a hybrid's records, fed synthetic records: recurrent rows in the grid (tinted, "R",
a legend, rows with another head count than the attention rows), the pickers, a recurrent head's hover, head
roles with recurrent rows, the State view, and the views a hybrid model shows or hides.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from app.records.attention import AttentionRecord, HeadRecord
from app.records.head_roles import HeadRolesRecord
from app.records.model import RECURRENT, ModelRecord
from app.records.recurrent import StateRecord
from app.views.attention.controls import OverviewBar
from app.views.attention.grid import GridView
from app.views.attention.head import HeadView
from app.views.attention.lens import AttentionLens
from app.views.attention.roles import HeadRolesView
from app.views.attention.state import StateView
from engine.observe.head_roles import ROLES, HeadRoles
from tests.app.test_lenses_common import synthetic_model_record

T = 8  # thumbnail side
N = 12  # tokens
TEXTS = tuple(f"t{i}" for i in range(N))


def hybrid_model() -> ModelRecord:
    """Layers 0 and 2 recurrent with 6 value heads reading 3 key heads; layer 1 attention with 4 heads."""
    base = synthetic_model_record(3, 4, 2)
    layers = tuple(dataclasses.replace(x, kind=RECURRENT, n_heads=6) if x.index in (0, 2) else
                   dataclasses.replace(x, n_heads=4) for x in base.layers)
    return dataclasses.replace(base, layers=layers, recurrent=(0, 2), n_v_heads=6, n_k_heads=3, state_size=8,
                               conv_kernel=4, state_bytes=4 * (6 * 8 * 8 + 3 * 64))


def hybrid_record() -> AttentionRecord:
    rng = np.random.default_rng(0)
    thumbs = np.tril(rng.uniform(0, 1, (3, 6, T, T))).astype(np.float32)
    thumbs[1, 4:] = np.nan  # the attention row has 4 heads
    stats = rng.uniform(0, 1, (3, 6)).astype(np.float32)
    earlier = np.where(np.array([True, False, True])[:, None], 0.1, np.nan) * np.ones((3, 6), np.float32)
    return AttentionRecord(
        n_tokens=N, n_layers=3, n_heads=6, thumbs=thumbs, thumbs_mean=thumbs, thumbs_nosink=thumbs,
        thumbs_nosink_mean=thumbs, rows=np.arange(N), full=True, sink=stats, prev=stats, self_=stats, token_texts=TEXTS,
        elapsed_s=0.01, layers=(0, 1, 2), recurrent=(True, False, True), heads=(6, 4, 6),
        earlier=earlier.astype(np.float32), read_start=0,
    )


def plain_record() -> AttentionRecord:
    thumbs = np.tril(np.ones((3, 4, T, T), np.float32))
    stats = np.zeros((3, 4), np.float32)
    return AttentionRecord(N, 3, 4, thumbs, thumbs, thumbs, thumbs, np.arange(N), True, stats, stats, stats, TEXTS, 0.01)


def reads_head(read_start: int = 3) -> HeadRecord:
    """Value head 4 of layer 2 (key head 1): reads of tokens read_start..q, signed weights, an earlier share."""
    w = np.tril(np.full((N, N), 0.1, np.float32))
    w[:, :read_start] = 0.0
    signed = np.where(w > 0, -0.25, 0.0).astype(np.float32)
    allowed = np.tril(np.ones((N, N), bool)) & (np.arange(N)[None] >= read_start) & (np.arange(N)[:, None] >= read_start)
    return HeadRecord(layer=2, head=4, weights=w, allowed=allowed, row_start=0, row_stop=N, row_step=1, col_step=1,
                      n_tokens=N, window=None, kv_head=1, group_heads=(1, 4), token_texts=TEXTS, elapsed_s=0.0,
                      kind="recurrent", signed=signed, earlier=np.full(N, 0.25, np.float32), read_start=read_start,
                      n_key_heads=3)


def test_the_grid_draws_recurrent_rows_apart_and_speaks_model_layers(qtbot) -> None:
    grid = GridView()
    qtbot.addWidget(grid)
    grid.resize(360, 420)
    grid.show()
    grid.set_model(hybrid_model())
    grid.record = hybrid_record()
    grid.redraw()
    assert len(grid.bands) == 2 and grid.kinds_legend.isVisible() and "recurrent" in grid.kinds_legend.text
    assert [t for _y, t in grid.plot.getAxis("right")._tickLevels[0]] == ["R", "attn", "R"]
    assert [t for _y, t in grid.plot.getAxis("left")._tickLevels[0]] == ["L0", "L1", "L2"]
    t = grid._t
    y_attn, y_rec = 1 * (t + 2) + t / 2, 2 * (t + 2) + t / 2
    assert grid.head_at(grid._xs[5] + t / 2, y_rec) == (2, 5)  # a recurrent row has 6 value heads
    assert grid.head_at(grid._xs[5] + t / 2, y_attn) is None  # the attention row only 4: the rest is empty
    assert grid.head_at(grid._xs[3] + t / 2, y_attn) == (1, 3)
    text = grid.describe(2, 5)
    assert "layer 2 (recurrent, gated DeltaNet), value head 5 (reads key head 2)" in text and "previous token" in text
    assert grid.describe(1, 3).startswith("layer 1 (attention), head 3")
    grid.select(2, 5)
    assert grid.selection.isVisible() and not grid.group_box.isVisible()  # no KV groups in a recurrent row
    grid.select(1, 1)
    assert grid.group_box.isVisible()
    scores = np.full((3, 6), np.nan, np.float32)
    scores[2, 5] = 0.9
    grid.set_role_scores("previous", scores)
    assert grid.frame_score(2, 5) == pytest.approx(0.9) and len(grid.frames) == 1
    assert "frame: previous 0.90" in grid.describe(2, 5)
    grid.record = plain_record()  # a plain model's record: no bands, no legend
    grid.redraw()
    assert grid.bands == [] and not grid.kinds_legend.isVisible() and grid.kinds_legend.scene() is None


def test_the_legend_wraps_to_the_grid_instead_of_widening_it(qtbot) -> None:
    grid = GridView()
    qtbot.addWidget(grid)
    grid.resize(200, 400)
    grid.show()
    grid.set_model(hybrid_model())
    grid.record = hybrid_record()
    grid.redraw()
    qtbot.wait(50)
    assert grid.kinds_legend.boundingRect().width() <= grid.width()
    view = grid.plot.getViewBox().sceneBoundingRect()
    assert view.right() <= grid.width() and view.width() > 50  # the plot stays inside the widget


def test_the_head_picker_follows_the_kind_of_layer(qtbot) -> None:
    bar = OverviewBar()
    qtbot.addWidget(bar)
    bar.set_model(hybrid_model())
    items = [bar.layer_box.itemText(i) for i in range(bar.layer_box.count())]
    assert items == ["0  (recurrent)", "1", "2  (recurrent)", "mean of attention layers", "max of attention layers"]
    heads = [bar.head_box.itemText(i) for i in range(bar.head_box.count())]
    assert heads[:6] == ["v0 · key 0", "v1 · key 1", "v2 · key 2", "v3 · key 0", "v4 · key 1", "v5 · key 2"]
    bar.head_box.setCurrentIndex(5)
    bar.set_heads(1)
    assert [bar.head_box.itemData(i) for i in range(bar.head_box.count())] == [0, 1, 2, 3, "mean", "max"]
    assert bar.head_box.currentData() == 0  # v5 is not a head of the attention layer
    bar.head_box.setCurrentIndex(2)
    bar.set_heads(2)
    assert bar.head_box.currentData() == 2  # the pick stays where the layer has it


def test_a_recurrent_heads_hover_gives_the_signed_weight_and_the_earlier_context(qtbot) -> None:
    view = HeadView()
    qtbot.addWidget(view)
    rec = reads_head()
    view.set_record(rec)
    assert "share" in view.colorbar.getAxis("left").labelText
    assert "earlier context (before 3): 25%" in view.plot.titleLabel.text
    read = view.describe(7, 5, float(rec.weights[7, 5]))
    assert "token 7 “t7” reads v of token 5 “t5” with weight -0.25 (signed) · share 10.0%" in read
    assert "earlier context 25.0%" in read
    assert "in the earlier context (before token 3)" in view.describe(7, 1, float("nan"))
    assert "comes later" in view.describe(4, 9, float("nan"))


def test_the_lens_shows_state_only_for_a_hybrid_and_steps_through_attention_layers_only(qtbot) -> None:
    lens = AttentionLens()
    qtbot.addWidget(lens)
    lens.set_model(hybrid_model())
    tab = lens.views.indexOf(lens.state_view)
    assert lens.views.isTabVisible(tab) and "recurrent (gated DeltaNet) 0, 2" in lens.status.text()
    assert [lens.steps.layer_box.itemData(i) for i in range(lens.steps.layer_box.count())] == [1]
    assert "Layers 0, 2 are recurrent" in lens.steps.header.text()
    assert lens.logit.kinds.isVisibleTo(lens.logit) and lens.logit.panel.layer_text(2) == "2 R"
    lens.set_attention(hybrid_record())
    lens.set_head(reads_head())
    assert lens.grid.selected == (2, 4) and "layer 2 (recurrent), value head 4, key head 1" in lens.info.text()
    assert lens.text_view.toPlainText().startswith("What token 11 reads")
    asked: list[bool] = []
    lens.state_requested.connect(lambda: asked.append(True))
    lens.show_state()
    assert asked == [True]  # on screen and out of date: it asks once
    lens.views.setCurrentWidget(lens.overview)
    lens.set_model(synthetic_model_record(3, 4, 2))
    assert not lens.views.isTabVisible(tab) and lens.steps.layer_box.count() == 3
    assert not lens.logit.kinds.isVisibleTo(lens.logit) and lens.logit.panel.layer_text(2) == "2"


def state_record(n: int = N) -> StateRecord:
    rng = np.random.default_rng(1)
    return StateRecord(layers=(0, 2), wrote=rng.uniform(0.1, 0.9, (2, n, 6)).astype(np.float32),
                       kept=np.full((2, n, 6), 0.5, np.float32), token_texts=TEXTS[:n], n_tokens=n, n_layers=3,
                       n_key_heads=3, state_size=8, matrix_bytes=4 * 6 * 64, conv_bytes=4 * 3 * 64,
                       attention_layers=(1,), kv_bytes=n * 256, kv_per_token=256, n_ctx=512, cache_type="F16",
                       elapsed_s=0.0)


def test_the_state_view_draws_bytes_writes_and_decays(qtbot) -> None:
    view = StateView()
    qtbot.addWidget(view)
    view.set_model(hybrid_model())
    assert view.layer_box.count() == 2 and view.stale(N)
    rec = state_record()
    view.set_record(rec)
    assert not view.stale(N) and view.stale(N + 1)
    text = view.summary.text()
    assert "Recurrent state: 2 layers × 2.2 KiB = 4.5 KiB, the same at any context length" in text
    assert "KV rows of the 1 attention layer: 3.0 KiB for 12 tokens (F16), 128.0 KiB at 512" in text
    x, kv = view.kv_curve.getData()
    _x, state = view.state_curve.getData()
    assert kv[-1] == pytest.approx(512 * 256 / 1024) and state[0] == state[-1] == pytest.approx(rec.state_total / 1024)
    assert view.now_line.value() == N
    assert view.images[0].image.shape == (6, N)  # value heads x tokens
    view.layer_box.setCurrentIndex(1)
    np.testing.assert_array_equal(view.images[0].image, rec.wrote[1].T)
    hover = view.describe(3, 5)
    assert hover.startswith("layer 2, v5, token 3 “t3”: wrote β = ") and "kept exp(g) = 0.5000" in hover
    assert "half-life 1 tokens" in hover
    view.clear()
    assert view.record is None and view.images[0].image is None


def test_head_roles_list_a_layers_own_heads_and_mark_recurrent_rows(qtbot) -> None:
    scores = {r: np.full((3, 6), 0.2, np.float32) for r in ROLES}
    for r in ROLES:
        scores[r][1, 4:] = np.nan  # the attention layer's 4 heads
    roles = HeadRoles((0, 1, 2), scores, np.zeros((3, 6, N), np.float32), np.ones((3, N), np.float32), (),
                      np.arange(N), N)
    view = HeadRolesView()
    qtbot.addWidget(view)
    view.set_model(hybrid_model())
    view.set_record(HeadRolesRecord(roles, "chat", TEXTS, "/tmp/x.gguf", 0.0, (0, 2), 0))
    assert view.table.rowCount() == 6 + 4 + 6
    labels = {(view.table.item(r, 0).text(), view.table.item(r, 1).text()) for r in range(view.table.rowCount())}
    assert ("2 R", "v5") in labels and ("1", "h3") in labels and ("1", "h4") not in labels
    assert "Layers marked R (0, 2) are recurrent" in view.about.text() and "Sinks come from the attention" in view.about.text()
    assert view.describe(0, 1).startswith("layer 0 (recurrent), value head 1, on its read map")
