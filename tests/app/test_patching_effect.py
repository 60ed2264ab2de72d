"""A patching map's cell, patched alone, shows its effect on the corrupted prompt's next token (issue 43, item 3).

In the real window on SmolLM2: after Run the cell that restores the most is selected and measured; a clicked cell's
effect (KLD, top tokens and their probabilities) equals the engine's own runs through engine.intervene's hooks; clicking
back shows the kept record without running again. A heads map's cell patches one head at every position; a cell that
cannot be measured says why under a map that stays; a model load clears the effect and what was kept. On the view
alone, with synthetic records: the automatic selection, a click during a run, an answer for another cell or map.
"""
from __future__ import annotations

import html
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt

import app.jobs.patching as jobs
from app.records.patching import PatchEffect, PatchRecord
from app.views.intervention_effect import top_line
from app.views.patching import CLEAN_DEFAULT, CORRUPT_DEFAULT, PatchingView
from app.views.patching_effect import HELP
from engine.errors import LensError
from engine.generate import log_softmax
from engine.intervene.hooks import run_with_cache, run_with_hooks
from engine.model import load_model
from tests.app.test_end_to_end import LOAD_MS, open_window
from tests.tiny_models import make_tiny_llama

RUN_MS = 120_000
PROMPTS = (CLEAN_DEFAULT, CORRUPT_DEFAULT)


def engine_effect(w, kind: str, layer: int, cell: int):  # noqa: ANN001, ANN201
    """The corrupted prompt's last-position log p without and with the cell patched from the clean run, run here."""
    point = {"resid_pre": "hook_resid_pre", "heads": "attn.hook_z"}[kind]
    name = f"blocks.{layer}.{point}"
    at = (slice(None), cell) if kind == "heads" else (cell,)
    with w.engine.session.lock:  # the worker is idle: the model is read here
        model = w.engine.session.model
        clean, corrupt = (model.tokenizer.encode(t, add_special=True, parse_special=False) for t in PROMPTS)
        _, acts = run_with_cache(model, clean, [name])

        def put(value: np.ndarray, _name: str) -> np.ndarray:
            value = value.copy()
            value[at] = acts[name][at]
            return value

        before = run_with_hooks(model, corrupt, [])[-1]
        after = run_with_hooks(model, corrupt, [(name, put)])[-1]
        tok = model.tokenizer
    lp_b, lp_a = (log_softmax(x).astype(np.float64) for x in (before, after))
    kld = float(np.sum(np.exp(lp_b) * (lp_b - lp_a)))

    def top(lp: np.ndarray) -> list[tuple[str, float]]:
        return [(tok.token_text(int(i)), float(np.exp(lp[i]))) for i in np.argsort(-lp, kind="stable")[:5]]

    return kld, top(lp_b), top(lp_a)


def assert_is_the_engines(w, eff: PatchEffect, kind: str, layer: int, cell: int) -> None:  # noqa: ANN001
    kld, top_b, top_a = engine_effect(w, kind, layer, cell)
    assert (eff.kind, eff.layer, eff.cell, eff.prompts) == (kind, layer, cell, PROMPTS)
    assert abs(eff.next_kld - kld) < 1e-6 and kld > 1e-4  # the patch moves the distribution
    assert [t for t, _ in eff.top_before] == [t for t, _ in top_b]
    assert [t for t, _ in eff.top_after] == [t for t, _ in top_a]
    assert np.allclose([p for _, p in eff.top_before + eff.top_after], [p for _, p in top_b + top_a], atol=1e-6)
    shown = w.patching_view.effect.text.text()
    assert f"KLD {kld:.5f}" in shown and html.escape(top_line(tuple(top_b), tuple(top_a)), quote=False) in shown


def click_cell(qtbot, view: PatchingView, layer: int, cell: int) -> None:  # noqa: ANN001
    """A left click at the cell's centre on the map, as a user's."""
    scene = view.plot.vb.mapViewToScene(QPointF(cell + 0.5, layer + 0.5))
    qtbot.mouseClick(view.plots.viewport(), Qt.MouseButton.LeftButton, pos=view.plots.mapFromScene(scene))


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """(kind, layer, cell) of every cell measured by running the model."""
    calls: list[tuple[str, int, int]] = []
    real = jobs.cell_effect

    def counting(model, a, b, kind, layer, cell, *rest):  # noqa: ANN001, ANN202
        calls.append((kind, layer, cell))
        return real(model, a, b, kind, layer, cell, *rest)

    monkeypatch.setattr(jobs, "cell_effect", counting)
    jobs.forget_effects()
    return calls


