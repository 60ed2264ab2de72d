"""Why a tensor has its type (the file's preset, fallbacks, applied rules), and the lens's layout and stale state."""
from __future__ import annotations

import dataclasses

import pytest
from PySide6.QtGui import QFontMetrics

from app.data.overrides import OverrideSpec
from app.data.type_reasons import explain_file_types
from app.records.model import make_model_record
from app.views.quant.lens import QuantLens
from tests.app.test_lenses_common import synthetic_model_record
from tests.app.views.quant.test_lens import _tensor_record
from tests.conftest import GEMMA3_FILE, SMOLLM2_FILE, model_path


def _record(file: str):
    path = model_path(file)
    if path is None:
        pytest.skip(f"{file} not found")
    from engine.gguf import open_gguf

    with open_gguf(path) as g:
        return make_model_record(g)


@pytest.fixture(scope="module")
def gemma():
    return _record(GEMMA3_FILE)


def test_gemma_q5_0_says_why(qtbot, gemma) -> None:
    reasons = explain_file_types(gemma)
    assert reasons.preset == "Q4_K_M" and reasons.matched == reasons.quantizable
    why = reasons.why("blk.0.attn_q.weight")
    assert "640 columns are not a multiple of Q4_K's 256-wide super-block: Q4_K falls back to Q5_0" in why
    assert "never quantizes" in reasons.why("blk.0.attn_norm.weight")
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.set_model(gemma)
    col = next(c for c in range(lens.grid.columnCount()) if lens.grid.horizontalHeaderItem(c).text() == "attn\nq")
    cell = lens.grid.item(1, col)
    assert cell.text() == "Q5_0" and "why Q5_0:" in cell.toolTip() and "falls back to Q5_0" in cell.toolTip()
    summary = lens.summary.text()  # every tensor agrees, some at the preset's fallback: said without a contradiction
    assert "llama-quantize&#x27;s Q4_K_M: each of the 127 quantizable tensors has the type it gives" in summary
    assert "of them at the type it falls back to" in summary and "fell back" not in summary
    rec = dataclasses.replace(_tensor_record(), name="blk.0.attn_q.weight", type_name="Q5_0")
    lens.set_tensor(rec)
    assert lens.detail.why.text().startswith("why Q5_0: ") and "super-block" in lens.detail.why.text()


def test_smollm2_matches_its_preset() -> None:
    reasons = explain_file_types(_record(SMOLLM2_FILE))
    assert reasons.preset == "Q4_1" and reasons.matched == reasons.quantizable
    assert reasons.fallbacks == ("token_embd.weight",)  # tied output: Q6_K does not fit 576 columns, Q8_0 then


def test_rule_that_falls_back_lists_its_tensors(qtbot, gemma) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.set_model(gemma)
    ed = lens.overrides
    assert ed.add_rule(r"attn_q\.weight=Q4_K") and ed.add_rule("ffn_down=Q6_K")
    cell = ed.rules.item(0, 2)
    assert cell.text() == "18 · 18 fall back"
    assert "blk.0.attn_q.weight → Q5_0" in cell.toolTip() and "super-block" in cell.toolTip()
    assert "fall back" not in ed.rules.item(1, 2).text()  # ffn_down's 2048 columns hold Q6_K
    ed.set_spec(OverrideSpec("Q2_K"))
    assert "fall back" in ed.summary.toolTip() and "blk." in ed.summary.toolTip()


def test_applied_overrides_change_the_reason(qtbot) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    model = synthetic_model_record()
    lens.overrides.set_model(model)
    lens.set_model(model)
    lens.overrides.set_applied(OverrideSpec(None, ("attn_q=Q8_0",)))
    assert lens.why("blk.0.attn_q.weight").startswith("applied in memory (file + attn_q=Q8_0): rule attn_q=Q8_0")


def test_model_change_clears_footer_and_detail(qtbot) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    a = synthetic_model_record()
    lens.overrides.set_model(a)
    lens.set_model(a)
    assert lens.detail.stack.currentWidget() is lens.detail.empty  # no axes before a tensor is chosen
    lens.set_tensor(_tensor_record())
    assert lens.detail.stack.currentIndex() == 1
    lens.overrides.set_applied(OverrideSpec("Q8_0"), "all Q8_0")
    lens.overrides.show_message("Done: applied Q8_0. The chat uses them from the next reply.")
    b = dataclasses.replace(synthetic_model_record(n_layers=5), path="/tmp/other.gguf", name="other")
    lens.overrides.set_model(b)  # as QuantBridge.model_loaded does
    lens.overrides.set_applied(OverrideSpec())
    lens.set_model(b)
    assert lens.overrides.message.text() == "" and "the file" in lens.overrides.in_memory.text()
    assert lens.detail.stack.currentWidget() is lens.detail.empty and lens.detail.record is None


