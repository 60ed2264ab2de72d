"""The Experiments tab's patching in the real window on SmolLM2: Run makes the standard figure on the worker (the window stays
responsive), the map and summary show the answer pair; prompts of unequal length and a cancelled run say so."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from app.records.patching import PatchRecord
from engine.intervene.ablation import Ablation, ablate
from tests.app.test_end_to_end import open_window

RUN_MS = 120_000


def test_patching_from_the_tab(qtbot, smollm2_path: Path, data_dir: Path) -> None:
    w = open_window(qtbot, str(smollm2_path))
    assert w.lens_tabs.select("Experiments") is w.experiments_view
    view = w.patching_view
    qtbot.waitUntil(lambda: view.run_button.isEnabled(), timeout=RUN_MS)
    view.run_button.click()
    assert view.cancel_button.isEnabled() and not view.run_button.isEnabled()
    qtbot.waitUntil(lambda: view.record is not None, timeout=RUN_MS)
    rec: PatchRecord = view.record
    assert rec.scores.shape == (30, 9) and np.isfinite(rec.scores).all() and rec.complete
    assert rec.answer == " Paris" and rec.wrong == " Rome" and "Paris" in view.info.text()
    assert view.run_button.isEnabled() and not view.cancel_button.isEnabled() and not view.progress.isVisible()
    assert not rec.cached
    view.run_button.click()  # the same map again: kept, not run again
    qtbot.waitUntil(lambda: view.record is not rec, timeout=RUN_MS)
    assert view.record.cached and np.array_equal(view.record.scores, rec.scores) and "kept" in view.info.text()
    ablate(w.engine.session.model, Ablation(heads=((3, 4),)))  # another model state: run again
    view.run_button.click()
    qtbot.waitUntil(lambda: view.record.cached is False and view.run_button.isEnabled(), timeout=RUN_MS)
    assert not np.array_equal(view.record.scores, rec.scores)
    ablate(w.engine.session.model, Ablation())
    view.corrupt_edit.setText("The Colosseum in Rome is in the city of")
    view.run_button.click()
    qtbot.waitUntil(lambda: "same length" in view.info.text(), timeout=RUN_MS)
    assert view.run_button.isEnabled()
    view.corrupt_edit.setText("The Colosseum is in the city of")
    view.kind_box.setCurrentIndex(view.kind_box.findData("mlp_out"))
    view.run_button.click()
    qtbot.waitUntil(lambda: view.progress.value() > 0, timeout=RUN_MS)
    view.cancel_button.click()
    qtbot.waitUntil(lambda: view.run_button.isEnabled(), timeout=RUN_MS)
    assert view.record.kind == "mlp_out" and not view.record.complete and "cancelled" in view.info.text()
    w.close()


def test_a_heads_map_is_labelled_by_head(qtbot) -> None:
    from app.views.patching import PatchingView

    view = PatchingView()
    qtbot.addWidget(view)
    scores = np.zeros((4, 9))
    scores[2, 7] = 0.8
    view.set_record(PatchRecord(scores, ("a", "b"), ("c", "d"), " Paris", " Rome", 2.0, -1.0, "heads", 0.5))
    assert view.tokens_axis.texts == tuple(f"h{h}" for h in range(9))
    assert "layer 2 head 7 (0.80)" in view.info.text() and view.plots.isVisible() is not None
