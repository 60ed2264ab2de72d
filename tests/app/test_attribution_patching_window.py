"""The Why lens's Patching tab in the real window, on the tiny random llama: after a reply, a corrupted prompt of as
many tokens as the clean one (the conversation before the token explained) gives attribution patching's head map and
the engine's own Spearman and top-10 overlap against real patching for that pair; an empty prompt, one of another
length and a model with no backward are refused with a message, the result shown staying; the progress counts each
pass; the lens's Stop during a run ends it within its passes and the tab says it stopped."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.jobs import attribution as jobs
from app.jobs.attribution import conversation_ids, corrupt_ids
from app.views.attribution import WhyLens
from app.views.attribution_patching import EMPTY_TEXT
from engine.attribute.attribution_patching import attribution_patching
from engine.errors import SettingError
from engine.model import load_model
from tests.app.windows import greedy_window
from tests.tiny_models import make_tiny_llama

WAIT_MS = 120_000  # a hang guard, not a speed
LETTERS = "xqzjkv"
CONTRAST = 12  # a token id of the tiny vocabulary


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("why_patch") / "llama.gguf")


def corruptions(model, clean_text: str, clean_ids: list[int], answer: int, wrong: int):  # noqa: ANN001, ANN201
    """Texts of as many tokens as the clean prompt, one letter changed, that attribution patching takes (the logit
    difference moves), with the engine's estimate for each."""
    for i, ch in enumerate(clean_text):
        if not ch.isalpha():
            continue
        for sub in LETTERS:
            text = clean_text[:i] + sub + clean_text[i + 1:]
            bad = corrupt_ids(model.tokenizer, text)
            if len(bad) != len(clean_ids) or bad == clean_ids:
                continue
            try:
                yield text, attribution_patching(model, clean_ids, bad, answer, wrong)
            except SettingError:
                continue
            break


def test_patching_tab_reports_the_engines_check_refuses_and_stops(qtbot, llama: Path, data_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    w = greedy_window(qtbot, llama, data_dir, max_tokens=6)
    try:
        lens = w.lens_tabs.select("Why")
        assert isinstance(lens, WhyLens)
        panel = lens.patching
        assert not panel.run_button.isEnabled()  # no token explained yet
        assert w.conversation.send("Tell me a story")
        qtbot.waitUntil(lambda: not w.conversation.generating, timeout=WAIT_MS)
        qtbot.waitUntil(lambda: lens.record is not None and not lens.busy, timeout=WAIT_MS)
        wrong = CONTRAST if lens.record.target_id != CONTRAST else CONTRAST + 1
        lens.contrast_edit.setText(f"#{wrong}")  # the wrong token of the pair: the lens's contrast
        lens.run()
        qtbot.waitUntil(lambda: lens.record.contrast_id == wrong and not lens.busy, timeout=WAIT_MS)
        rec = lens.record
        lens.views.setCurrentWidget(panel)
        assert panel.record is rec and panel.run_button.isEnabled()

        model = load_model(str(llama))
        ids, _start = conversation_ids(model, None, w.bridge.shown_context())
        idx = rec.token_index
        panel.fill_clean()  # the clean prompt as the lens reads it, to edit
        clean_text = panel.corrupt_edit.toPlainText()
        assert clean_text == "".join(rec.token_texts[:idx]) and corrupt_ids(model.tokenizer, clean_text) == ids[:idx]
        found = corruptions(model, clean_text, ids[:idx], ids[idx], wrong)
        (text, est), (other, _est2) = next(found), next(found)

        reported: list[float] = []  # the status bar's progress bar and the tab's get the job's passes
        w.engine.lens_progress.connect(lambda item: reported.append(item.fraction)
                                       if getattr(item, "kind", "") == "why_patch" else None)
        panel.corrupt_edit.setPlainText(text)
        panel.run()
        assert panel.busy and panel.stop_button.isEnabled()
        qtbot.waitUntil(lambda: panel.result is not None and not panel.busy, timeout=WAIT_MS)
        got, check = panel.result, est.checks["heads"]
        assert got.spearman == pytest.approx(check.spearman, abs=1e-6)
        assert got.top_overlap == pytest.approx(check.top_overlap)
        assert got.clean_diff == pytest.approx(est.clean_diff, abs=1e-4)
        assert got.corrupt_diff == pytest.approx(est.corrupt_diff, abs=1e-4)
        n = model.args.n_layers * model.args.n_heads
        top = min(10, n)
        shown = panel.agreement.text()
        assert f"estimate vs real patching of {n} heads: Spearman {check.spearman:.2f}" in shown
        assert f"top-10 overlap {round(check.top_overlap * top)}/{top}" in shown
        assert f"clean {est.clean_diff:+.4f}" in panel.status.text()
        assert got.estimate.shape == (model.args.n_layers, model.args.n_heads)
        assert reported == pytest.approx([k / (1 + n) for k in range(1, n + 2)])  # the gradient, then each head
        assert panel.est_image.image is not None and panel.real_image.image is not None

        # refusals: a message in the tab, the result shown stays, the lens's own record too
        panel.corrupt_edit.setPlainText("   ")
        panel.run()
        assert panel.status.text() == EMPTY_TEXT and not panel.busy and panel.result is got
        longer = corrupt_ids(model.tokenizer, text + " and a few more words")
        panel.corrupt_edit.setPlainText(text + " and a few more words")
        panel.run()
        qtbot.waitUntil(lambda: not panel.busy, timeout=WAIT_MS)
        said = panel.status.text()
        assert f"the corrupted prompt is {len(longer)} tokens" in said and f"is {idx}" in said, said
        assert panel.result is got and panel.agreement.text() == shown and lens.record is rec

        def no_backward(_model: object) -> None:
            raise SettingError("no backward for the recurrent (DeltaNet) mixer of layer 0")

        with monkeypatch.context() as m:
            m.setattr("engine.grad.backward.check_supported", no_backward)
            panel.corrupt_edit.setPlainText(other)
            panel.run()
            qtbot.waitUntil(lambda: not panel.busy, timeout=WAIT_MS)
        assert "no backward for the recurrent (DeltaNet) mixer" in panel.status.text()
        assert panel.result is got and panel.agreement.text() == shown

        # Stop during a run: the job waits after its gradient until Stop is pressed, then ends before its first
        # real-patching run
        passes: list[tuple[int, int]] = []
        waiting = threading.Event()

        def held(what: str, unit: str = "tokens"):  # noqa: ANN202 - the job's progress reporter, on the worker
            def report(done: int, total: int) -> None:
                if unit != "passes":  # a prefill's tokens: not the patching's passes
                    return
                passes.append((done, total))
                waiting.set()
                stop = jobs.job_cancel()
                assert stop is not None and stop.wait(60)
            return report

        monkeypatch.setattr(jobs, "job_progress", held)
        panel.corrupt_edit.setPlainText(other)
        panel.run()
        qtbot.waitUntil(waiting.is_set, timeout=WAIT_MS)
        panel.stop_button.click()
        assert panel.status.text() == "Stopped." and not panel.busy
        qtbot.waitUntil(lambda: w.engine._lens is None, timeout=WAIT_MS)  # the job ended
        qtbot.wait(50)
        assert passes == [(1, 1 + n)]  # the gradient only: no real-patching run after the Stop
        assert panel.status.text() == "Stopped." and panel.result is got
    finally:
        w.close()
