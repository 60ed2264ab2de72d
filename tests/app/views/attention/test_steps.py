"""The step-through view of one attention cell, the sqrt(d_k) panel and the KV-cache cost, synthetic and real."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from app.data.store import Settings
from app.records.attention import make_head_record
from app.records.attention import make_step_record
from app.records.kv import KVInfo, cache_type_setting, kv_bytes_for
from app.records.model import make_model_record
from app.views.attention.lens import AttentionLens
from app.views.attention.steps import KEY_STEPS, StepThroughView
from engine.cache import KVCache
from engine.observe.attention_steps import scaling_stats, textbook_attention
from tests.app.test_lenses_common import fake_records, fake_run, smollm2_run, synthetic_model_record  # noqa: F401


def _view(qtbot, run, n_layers: int = 3, n_heads: int = 4, n_kv: int = 2) -> StepThroughView:
    view = StepThroughView()
    qtbot.addWidget(view)
    view.resize(1000, 800)
    view.set_model(synthetic_model_record(n_layers, n_heads, n_kv))
    view.set_tokens(run.texts)
    view.step_requested.connect(lambda layer, head, q: view.set_record(
        make_step_record(run.model, run.recorder, run.cache, run.texts, layer, head, q)))
    return view


def test_step_record_takes_one_cell_apart() -> None:
    run = fake_run(40, n_layers=2, n_heads=4, n_kv=2, d=8, windows=(None, 6))
    rec = make_step_record(run.model, run.recorder, run.cache, run.texts, 1, 3, 20)
    c = rec.cell
    assert (c.layer, c.head, c.query_index, c.kv_head, c.group) == (1, 3, 20, 1, 2) and rec.group_heads == (2, 3)
    assert c.visible.sum() == 6 and c.visible[15:21].all()  # the sliding window: keys 15..20
    assert np.isneginf(c.masked[~c.visible]).all() and np.all(c.weights[~c.visible] == 0)
    assert c.weights.sum(dtype=np.float64) == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(c.weights, run.recorder.attention(run.cache, 1, 3, [20])[0], atol=1e-6)
    np.testing.assert_allclose(c.output, c.weights @ c.values, atol=1e-6)
    top = rec.top_keys(3)
    assert len(top) == 3 and all(c.visible[j] for j in top) and list(c.weights[top]) == sorted(c.weights[top], reverse=True)
    last = make_step_record(run.model, run.recorder, run.cache, run.texts, 0, 0, None)
    assert last.cell.query_index == 39 and last.cell.visible.all()
    empty = fake_run(4)
    empty.recorder.length = 0
    assert make_step_record(empty.model, empty.recorder, empty.cache, empty.texts, 0, 0, 0) is None


def test_scaling_stats_over_a_prefix_match_a_shorter_run() -> None:
    run, short = fake_run(60, seed=3), fake_run(60, seed=3)
    rec = make_step_record(run.model, run.recorder, run.cache, run.texts, 2, 1, 10, stats_max_tokens=30)
    short.cache.truncate(30)
    short.recorder.length = 30
    direct = scaling_stats(short.recorder, short.cache, 2, 1)
    assert rec.stats_tokens == 30 and rec.n_tokens == 60 and rec.stats == direct
    assert rec.stats.n_pairs == 30 * 31 // 2


def test_view_draws_every_step_with_shapes_and_masked_keys(qtbot) -> None:
    run = fake_run(40, d=16)
    view = _view(qtbot, run)
    with qtbot.waitSignal(view.step_requested, timeout=60_000) as sig:
        view.select(2, 3, 12)
        view.request()
    assert sig.args == [2, 3, 12]
    rec = view.record
    assert rec is not None and view.picks() == (2, 3, 12) and not view.stale()
    titles = {name: view.plots[name].titleLabel.text for name in KEY_STEPS}
    assert "K (40, 16)" in titles["dots"] and "q (16,)" in titles["dots"] and "(40,)" in titles["dots"]
    assert "÷ √16" in titles["scaled"] and "13 of 40 keys visible" in titles["masked"]
    assert "Σ = 1.000000" in titles["weights"]
    assert "(16,)" in view.q_plot.titleLabel.text and "(16,)" in view.out_plot.titleLabel.text
    assert "KV head 1 of 2" in view.header.text() and "h2–h3" in view.header.text() and "÷ √16" in view.header.text()
    masked = [i for i in view.plots["masked"].items if type(i).__name__ == "BarGraphItem"]
    assert len(masked) == 2 and len(masked[1].opts["x"]) == 40 - 13  # the hatched bars of the hidden keys
    assert view.mix_image.image.shape == (12, 16)  # wⱼ·vⱼ of the 12 keys with the most weight (of 13 visible)
    assert view.mix_keys == sorted(rec.top_keys(12)) and view.mix_image.levels[1] > 0
    np.testing.assert_allclose(view.mix_image.image[0], rec.cell.weights[view.mix_keys[0]] * rec.cell.values[view.mix_keys[0]])
    from app.views.attention.scaling import row_entropy

    ent = row_entropy(rec.cell)
    w = rec.cell.weights[rec.cell.visible].astype(np.float64)
    assert ent[0] == pytest.approx(-(w * np.log(w)).sum(), rel=1e-4) and ent[2] == pytest.approx(np.log(13))
    assert f"This row's entropy (query 12): <b>{ent[0]:.3f}</b>" in view.scaling.text.text()
    # reading order: q (①) heads the left column, above the per-key steps ②-⑤; ⑥ and ⑦ are on the right
    assert view.q_plot.scene() is view.plots["dots"].scene() and view.mix_plot.scene() is view.out_plot.scene()
    assert "masked (−∞)" in view.describe_key(30) and "weight =" in view.describe_key(3)
    top = rec.top_keys(1)[0]
    assert f"{rec.cell.weights[top]:.4f}" in view.numbers.text()
    assert "Why ÷ √d_k" in view.scaling.text.text() and "d_k = <b>16</b>" in view.scaling.text.text()


def test_view_follows_the_last_token_and_keeps_a_picked_one(qtbot) -> None:
    run = fake_run(30)
    view = _view(qtbot, run)
    view.set_tokens(run.texts[:10])
    assert view.query_spin.value() == 9
    view.set_tokens(run.texts[:20])
    assert view.query_spin.value() == 19  # on the last token: follows
    view.select(query=5)
    view.set_tokens(run.texts)
    assert view.query_spin.value() == 5 and view.query_text.text() == "“\u23ce”"  # token 5 is a newline


def test_lens_step_tab_uses_clicked_token_and_grid_head(qtbot) -> None:
    run = fake_run(40, n_layers=3, n_heads=4, n_kv=2)
    lens = AttentionLens()
    qtbot.addWidget(lens)
    lens.resize(1200, 800)
    lens.set_model(synthetic_model_record(3, 4, 2))
    lens.head_requested.connect(lambda l, h, r: lens.set_head(
        make_head_record(run.model, run.recorder, run.cache, l, h, r, run.texts)))
    asked: list[tuple[int, int, int]] = []
    lens.step_requested.connect(lambda l, h, q: (asked.append((l, h, q)), lens.set_step(
        make_step_record(run.model, run.recorder, run.cache, run.texts, l, h, q))))
    att, _ = fake_records(run)
    lens.set_attention(att)
    assert asked == []  # the step view is not on screen: nothing computed
    lens._grid_clicked(2, 1)
    lens.show_token_attention(17)
    lens.show_steps()
    assert asked == [(2, 1, 17)] and not lens.bar.isVisible() and lens.steps.record.cell.query_index == 17
    lens.views.setCurrentIndex(0)
    lens.show_steps()
    assert len(asked) == 1  # already shown: not asked again
    lens.set_attention_path("tiled")
    assert lens.path_label.text() == "last prefill: tiled attention"


def test_kv_info_and_cache_cost() -> None:
    info = KVInfo("Q8_0", 100, 1000, 3, 30, ("plain", "tiled", "tiled"))
    assert info.attention_path == "plain + tiled" and KVInfo("F16", 0, 0, 0, 8, ()).attention_path == ""
    assert cache_type_setting(Settings()) == "F16"
    assert cache_type_setting(dataclasses.replace(Settings(), extra={"cache_type": "q4_0"})) == "Q4_0"
    assert cache_type_setting(dataclasses.replace(Settings(), extra={"cache_type": "Q5_1"})) == "F16"
    rec = synthetic_model_record(3, 4, 2)  # head_dim 16: too short for 32-wide blocks
    assert kv_bytes_for(rec, 512, "F16") == 2 * 3 * 512 * 2 * 16 * 2 and kv_bytes_for(rec, 512, "Q8_0") is None
    shape = dataclasses.replace(rec, head_dim=64)
    for name, per_row in (("F32", 256), ("F16", 128), ("Q8_0", 68), ("Q4_0", 36)):
        assert kv_bytes_for(shape, 100, name) == KVCache(3, 2, 64, 100, name).bytes_for(100) == 2 * 3 * 100 * 2 * per_row


def test_status_bar_and_sampling_panel_show_the_cache_type(qtbot) -> None:
    from app.state import AppState  # noqa: PLC0415
    from app.views.chat.sampling import SamplingPanel  # noqa: PLC0415
    from app.views.status import StatusPanel  # noqa: PLC0415

    state = AppState(Settings())
    bar, panel = StatusPanel(state), SamplingPanel(state)
    qtbot.addWidget(bar)
    qtbot.addWidget(panel)
    assert bar.kv_cost.text() == "F16" and not bar.path.isVisibleTo(bar)
    state.ctx_size, state.kv_bytes, state.kv_type, state.kv_full_bytes = 4096, 3 << 20, "F16", 90 << 20
    state.attention_path = "tiled"
    assert bar.kv.text() == "KV 3.0 MiB" and bar.kv_cost.text() == "F16 · 90.0 MiB at 4,096"
    assert bar.path.text() == "attention: tiled" and bar.path.isVisibleTo(bar)
    panel.cache_type.setCurrentIndex(panel.cache_type.findData("Q4_0"))
    assert cache_type_setting(state.settings) == "Q4_0"
    panel.reset()
    assert cache_type_setting(state.settings) == "F16" and panel.cache_type.currentText() == "F16"


# ---- the real model


def test_real_smollm2_cell_and_scaling(qtbot, smollm2_run) -> None:
    r = smollm2_run
    n = len(r.ids)
    rec = make_step_record(r.model, r.recorder, r.cache, r.texts, 3, 4, n - 2)
    c = rec.cell
    assert (c.d_k, c.kv_head, c.group, rec.n_kv_heads) == (64, 1, 3, 3) and c.scale == pytest.approx(0.125)
    w, out = textbook_attention(c.q, c.keys[: n - 1], c.values[: n - 1])  # the same row, by the textbook
    np.testing.assert_allclose(c.weights[: n - 1], w, atol=1e-5)
    np.testing.assert_allclose(c.output, out, atol=1e-4)
    np.testing.assert_allclose(c.weights, r.recorder.attention(r.cache, 3, 4, [n - 2])[0], atol=1e-5)
    s = rec.stats
    assert s.var_raw / s.var_scaled == pytest.approx(64.0, rel=1e-6)  # (1 / 0.125)²
    assert s.entropy_unscaled < s.entropy_scaled <= s.entropy_uniform + 1e-9
    view = StepThroughView()
    qtbot.addWidget(view)
    view.resize(1200, 900)
    view.set_model(make_model_record(r.model))
    view.set_tokens(r.texts)
    view.set_record(rec)
    assert view.picks() == (3, 4, n - 2) and view.head_box.currentText() == "h4 · KV 1"
    assert "Σ = 1.000000" in view.plots["weights"].titleLabel.text
    assert "reads KV head 1 of 3" in view.header.text() and "F32 KV cache" in view.header.text()


@pytest.mark.slow
def test_real_app_cache_type_path_and_steps(qtbot, smollm2_path: Path, data_dir: Path) -> None:
    from tests.app.test_end_to_end import close, open_window, wait_idle  # noqa: PLC0415

    w = open_window(qtbot, str(smollm2_path), max_tokens=6)
    lens = w.lens_slots["Attention"].widget
    assert lens is not None
    w.sampling.cache_type.setCurrentIndex(w.sampling.cache_type.findData("Q8_0"))
    assert cache_type_setting(w.state.settings) == "Q8_0" and w.engine.cache_type == "Q8_0"
    w.engine.session.model.net.ops.tiled_min_keys = 8  # a short prompt takes the tiled path too
    w.lens_tabs.setCurrentWidget(w.lens_slots["Attention"])
    w.conversation.send("Say hi.")
    wait_idle(qtbot, w)
    cache = w.engine.session.cache
    assert cache.cache_type == "Q8_0" and w.state.kv_type == "Q8_0"
    assert w.state.kv_full_bytes == cache.bytes_for(cache.n_ctx) == 2 * 30 * cache.n_ctx * 3 * 68
    assert w.state.attention_path == "tiled" and w.status.path.text() == "attention: tiled"
    assert w.status.kv_cost.text().startswith("Q8_0 · ") and "tiled" in lens.path_label.text()
    w.lens_tabs.setCurrentWidget(w.model_lens)  # the Model tab's KV rows follow the state while it is on screen
    kv_rows = [w.model_lens.kv_form.itemAt(i, w.model_lens.kv_form.ItemRole.FieldRole).widget().text()
               for i in range(w.model_lens.kv_form.rowCount())]
    w.lens_tabs.setCurrentWidget(w.lens_slots["Attention"])
    assert "Q8_0" in kv_rows[0] and any("34/32 B (Q8_0)" in t for t in kv_rows) and "tiled attention" in kv_rows[-1]
    qtbot.waitUntil(lambda: lens.attention is not None, timeout=60_000)
    lens.show_steps()
    qtbot.waitUntil(lambda: lens.steps.record is not None, timeout=60_000)
    rec = lens.steps.record
    assert rec.cache_type == "Q8_0" and rec.cell.query_index == rec.n_tokens - 1
    assert rec.cell.weights.sum(dtype=np.float64) == pytest.approx(1.0, abs=1e-5)
    close(w)
