"""The tour's table of questions is whole, bad arguments are refused, and its hooks (and the screenshot's) work the window."""
from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import tour
from app.main_window import MainWindow
from app.screenshot import Screenshot
from app.views.attention.lens import AttentionLens
from app.views.quant.lens import QuantLens
from tests.app.test_lenses_common import synthetic_model_record


def test_every_question_has_a_tab_a_name_and_a_way_to_be_ready() -> None:
    for q in tour.QUESTIONS:
        assert q in tour.NAMES and q in tour.TAB
    assert set(tour.PREPARE) <= set(tour.QUESTIONS) and set(tour.READY) <= set(tour.QUESTIONS)
    assert len(set(tour.NAMES.values())) == len(tour.QUESTIONS)  # one file per question
    assert "Q4_K_M" in tour.TOUR_PRESETS and "Q8_0" in tour.TOUR_PRESETS  # q5: Q4_K_M against Q8_0
    assert tour.COMPARE_PRESET in tour.TOUR_PRESETS  # q4's preset is on q5's chart too


def test_bad_arguments_are_refused(capsys) -> None:
    assert tour.main(["m.gguf", "--out", "x", "--questions", "q1,q9"]) == 2
    assert "unknown question(s) q9" in capsys.readouterr().err
    assert tour.main(["m.gguf", "--out", "x", "--size", "big"]) == 2
    assert "--size must be WxH" in capsys.readouterr().err



def test_hooks_drive_the_window_through_public_methods(qtbot, data_dir: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a model: the hooks reach the lenses through the tabs' public methods; the tour's state is its own."""
    w = MainWindow(load=False)
    qtbot.addWidget(w)
    asked: list[str] = []
    monkeypatch.setattr(w.engine, "request_lens", lambda kind, compute: asked.append(kind))
    t = tour.Tour(w, tmp_path, "hi", [], timeout_s=300)
    t.timer.stop()
    try:
        quant = w.lens_tabs.select(tour.TAB["q6"])  # q6: a tensor opened by the lens's public open_tensor
        assert isinstance(quant, QuantLens) and w.lens_tabs.showing("Quantization")
        quant.set_model(synthetic_model_record())
        t._prepare("q6")
        name = t.asked.quant_tensor
        assert name in {row.name for row in synthetic_model_record().tensors} and asked == ["tensor"]
        assert not t._ready("q6")
        quant.tensor = SimpleNamespace(name=name)  # type: ignore[assignment]  # its record came back
        assert t._ready("q6")
        lens = w.lens_tabs.select("Attention")
        assert isinstance(lens, AttentionLens) and lens is w.lens_tabs.lens(AttentionLens)
        t._prepare("q1g")
        assert lens.views.currentWidget() is lens.overview and t._ready("q1g")  # no roles scored: nothing to frame
        t._prepare("q7")
        assert lens.views.currentWidget() is lens.logit and not t._ready("q7")
        compare = w.lens_tabs.select("Compare")
        assert compare is w.compare_view and tour.READY["q7c"](t, compare) is False and not t.asked.pair_asked
        shot = Screenshot(w, tmp_path / "shot.png", "hi", 60, "attention", "steps", "0,1,2")
        shot.timer.stop()
        shot._show_tab()
        assert w.lens_tabs.showing("Attention") and shot._tab_ready()  # only the Compare tab prepares itself
        assert not shot._steps_ready(time.monotonic()) and shot.steps_asked
        assert lens.views.currentWidget() is lens.steps
    finally:
        w.close()
