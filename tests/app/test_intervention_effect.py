"""Issue 43 item 3, the effect of an experiment on the chat, in the real window on SmolLM2.

After Apply the Experiments tab shows KLD(before || after) of the next token after the chat, the top 5 tokens before
and after and whether the top token changed: the numbers equal the engine's own forward passes of the same tokens
(a second copy of the model, the control vector and LoRA files of tools/make_cvec_fixtures.py and
tools/make_lora_fixtures.py set with engine.intervene), where "before" is the model as it was before that Apply (a
second Apply measures against the first). Regenerate stays enabled after Apply and after Clear all, so the same turn
is made with and without; Compare offers the adapters on the model. A bad head or scale gives a message and changes
nothing; a result for a chat no longer shown shows no numbers; Stop ends the measurement, never the change.
"""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest

from app.jobs.chat import fit_context
from app.jobs.interventions import interventions_job
from app.jobs.session import Session
from app.records.interventions import InterventionRecord, InterventionSpec, LoadedAdapter
from app.views.interventions import InterventionsPanel
from engine.generate import log_softmax, prefill
from engine.intervene import control_vector, lora
from engine.model import load_model
from engine.quality.compare import kld_rows
from tests.app.windows import greedy_window
from tools.make_cvec_fixtures import write_cvec
from tools.make_lora_fixtures import write_lora

RUN_MS = 120_000  # hang guards, not speeds
CVEC_SCALE = 0.5


@pytest.fixture(scope="module")
def reference(smollm2_path: Path):  # noqa: ANN201 - the engine's own copy of the model
    model = load_model(smollm2_path)
    yield model
    for ad in lora.current(model):
        ad.file.close()
    model.close()


def _logp(model, ids: list[int]) -> np.ndarray:  # noqa: ANN001
    """log p of the next token at every position, the engine's forward pass over all of `ids` at once."""
    logits = model.forward(ids, model.new_cache(max(16, len(ids))), all_logits=True)
    return log_softmax(logits).astype(np.float64)


def _set(model, cvec: Path | None, adapter: Path | None) -> None:  # noqa: ANN001
    a = model.args
    control_vector.apply(model, control_vector.load([(str(cvec), CVEC_SCALE)], a.dim, a.n_layers, model.arch)
                         if cvec else None)
    for ad in lora.current(model):
        ad.file.close()
    lora.apply(model, [lora.load(model, adapter, 1.0)] if adapter else [])


def _check(rec: InterventionRecord, model, ids: list[int], before: tuple, after: tuple) -> None:  # noqa: ANN001
    """The record's numbers are the engine's for these tokens with `before` then `after` (cvec, LoRA) set."""
    _set(model, *before)
    p = _logp(model, ids)
    _set(model, *after)
    q = _logp(model, ids)
    tok = model.tokenizer
    assert rec.token_texts == tuple(tok.token_text(t) for t in ids)
    want = kld_rows(p, q)
    assert rec.kld.shape == want.shape and np.allclose(rec.kld, want, rtol=1e-5, atol=1e-9)
    assert rec.next_kld == pytest.approx(float(want[-1]), rel=1e-5, abs=1e-9) and rec.next_kld > 1e-4
    for got, row in ((rec.top_before, p[-1]), (rec.top_after, q[-1])):
        top = np.argsort(-row, kind="stable")[:5]
        assert [t for t, _ in got] == [tok.token_text(int(i)) for i in top]
        assert np.allclose([pr for _, pr in got], np.exp(row[top]), rtol=1e-5)
    assert rec.top_changed == (int(np.argmax(p[-1])) != int(np.argmax(q[-1])))


def _applied(qtbot, panel, before: InterventionRecord | None) -> InterventionRecord:  # noqa: ANN001
    qtbot.waitUntil(lambda: panel.record is not before and panel.apply_button.isEnabled(), timeout=RUN_MS)
    return panel.record


def test_the_effect_is_the_engines(qtbot, smollm2_path: Path, data_dir: Path, tmp_path: Path, reference) -> None:
    cvec, adapter = write_cvec(tmp_path, "a"), write_lora(tmp_path, "a")
    w = greedy_window(qtbot, smollm2_path, data_dir, max_tokens=6)
    w.conversation.send("What is the capital of France?")
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=RUN_MS)
    panel = w.experiments_view.interventions
    w.lens_tabs.select("Experiments")
    qtbot.waitUntil(panel.apply_button.isEnabled, timeout=RUN_MS)
    ids = fit_context(reference, w.conversation.shown_request(), 4096)[0]
    panel.cvec.path.setText(str(cvec))
    panel.cvec.scale.setValue(CVEC_SCALE)
    panel.apply_button.click()
    first = _applied(qtbot, panel, None)
    _check(first, reference, ids, (None, None), (cvec, None))
    assert first.before == "" and first.description == f"control vector {cvec.name} x0.5"
    text = panel.effect.text()
    assert f"KLD {first.next_kld:.5f}" in text and ("top token: '" in text) == first.top_changed
    assert panel.regen_button.isEnabled()  # the same turn can be made again with the experiment on

    panel.lora.path.setText(str(adapter))  # a second Apply: measured against the model with the control vector
    panel.apply_button.click()
    second = _applied(qtbot, panel, first)
    _check(second, reference, ids, (cvec, None), (cvec, adapter))
    assert second.before == first.description and panel.regen_button.isEnabled()
    offered = [w.compare_view.source.itemText(i) for i in range(w.compare_view.source.count())]
    assert "Experiments: LoRA lora_a.gguf x1" in offered and "Experiments: control vector cvec_a.gguf x0.5" in offered
    w.compare_view.source.select("loaded:0")
    opts = w.compare_view.options()
    assert (opts.b_source, opts.b_path, opts.b_scale) == ("adapter", str(adapter), 1.0)

    first_reply = w.conversation.current.messages[-1].content
    panel.regen_button.click()
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=RUN_MS)
    last = w.conversation.current.messages[-1]
    assert [v.content for v in last.versions] == [first_reply] and last.stats.model.endswith(f"LoRA {adapter.name} x1")

    panel.clear_button.click()  # Clear all: its effect too, and Regenerate stays for the turn without
    cleared = _applied(qtbot, panel, second)
    assert cleared.description == "" and cleared.before == second.description and cleared.measured
    assert panel.regen_button.isEnabled() and w.compare_view.source.findData("loaded:0") < 0
    assert w.compare_view.options().b_path == str(adapter)  # B stays the adapter it was, as a file chosen there
    w.close()


