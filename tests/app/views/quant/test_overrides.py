"""The override editor (rules, preview, Apply/Reset/Save signals) and the requantize jobs on a real session."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.data.overrides import OverrideSpec, layer_rule, preview_plan, rule_counts, with_types
from app.jobs.quant import Applied, Saved, apply_job, reset_job, save_job
from app.jobs.session import Session
from app.views.quant.lens import QuantLens
from app.views.quant.overrides import FILE_TYPES, OverrideEditor
from engine.quant.types import GGMLType
from tests.app.test_lenses_common import smollm2_run, synthetic_model_record  # noqa: F401
from tests.conftest import SMOLLM2_FILE, model_path


def _run(gen):
    """Drive a job generator to its end; (items, return value)."""
    items = []
    while True:
        try:
            items.append(next(gen))
        except StopIteration as stop:
            return items, stop.value


def test_rules_preview_and_counts(qtbot) -> None:
    ed = OverrideEditor()
    qtbot.addWidget(ed)
    ed.set_model(synthetic_model_record(n_layers=3))
    assert ed.plan is not None and not ed.plan.changed and not ed.apply.isEnabled()
    assert [ed.layer.itemText(i) for i in range(ed.layer.count())] == ["every layer", "blk.0", "blk.1", "blk.2"]
    assert "attn_q" in [ed.role.itemText(i) for i in range(ed.role.count())]
    ed.pick_tensor("blk.1.attn_q.weight")
    ed.qtype.setCurrentText("Q8_0")
    with qtbot.waitSignal(ed.spec_changed, timeout=60_000) as sig:
        ed.add.click()
    assert sig.args[0] == OverrideSpec(None, (r"^blk\.1\.attn_q\.weight$=Q8_0",))
    assert ed.preview.names() == ["blk.1.attn_q.weight"]
    assert ed.preview.item(0, 1).text() == "Q4_K" and ed.preview.item(0, 2).text() == "Q8_0"
    assert "1 of 13 tensors change" in ed.summary.text()
    assert ed.rules.item(0, 2).text() == "1" and ed.apply.isEnabled()
    ed.text.setText("ffn_down=q6_k")  # a typed rule; the type is case-insensitive
    ed.text.returnPressed.emit()
    assert ed.spec().rules[-1] == "ffn_down=Q6_K" and ed.rules.item(1, 2).text() == "3"
    assert sorted(ed.preview.names()) == sorted(["blk.1.attn_q.weight"] + [f"blk.{i}.ffn_down.weight" for i in range(3)])
    ed.show_all.setChecked(True)
    assert len(ed.preview.names()) == 13
    ed.rules.selectRow(1)
    ed._move(-1)
    assert ed.spec().rules[0] == "ffn_down=Q6_K"
    ed.rules.selectRow(0)
    ed.remove.click()
    assert ed.spec().rules == (r"^blk\.1\.attn_q\.weight$=Q8_0",)


def test_bad_rules_are_named_and_block_apply(qtbot) -> None:
    ed = OverrideEditor()
    qtbot.addWidget(ed)
    ed.set_model(synthetic_model_record())
    ed.text.setText("attn_q")  # no =TYPE
    ed.text.returnPressed.emit()
    assert ed.spec().rules == () and "REGEX=TYPE" in ed.message.text()
    assert ed.add_rule("attn_q=Q4_K") and ed.add_rule(".*=Q8_0")
    ed.rules.item(0, 0).setText("attn_[q")  # an edit in the table that breaks the regex
    assert ed.plan is None and "not a valid regex" in ed.summary.text()
    assert ed.rules.item(0, 2).text() == "error" and "attn_[q" in ed.rules.item(0, 2).toolTip()
    assert not ed.apply.isEnabled() and not ed.save.isEnabled()
    ed.rules.item(0, 0).setText("attn_q")
    assert ed.plan is not None and ed.apply.isEnabled()
    assert ed.rules.item(1, 2).text() == "7 of 13"  # the 3 norms are never quantized; attn_q x3 went first


def test_preset_apply_reset_save_signals(qtbot, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ed = OverrideEditor()
    qtbot.addWidget(ed)
    ed.set_model(synthetic_model_record())
    ed.preset.setCurrentText("Q8_0")
    assert ed.spec() == OverrideSpec("Q8_0") and len(ed.plan.changed) == 9  # attn_q, attn_k, ffn_down in 3 layers
    with qtbot.waitSignal(ed.apply_requested, timeout=60_000) as sig:
        ed.apply.click()
    assert sig.args == [OverrideSpec("Q8_0")]
    ed.set_busy("apply", "requantizing", 0.5)
    assert not ed.apply.isEnabled() and ed.cancel.isEnabled() and "requantizing" in ed.progress.format()
    with qtbot.waitSignal(ed.cancel_requested, timeout=60_000):
        ed.cancel.click()
    ed.set_busy(None)
    ed.set_applied(OverrideSpec("Q8_0"), "summary")
    assert "Q8_0" in ed.in_memory.text() and not ed.apply.isEnabled() and ed.reset.isEnabled()
    with qtbot.waitSignal(ed.reset_requested, timeout=60_000):
        ed.reset.click()
    out = tmp_path / "out.gguf"
    monkeypatch.setattr("app.views.quant.overrides.QFileDialog.getSaveFileName", lambda *a, **k: (str(out), ""))
    with qtbot.waitSignal(ed.save_requested, timeout=60_000) as sig:
        ed.save.click()
    assert sig.args == [OverrideSpec("Q8_0"), str(out)]
    ed.preset.setCurrentText(FILE_TYPES)
    assert ed.spec().empty
    ed.set_applied(OverrideSpec(None, ("<b>x=Q8_0",)))  # a user's regex is shown as text, never as markup
    assert "&lt;b&gt;x=Q8_0" in ed.in_memory.text()


def test_quant_lens_marks_planned_types_and_picks_clicked_tensors(qtbot) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.set_model(synthetic_model_record(n_layers=3))
    lens.overrides.add_rule(layer_rule(None, "ffn_down", "Q2_K"))
    col = [lens.grid.horizontalHeaderItem(c).text() for c in range(lens.grid.columnCount())].index("ffn\ndown")
    assert lens.grid.item(1, col).text() == "→Q2_K" and lens.grid.item(1, col).font().italic()
    assert lens.grid.item(1, col - 1).text() == "Q6_K"  # attn_k keeps its type
    lens._grid_clicked(3, col - 1)
    assert lens.overrides.layer.currentText() == "blk.2" and lens.overrides.role.currentText() == "attn_k"
    lens.overrides.set_spec(OverrideSpec())
    assert lens.grid.item(1, col).text() == "Q4_0"


def test_preview_matches_the_engine_plan(smollm2_run) -> None:
    from app.records.model import make_model_record
    from engine.quality.requantize import make_plan

    m = smollm2_run.model
    rec = make_model_record(m)
    for spec in (OverrideSpec("Q4_K_M"), OverrideSpec(None, (".*=Q2_K",)), OverrideSpec("Q3_K_S", ("attn_v=Q8_0",))):
        assert preview_plan(rec, spec).types() == make_plan(m.gguf, spec.preset, spec.rules).types()
    counts = rule_counts(rec, OverrideSpec(None, ("attn_v=Q8_0", "attn=Q4_0")).parsed()[1])
    assert counts == [(30, 30), (150, 90)]  # attn matches 5 roles x 30; attn_v went first, attn_norm stays
    after = with_types(rec, {"blk.0.attn_v.weight": GGMLType.Q8_0})
    row = next(t for t in after.tensors if t.name == "blk.0.attn_v.weight")
    assert row.type_name == "Q8_0" and row.nbytes == 34 * row.n_elements // 32


@pytest.fixture()
def session() -> Session:
    path = model_path(SMOLLM2_FILE)
    if path is None:
        pytest.skip(f"model {SMOLLM2_FILE} not found")
    from engine.model import load_model

    s = Session(context_limit=256)
    s.model = load_model(path, warm=False)
    s.fresh_cache()
    yield s
    s.model.close()


def test_apply_reset_save_jobs_on_a_session(session: Session, tmp_path: Path) -> None:
    from engine.gguf import open_gguf

    spec = OverrideSpec(None, ("attn_v=Q8_0",))
    old_cache = session.cache
    progress: list[object] = []
    items, applied = _run(apply_job(session, spec, threading.Event(), progress.append))
    assert isinstance(applied, Applied) and applied.types["blk.3.attn_v.weight"] == "Q8_0"
    assert session.cache is not old_cache and progress and progress[-1].fraction == 1.0
    assert session.model.net.linears()["blk.3.attn_v.weight"].weight.qtype == GGMLType.Q8_0
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Exception, match="cancelled"):
        _run(apply_job(session, OverrideSpec(None, ("attn_q=Q8_0",)), cancel, progress.append))
    assert session.model.net.linears()["blk.3.attn_q.weight"].weight.qtype == GGMLType.Q4_1  # all or nothing
    out = tmp_path / "attn_v_q8.gguf"
    _, saved = _run(save_job(session, spec, str(out), threading.Event(), progress.append))
    assert isinstance(saved, Saved)
    with open_gguf(out) as g:
        assert g.tensors["blk.3.attn_v.weight"].qtype == GGMLType.Q8_0
        assert g.tensors["blk.3.attn_q.weight"].qtype == GGMLType.Q4_1
    with pytest.raises(Exception, match="input file"):
        _run(save_job(session, spec, str(session.model.path), threading.Event(), progress.append))
    _, reset = _run(reset_job(session, threading.Event(), progress.append))
    assert reset.spec.empty and reset.types["blk.3.attn_v.weight"] == "Q4_1"
