"""Compare's additions: empty states, a clear on model change, B from a preset, clickable sweep points, the mix search."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from app.data.overrides import OverrideSpec, eval_text
from app.records.compare import SweepPoint, TaskProgress, pareto_front, plan_label
from app.views.compare.view import CompareView
from tests.app.test_lenses_common import synthetic_model_record
from tests.app.views.compare.test_view import synthetic_record
from tests.tiny_models import make_tiny_llama

RULES = ("^blk\\.(0|1|2)\\.attn_q\\.weight$=Q4_0", "^token_embd\\.weight$=Q8_0")


def _points() -> list[SweepPoint]:
    return [SweepPoint("Q8_0", "preset", 40 << 20, 8.5, 1e-3, 3e-3, 99.0, 1.001, 100),
            SweepPoint("Q4_K_M", "preset", 25 << 20, 4.9, 0.05, 0.2, 90.0, 1.05, 100),
            SweepPoint("mix ≤ 4.90 bpw", "mix", 24 << 20, 4.85, 0.02, 0.1, 94.0, 1.02, 100, rules=RULES,
                       detail="3 Q4_0, 1 Q8_0")]


def test_empty_states_at_start_and_after_a_model_change(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(1400, 900)
    view.show()
    assert all(s.currentIndex() == 0 for s in view.stacks.values()) and view.sweep.stack.currentIndex() == 0
    assert "Press Compare" in view.stacks["layers"].widget(0).text()
    a = synthetic_model_record()
    view.set_model(a)
    view.set_record(synthetic_record(n_layers=3))
    for p in _points():
        view.add_sweep_point(p)
    assert all(s.currentIndex() == 1 for s in view.stacks.values()) and view.sweep.stack.currentIndex() == 1
    assert view.summary.rowCount() > 10 and len(view.layers.rel.getData()[0]) == 3
    view.set_model(a)  # the same file again (e.g. after Apply): results stay
    assert view.record is not None and len(view.sweep.points) == 3
    view.set_model(dataclasses.replace(a, path="/tmp/other.gguf", name="other"))
    assert view.record is None and view.summary.rowCount() == 0 and view.sweep.points == []
    assert view.layers.rel.getData()[0] is None or len(view.layers.rel.getData()[0]) == 0
    assert all(s.currentIndex() == 0 for s in view.stacks.values()) and view.sweep.stack.currentIndex() == 0
    assert view.mix_rules == () and not view.sweep.mix.compare.isEnabled()


def test_axis_own_share_and_b_from_a_preset(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.set_model(synthetic_model_record())
    title = view.sweep.plot.getPlotItem().titleLabel.text
    assert "KLD to the file (mostly Q4_K), not to full precision" in title
    rec = synthetic_record(n_layers=3)
    rec = dataclasses.replace(rec, own_l2=np.array([0.01, 0.1, 0.02], np.float32), own_cosine=np.ones(3, np.float32))
    view.set_record(rec)
    assert len(view.layers.own.opts["x"]) == 3 and "Own share" in view.layers.toolTip()
    view.source.setCurrentIndex(view.source.findData("preset"))
    view.b_preset.setCurrentText("Q2_K")
    assert not view.b_preset.isHidden()
    with qtbot.waitSignal(view.compare_requested, timeout=60_000) as sig:
        view.run.click()
    assert sig.args[0].b_source == "preset" and sig.args[0].b_preset == "Q2_K"


def test_points_clickable_compare_and_apply(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(1400, 900)
    view.show()
    view.set_model(synthetic_model_record())
    for p in _points():
        view.add_sweep_point(p)
    assert len(view.sweep.mixes.getData()[0]) == 1 and len(view.sweep.scatter.getData()[0]) == 2
    front = [view.sweep.points[i].name for i in pareto_front(view.sweep.points)]
    assert front == ["mix ≤ 4.90 bpw", "Q8_0"]  # the mix beats Q4_K_M at a smaller size
    assert any("◆ mix" in lbl.toPlainText() for lbl in view.sweep.labels)
    spot = view.sweep.scatter.points()[1]
    with qtbot.waitSignal(view.compare_requested, timeout=60_000) as sig:
        view.sweep._clicked(view.sweep.scatter, [spot])
    assert sig.args[0].b_source == "preset" and sig.args[0].b_preset == "Q4_K_M"
    mix_spot = view.sweep.mixes.points()[0]
    with qtbot.waitSignal(view.compare_requested, timeout=60_000) as sig:
        view.sweep._clicked(view.sweep.mixes, [mix_spot])
    assert sig.args[0].b_source == "mix" and sig.args[0].b_rules == RULES and sig.args[0].b_name.startswith("mix")
    with qtbot.waitSignal(view.apply_requested, timeout=60_000) as sig:
        view.sweep.mix.apply.click()
    assert sig.args[0] == OverrideSpec(None, RULES)


def test_mix_controls_progress_and_result(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.set_model(synthetic_model_record())
    view.sweep.mix.set_budget(3.9)
    assert "3.90 bpw" in view.sweep.mix.size.text() and "MiB" in view.sweep.mix.size.text()
    with qtbot.waitSignal(view.mix_requested, timeout=60_000) as sig:
        view.sweep.mix.find.click()
    assert sig.args == [pytest.approx(3.9), eval_text()]
    view.mix_started()
    assert not view.sweep.mix.find.isEnabled() and view.sweep.cancel.isEnabled()
    view.set_progress(TaskProgress("mix", "tensor 3 of 30", 0.4))
    assert view.sweep.progress.value() == 400
    with qtbot.waitSignal(view.sweep_cancel_requested, timeout=60_000):
        view.sweep.cancel.click()
    view.mix_finished(None, "Mix search cancelled; the tensors measured so far are cached")
    assert view.sweep.mix.find.isEnabled() and "cached" in view.sweep.status.text()
    view.mix_finished(_points()[2])
    view.mix_finished(_points()[2])  # the same size searched again: one point
    assert len(view.sweep.points) == 1 and "3 Q4_0" in view.sweep.status.toolTip()
    view.failed("mix", "needs 9 GiB, 2 GiB available")
    assert "Mix search stopped: needs 9 GiB" in view.sweep.status.text()


def test_plan_label_names_the_fallbacks(smollm2_path: Path) -> None:
    from engine.gguf import open_gguf
    from engine.quality.requantize import make_plan

    with open_gguf(smollm2_path) as g:
        plan = make_plan(g, "Q2_K")
    label = plan_label("Q2_K preset", plan)
    n = sum(1 for t in plan.fallbacks if "576" in t.reason and t.new.name == "Q4_0")
    assert n > 100 and label.startswith(f"Q2_K preset: {n} tensors fell back to Q4_0 (rows of 576 are not a multiple of 256)")
    assert plan_label("Q8_0 preset", make_plan(open_gguf(smollm2_path), "Q8_0")) == "Q8_0 preset"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", dim=128, n_heads=4, n_kv_heads=2,
                           hidden=256, n_ctx=256, tied=False)


def test_window_finds_a_mix_and_compares_it(qtbot, data_dir: Path, tiny: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from app.main_window import MainWindow

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # the sensitivities go to a temporary cache
    w = MainWindow(load=False)
    qtbot.addWidget(w)
    w.show()
    w.open_model(str(tiny))
    qtbot.waitUntil(lambda: w.state.model is not None and w.quant_bridge.file_record is not None, timeout=60_000)
    view = w.compare_view
    view.sweep.mix.set_budget(5.0)
    view.sweep.mix.find.click()
    qtbot.waitUntil(lambda: view.sweep.mix.find.isEnabled(), timeout=120_000)
    mixes = [p for p in view.sweep.points if p.kind == "mix"]
    assert len(mixes) == 1, view.sweep.status.text()
    assert mixes[0].bpw <= 5.0 and mixes[0].rules and mixes[0].kld_mean >= 0
    assert list((tmp_path / "cache" / "gguf-lens" / "mix").glob("*.json"))  # resumable later
    view.compare_point(mixes[0])
    qtbot.waitUntil(lambda: view.record is not None, timeout=60_000)
    rec = view.record
    assert rec.b_label == mixes[0].name and rec.own_l2 is not None and len(rec.own_l2) == rec.n_layers
    view.source.setCurrentIndex(view.source.findData("file"))
    view.run.click()
    qtbot.waitUntil(lambda: view.record is not rec, timeout=60_000)
    assert float(view.record.own_l2.max()) < 1e-5  # the same weights: no layer adds anything
    # Apply puts the searched mix in the Quantization lens: every tensor in memory has the type its rule names
    from engine.quant.rules import match_rule, parse_rules

    editor, rules = w.quant_bridge.editor, parse_rules(mixes[0].rules)
    file_types = {t.name: t.type_name for t in w.state.model_record.tensors}
    assert view.sweep.mix.chosen is not None and view.sweep.mix.chosen.rules == mixes[0].rules
    view.sweep.mix.apply.click()
    qtbot.waitUntil(lambda: editor.busy is None and not editor.applied.empty, timeout=60_000)
    now = {t.name: t.type_name for t in w.state.model_record.tensors}
    want = {n: (r.qtype.name if (r := match_rule(rules, n)) is not None else q) for n, q in file_types.items()}
    assert now == want and now != file_types and "Done" in editor.message.text()
    w.close()
    assert w.engine.threads() == []


def test_search_memory_is_checked_first(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.memory
    from app.jobs.mix import check_search_memory
    from engine.errors import InferenceError
    from engine.model import load_model

    model = load_model(tiny, warm=False)
    check_search_memory(model, 128)  # fits
    monkeypatch.setattr(engine.memory, "available_memory", lambda: 1 << 20)
    with pytest.raises(InferenceError, match="needs|GiB"):
        check_search_memory(model, 128)
    model.close()