def test_bad_input_changes_nothing(qtbot, smollm2_path: Path, data_dir: Path, tmp_path: Path) -> None:
    cvec = write_cvec(tmp_path, "a")
    w = greedy_window(qtbot, smollm2_path, data_dir, max_tokens=4)
    w.conversation.send("What is the capital of France?")
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=RUN_MS)
    panel = w.experiments_view.interventions
    qtbot.waitUntil(panel.apply_button.isEnabled, timeout=RUN_MS)
    panel.cvec.path.setText(str(cvec))
    panel.apply_button.click()
    rec = _applied(qtbot, panel, None)
    model = w.engine.session.model
    shown = f"KLD {rec.next_kld:.5f}"
    panel.heads.setText("3:99")  # the model has 9 heads a layer
    panel.apply_button.click()
    qtbot.waitUntil(lambda: "out of range" in panel.effect.text(), timeout=RUN_MS)
    assert "Nothing was changed" in panel.effect.text() and shown in panel.effect.text()  # the effect shown stays
    assert panel.heads.text() == "3:99" and panel.active.text() == f"On: {rec.description}"
    assert control_vector.current(model) is not None and not model.net.ablated_heads
    w.experiments_bridge.apply(dataclasses.replace(panel.spec(), heads="", cvec_scale=float("nan")))
    qtbot.waitUntil(lambda: "finite number" in panel.effect.text(), timeout=RUN_MS)
    assert control_vector.current(model).sources == ((cvec.name, 1.0),) and panel.record is rec
    assert panel.regen_button.isEnabled() and panel.apply_button.isEnabled()

    panel.heads.setText("")
    panel.cvec.scale.setValue(0.25)
    panel.apply_button.click()
    w.conversation.new_chat()  # the result arrives for a chat no longer shown: set, its numbers not shown
    later = _applied(qtbot, panel, rec)
    assert later.description.endswith("x0.25") and not later.measured and "Apply again" in panel.effect.text()
    assert not panel.regen_button.isEnabled()  # the new chat has no turn to answer again
    w.close()


def test_stop_ends_the_measurement_not_the_change(smollm2_path: Path, reference) -> None:
    session = Session(model=load_model(smollm2_path))
    try:
        session.fresh_cache()
        ids = reference.tokenizer.encode("The Eiffel Tower is in the city of", add_special=True, parse_special=False)
        prefill(session.model, ids, session.cache)  # no conversation given: the chat is what its cache holds
        stop = threading.Event()
        stop.set()
        spec = InterventionSpec(heads="3:4")
        job = interventions_job(session, spec, stop, lambda item: None)
        rec = None
        try:
            while True:
                next(job)
        except StopIteration as done:
            rec = done.value
        assert rec.description == "ablated L3h4" and list(session.model.net.ablated_heads) == [3]
        assert not rec.measured and rec.note.startswith("stopped") and len(rec.token_texts) == len(ids)
        assert rec.adapters == () and LoadedAdapter("lora", "x.gguf", 1.0).label == "LoRA x.gguf x1"
    finally:
        session.model.close()


def test_progress_and_stop_while_measuring(qtbot) -> None:
    panel = InterventionsPanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.set_model(True)
    panel.apply_button.click()
    assert not panel.apply_button.isEnabled() and not panel.effect_view.stop.isVisible()
    qtbot.waitUntil(panel.effect_view.stop.isVisible, timeout=60_000)  # once it takes a while
    panel.set_progress("the chat as the model was", 0.25)
    bar = panel.effect_view.progress
    assert bar.value() == 250 and "the chat as the model was" in bar.format()
    with qtbot.waitSignal(panel.stop_requested, timeout=60_000):
        panel.effect_view.stop.click()
    panel.set_record(InterventionRecord("ablated L0h1", np.zeros(0), ("a",), (), (), 0.1,
                                        note="stopped: the effect was not measured"))
    assert not panel.effect_view.stop.isVisible() and panel.apply_button.isEnabled()
    assert "stopped: the effect was not measured" in panel.effect.text() and panel.active.text() == "On: ablated L0h1"