def test_bars_show_every_layer_and_combos_fit(qtbot, gemma) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.resize(1200, 760)
    lens.show()
    model = dataclasses.replace(synthetic_model_record(n_layers=30), path="/tmp/t30.gguf")
    lens.set_model(model)
    lo, hi = lens.bars.getViewBox().viewRange()[0]
    assert lo < 0 and hi > 29  # layer 29 is inside the chart, no legend on top of it
    qtbot.wait(20)  # the chart's width settles
    ticks = [t for t, _ in lens.bars.getAxis("bottom")._tickLevels[0]]
    assert ticks == list(range(0, 30, lens.layer_step)) and lens.layer_step <= 2  # as many labels as fit apart
    assert "Q4_K" in lens.bars_key.text()
    ed = lens.overrides
    qtbot.wait(20)  # the layout takes the new items' widths
    for box in (ed.layer, ed.role, ed.preset, ed.qtype):
        fm = QFontMetrics(box.font())
        widest = max(fm.horizontalAdvance(box.itemText(i)) for i in range(box.count()))
        assert box.width() >= box.sizeHint().width() > widest, box.currentText()  # Qt's room for the longest item
    # Apply sits above the rules and the preview: reachable without scrolling the pane
    assert ed.apply.mapTo(ed, ed.apply.rect().topLeft()).y() < ed.rules.mapTo(ed, ed.rules.rect().topLeft()).y()
    d = lens.detail
    lens.set_tensor(_tensor_record())
    assert d.plots.height() >= 200 and d.plots.minimumSizeHint().height() >= 200


def test_narrow_pane_uses_tabs_and_comes_back(qtbot) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.resize(1300, 760)
    lens.show()
    lens.set_model(synthetic_model_record())
    qtbot.wait(20)
    assert not lens.narrow_mode and lens.split.isVisible()
    lens.resize(600, 760)
    qtbot.wait(20)
    assert lens.narrow_mode and lens.narrow.count() == 3 and not lens.split.isVisible()
    lens.open_tensor("blk.0.attn_q.weight")
    assert lens.narrow.currentWidget() is lens.detail  # the tensor asked for is shown
    lens.resize(1300, 760)
    qtbot.wait(20)
    assert not lens.narrow_mode and lens.narrow.count() == 0
    assert all(w.isVisible() for w in (lens.left, lens.detail, lens.editing, lens.overrides.apply))


@pytest.mark.parametrize("size", [(1280, 800), (1920, 1080)])
def test_quant_lens_fits_the_window(qtbot, data_dir, size) -> None:
    from PySide6.QtWidgets import QScrollArea

    from app.main_window import MainWindow

    w = MainWindow(load=False)
    qtbot.addWidget(w)
    w.resize(*size)
    w.show()
    qtbot.wait(30)
    w.reset_layout()
    slot = w.lens_slots["Quantization"]
    w.lens_tabs.setCurrentWidget(slot)
    rec = dataclasses.replace(synthetic_model_record(n_layers=30), path="/tmp/t30.gguf")
    slot.widget.overrides.set_model(rec)
    slot.widget.set_model(rec)
    qtbot.wait(50)
    area = slot.findChild(QScrollArea)
    assert not area.horizontalScrollBar().isVisible() and not area.verticalScrollBar().isVisible()
    ed = slot.widget.overrides
    if slot.widget.narrow_mode:
        slot.widget.narrow.setCurrentWidget(slot.widget.editing)
        qtbot.wait(20)
    top_left = ed.apply.mapTo(area.viewport(), ed.apply.rect().bottomRight())
    assert ed.apply.isVisible() and 0 < top_left.y() < area.viewport().height()  # Apply in sight, no scrolling
    w.close()


def test_bridge_footer_cleared_on_reload(qtbot, data_dir) -> None:
    """Stale state: after Apply, loading a model (even the same file again) leaves no 'Done: applied' behind."""
    from app.jobs.quant import Applied
    from app.main_window import MainWindow

    w = MainWindow(load=False)
    qtbot.addWidget(w)
    lens = w.lens_slots["Quantization"].widget
    rec = synthetic_model_record()
    w.state.model_record = rec
    w.quant_bridge.model_loaded(rec)
    w.quant_bridge._applied(Applied(OverrideSpec(None, ("attn_q=Q8_0",)), {"blk.0.attn_q.weight": "Q8_0"}, "3 tensors"))
    ed = lens.overrides
    assert ed.message.text().startswith("Done: applied") and "attn_q=Q8_0" in ed.in_memory.text()
    w.quant_bridge.model_loaded(rec)  # the same file, loaded again: its own weights
    assert ed.message.text() == "" and "the file" in ed.in_memory.text()
    other = dataclasses.replace(synthetic_model_record(n_layers=5), path="/tmp/other.gguf")
    w.quant_bridge._applied(Applied(OverrideSpec("Q8_0"), {}, "all"))
    w.quant_bridge.model_loaded(other)
    assert ed.message.text() == "" and ed.record is other and ed.spec().empty
    w.close()