def test_best_cell_then_a_clicked_cell_are_the_engines_and_kept(qtbot, smollm2_path: Path, data_dir: Path,
                                                                 counted: list) -> None:
    w = open_window(qtbot, str(smollm2_path))
    try:
        assert w.lens_tabs.select("Experiments") is w.experiments_view
        view = w.patching_view
        qtbot.waitUntil(lambda: view.run_button.isEnabled(), timeout=RUN_MS)
        view.run_button.click()
        qtbot.waitUntil(lambda: view.effect_record is not None, timeout=RUN_MS)
        rec, best = view.record, view.effect_record
        s = np.nan_to_num(rec.scores, nan=-np.inf)
        most = tuple(int(i) for i in np.unravel_index(int(np.argmax(s)), s.shape))
        assert view.selected == most == (best.layer, best.cell) and counted == [("resid_pre", *most)]
        assert view.box.isVisible() and "Patching layer" in view.effect.text.text()
        target = (5, 2) if most != (5, 2) else (6, 2)
        click_cell(qtbot, view, *target)
        assert view.selected == target
        qtbot.waitUntil(lambda: view.effect_record is not None, timeout=RUN_MS)
        assert_is_the_engines(w, view.effect_record, "resid_pre", *target)
        click_cell(qtbot, view, *most)  # back to the first: the kept record, no run
        qtbot.waitUntil(lambda: view.effect_record is not None, timeout=RUN_MS)
        assert view.effect_record is best and counted == [("resid_pre", *most), ("resid_pre", *target)]
        assert_is_the_engines(w, best, "resid_pre", *most)
    finally:
        w.close()


def test_heads_cell_a_refused_cell_and_a_model_load(qtbot, smollm2_path: Path, data_dir: Path, tmp_path: Path,
                                                    counted: list) -> None:
    w = open_window(qtbot, str(smollm2_path))
    try:
        w.lens_tabs.select("Experiments")
        view = w.patching_view
        scores = np.zeros((30, 9))
        scores[4, 7] = 0.9  # the map's best cell: layer 4's head 7, patched at every position
        texts = tuple("abcdefghi")
        view.set_record(PatchRecord(scores, texts, texts, " Paris", " Rome", 2.0, -1.0, "heads", 0.1, prompts=PROMPTS))
        assert view.selected == (4, 7)
        qtbot.waitUntil(lambda: view.effect_record is not None, timeout=RUN_MS)
        assert_is_the_engines(w, view.effect_record, "heads", 4, 7)
        assert "layer 4, head 7" in view.effect.text.text()
        bad = PatchRecord(np.ones((30, 9)), texts, texts, " Paris", " Rome", 2.0, -1.0, "resid_pre", 0.1,
                          prompts=(CLEAN_DEFAULT, "The Colosseum in Rome is in the city of"))
        view.set_record(bad)
        qtbot.waitUntil(lambda: "same length" in view.effect.text.text(), timeout=RUN_MS)
        assert view.record is bad and view.plots.isVisible() and view.effect_record is None
        assert not view.effect.progress.isVisible() and HELP in view.effect.text.text()
        view.set_record(PatchRecord(scores, texts, texts, " Paris", " Rome", 2.0, -1.0, "heads", 0.1, prompts=PROMPTS))
        qtbot.waitUntil(lambda: view.effect_record is not None, timeout=RUN_MS)
        assert len(counted) == 2 and len(jobs._EFFECTS) == 1  # the heads cell came from the memo; the refused one ran
        w.open_model(str(make_tiny_llama(tmp_path / "tiny.gguf")))
        qtbot.waitUntil(lambda: w.state.model_record is not None and w.state.model_record.n_layers == 2,
                        timeout=LOAD_MS)
        assert view.effect_record is None and view.selected is None and view.record is None
        assert not view.box.isVisible() and view.effect.text.text() == HELP and not jobs._EFFECTS
    finally:
        w.close()


