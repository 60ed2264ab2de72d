"""The Positions lens at a distance d: every base side by side, Llama 3's factors, offset k driving RoPE,
stale state on model and chat change, and the lens fitting 1280x800 and 1920x1080 without a horizontal scroll."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtWidgets import QScrollArea

from app.views.positions import PositionsLens
from engine.models.rope import rope_freqs
from engine.observe.positions import rope_at_distance, rope_relative_check
from tests.app.test_lenses_common import synthetic_model_record


def _lens(qtbot, record) -> PositionsLens:
    lens = PositionsLens()
    qtbot.addWidget(lens)
    lens.resize(1200, 800)
    lens.set_model(record)
    return lens


def test_every_base_at_distance_d(qtbot) -> None:
    lens = _lens(qtbot, synthetic_model_record(n_layers=6, windows=(8,) * 5 + (None,), bases=(10000.0,) * 5 + (1e6,)))
    lens.offset_spin.setValue(40)
    lens.pair_spin.setValue(2)
    views = lens.distance.views
    assert [v.distance for v in views] == [40, 40]
    np.testing.assert_allclose(views[0].angles, 40 * rope_freqs(16, 10000.0))
    np.testing.assert_allclose(views[1].contributions, np.cos(40 * rope_freqs(16, 1e6)))
    _x, y = lens.distance.contrib_curves[1].getData()
    np.testing.assert_allclose(y, np.cos(40 * rope_freqs(16, 1e6)))
    table = lens.distance.table.text()
    assert "base 10,000 · 5 layers (local, sliding window 8)" in table and "base 1,000,000 · 1 layer (global)" in table
    assert f"{rope_at_distance(rope_freqs(16, 1e6), 40).score:+.3f}" in table and "pair 2:" in table
    assert "d = 40" in lens.distance.angle_plot.titleLabel.text and lens.dot_d.value() == 40


def test_llama3_frequency_factors_side_by_side(qtbot) -> None:
    ratio = tuple(np.linspace(1.0, 1 / 8, 8))  # the fast pairs kept, the slow ones divided by up to 8
    rec = dataclasses.replace(synthetic_model_record(), rope_ratio=ratio, rope_scaling="RoPE scaling: frequency factors")
    lens = _lens(qtbot, rec)
    series = lens.series()
    assert len(series) == 2 and series[1].dashed and "before the scaling" in series[1].label
    np.testing.assert_allclose(series[0].freqs, rope_freqs(16, 10000.0) * np.asarray(ratio))
    np.testing.assert_allclose(series[1].freqs, rope_freqs(16, 10000.0))
    assert "with the model's RoPE scaling" in lens.distance.table.text()


def test_offset_k_drives_rope_too(qtbot) -> None:
    lens = _lens(qtbot, synthetic_model_record())
    lens.offset_spin.setValue(17)
    assert lens.distance.views[0].distance == 17
    assert 0 <= lens.rope_error < 1e-5 and "RoPE" in lens.check.text() and "k = 17" in lens.check.text()
    # the check measures something: a rotation that is not RoPE's (a wrong mode) breaks the property it tests
    f = rope_freqs(16, 10000.0)
    assert rope_relative_check(f, 16, "neox", 17, 128) < 1e-5
    assert rope_relative_check(f * np.linspace(1, 2, 8), 16, "norm", 17, 128) < 1e-5  # any frequencies keep it


def test_tokens_cleared_on_another_model(qtbot) -> None:
    lens = _lens(qtbot, synthetic_model_record())
    lens.set_tokens([f"t{i}" for i in range(200)])
    assert lens.dot_ctx.isVisible() and lens.cur_line.isVisible() and lens.pos_spin.value() == 200
    # the labels say it even though the lens was never on screen (pyqtgraph skips hidden labels)
    assert lens.dot_ctx.label.textItem.toPlainText() == "current context: 200"
    assert lens.cur_line.label.textItem.toPlainText() == "this chat: 200 tokens"
    lens.set_model(dataclasses.replace(synthetic_model_record(n_layers=4), path="/tmp/other.gguf"))
    assert lens.tokens == [] and not lens.dot_ctx.isVisible() and not lens.cur_line.isVisible()
    assert lens.labels[0].textItem.toPlainText() == "0:0"  # positions, not the old model's tokens


def _window(qtbot, size: tuple[int, int]):
    from app.main_window import MainWindow

    w = MainWindow(load=False)
    qtbot.addWidget(w)
    w.resize(*size)
    w.show()
    qtbot.wait(30)
    w.reset_layout()
    qtbot.wait(30)
    return w


def test_positions_follow_the_chat(qtbot, data_dir: Path) -> None:
    w = _window(qtbot, (1600, 900))
    slot = w.lens_slots["Positions"]
    w.lens_tabs.setCurrentWidget(slot)
    w.state.model_record = synthetic_model_record()
    w.bridge.model_loaded()
    w.conversation.current.draft = "typed"  # not an untouched chat: New chat opens another one
    slot.widget.set_tokens(["a", "b", "c"])
    w.conversation.new_chat()
    assert slot.widget.tokens == [] and not slot.widget.dot_ctx.isVisible()
    w.close()


@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_positions_fits_without_horizontal_scroll(qtbot, data_dir: Path, size: tuple[int, int]) -> None:
    w = _window(qtbot, size)
    slot = w.lens_slots["Positions"]
    w.lens_tabs.setCurrentWidget(slot)
    slot.widget.set_model(synthetic_model_record(n_layers=6, windows=(8,) * 5 + (None,), bases=(10000.0,) * 5 + (1e6,)))
    qtbot.wait(50)
    area = slot.findChild(QScrollArea)
    assert not area.horizontalScrollBar().isVisible()
    assert slot.widget.width() <= area.viewport().width()
    assert not area.verticalScrollBar().isVisible()
    assert slot.widget.distance.plots.stacked == (size[0] < 1500)  # side by side when there is room
    w.close()


def test_gemma4_kinds_rotate_their_own_pairs(qtbot, tmp_path: Path) -> None:
    """Gemma 4's sliding and global blocks rotate head sizes of their own, the global ones by rope_freqs' proportional
    factors: each base is drawn with its kind's pairs and factors (engine.models.layer_kinds.LayerRope), not the
    global blocks' for both."""
    from app.records.model import make_model_record
    from engine.model import load_model
    from tools.make_arch_models import write_arch

    model = load_model(write_arch(tmp_path / "gemma4.gguf", "gemma4"))
    try:
        record = make_model_record(model)
        ropes = {sliding: r for sliding, r in model.net.ropes.items()}
    finally:
        model.close()
    assert [(b, d) for b, d, _ in record.rope_kinds] == [(ropes[True].base, ropes[True].args.rope_dim),
                                                        (ropes[False].base, ropes[False].args.rope_dim)]
    lens = _lens(qtbot, record)
    assert lens.dims == tuple(ropes[k].args.rope_dim for k in (True, False)) and len(set(lens.dims)) == 2
    for k, sliding in enumerate((True, False)):  # the frequencies the blocks really rotate by
        np.testing.assert_allclose(lens._freqs(k), ropes[sliding].freqs, rtol=1e-12)
    assert not lens.ratios[0] and lens.ratios[1]  # the global blocks' factors only
    lens.pair_spin.setValue(lens.pair_spin.maximum())  # a pair only the wider kind has: its ring alone
    assert not lens.rings[0].isVisible() and lens.rings[1].isVisible()
    assert "dims at base" in lens.summary.text() and lens.rope_error < 1e-5
