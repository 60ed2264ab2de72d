"""The tour's table of questions is whole, and bad arguments are refused with a message (no window is opened)."""
from __future__ import annotations

from app import tour


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