def test_stop_ends_a_cells_measurement_and_keeps_nothing(tmp_path: Path) -> None:
    model = load_model(make_tiny_llama(tmp_path / "tiny.gguf"))
    session = SimpleNamespace(model=model, lock=threading.RLock(), generating=threading.Event())
    jobs.forget_effects()
    try:
        for stop_after in ("the clean run", "the corrupted run"):  # before the corrupted run, or before the patched one
            cancel, said = threading.Event(), []

            def emit(item, stop_after: str = stop_after, cancel: threading.Event = cancel,  # noqa: ANN001
                     said: list = said) -> None:
                said.append(item.what)
                if item.what == stop_after:
                    cancel.set()

            job = jobs.patch_effect_job(session, "one two three", "one two four", "resid_pre", 1, 2, cancel, emit)
            with pytest.raises(LensError, match="stopped"):
                list(job)
            assert said[-1] == stop_after and not jobs._EFFECTS
        done = jobs.patch_effect_job(session, "one two three", "one two four", "resid_pre", 1, 2, threading.Event(),
                                     lambda item: None)
        with pytest.raises(StopIteration) as end:
            next(done)
        assert isinstance(end.value.value, PatchEffect) and len(jobs._EFFECTS) == 1  # the same request, not stopped
    finally:
        jobs.forget_effects()
        model.close()


# ---- the view alone

def _record(scores: np.ndarray, prompts: tuple[str, str] = PROMPTS, kind: str = "resid_pre") -> PatchRecord:
    texts = tuple(f"t{i}" for i in range(scores.shape[1]))
    return PatchRecord(scores, texts, texts, " Paris", " Rome", 2.0, -1.0, kind, 0.1, prompts=prompts)


def _effect(layer: int, cell: int, prompts: tuple[str, str] = PROMPTS, kind: str = "resid_pre") -> PatchEffect:
    return PatchEffect(prompts, kind, layer, cell, np.array([0.0, 0.25, 1.5]), ("a", "b", "c"),
                       ((" Rome", 0.6), (" Paris", 0.2)), ((" Paris", 0.7), (" Rome", 0.1)), 0.2)


def test_the_view_selects_the_best_cell_and_shows_only_its_effect(qtbot) -> None:
    view = PatchingView()
    qtbot.addWidget(view)
    asked: list[tuple] = []
    view.effect_requested.connect(lambda *a: asked.append(a))
    scores = np.full((4, 6), np.nan)
    scores[:2] = [[0.1, -0.3, 0.2, 0.0, 0.4, 0.1], [0.3, 0.2, 0.0, 0.71, 0.5, -1.0]]  # layers 2-3 not run (cancelled)
    view.set_record(_record(scores))
    assert asked == [(*PROMPTS, "resid_pre", 1, 3)] and view.selected == (1, 3)
    view.set_effect(_effect(0, 4))  # an answer for a cell asked before: dropped
    view.set_effect(_effect(1, 3, prompts=("a", "b")))  # or for another map's cell
    assert view.effect_record is None
    view.set_effect(eff := _effect(1, 3))
    text = view.effect.text.text()
    assert view.effect_record is eff and "KLD 1.50000" in text and "top token: ' Rome' -&gt; ' Paris'" in text
    assert "layer 1, position 3 “t3” ← “t3” alone (restores 0.71)" in text
    assert "before: ' Rome' 0.600, ' Paris' 0.200<br>after: ' Paris' 0.700, ' Rome' 0.100" in text
    assert not view.select_cell(3, 0) and view.selected == (1, 3)  # not run: nothing to patch
    view.set_model(True)
    view.set_record(_record(scores))
    view.run_button.click()  # a map is being made: clicks wait for it
    asked.clear()
    assert not view.select_cell(0, 0) and asked == [] and "being made" in view.status.text()
    with qtbot.waitSignal(view.effect_stop_requested, timeout=60_000):
        view.effect.stop.click()
    view.set_model(False)
    assert view.effect_record is None and view.selected is None and not view.box.isVisible()
