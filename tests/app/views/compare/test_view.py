"""The Compare view with synthetic records, the whole flow on a tiny model through the window, and a real SmolLM2 run."""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest

from app.records.compare import (
    CompareOptions,
    HeadPair,
    SweepDone,
    SweepPoint,
    TaskProgress,
    make_compare_record,
    pareto_front,
    top_union,
)
from app.data.overrides import OverrideSpec, eval_text
from app.views.compare.view import CompareView
from engine.generate import log_softmax
from engine.quality.compare import Comparison, layer_divergence, token_stats
from tests.app.test_lenses_common import fake_records, fake_run, synthetic_model_record
from tests.conftest import SMOLLM2_FILE, model_path
from tests.tiny_models import make_tiny_llama

TEXTS = ["<s>", " The", " cat", " sat", " on", " the", " mat", "."]


def synthetic_record(n: int = len(TEXTS), vocab: int = 50, n_layers: int = 3, seed: int = 0):
    """A CompareRecord from random logits and hidden states, through engine.quality.compare's own statistics."""
    rng = np.random.default_rng(seed)
    la = rng.standard_normal((n, vocab)).astype(np.float32) * 3
    lb = la + rng.standard_normal((n, vocab)).astype(np.float32) * 0.5
    ids = list(range(n))
    ha = {i: rng.standard_normal((n, 16)).astype(np.float32) for i in range(n_layers)}
    hb = {i: h + 0.1 * (i + 1) * rng.standard_normal(h.shape).astype(np.float32) for i, h in ha.items()}
    stats = Comparison(per_layer=layer_divergence(ha, hb, n), **token_stats(la, lb, ids))
    vocab_text = lambda i: TEXTS[i] if i < len(TEXTS) else f" w{i}"  # noqa: E731
    return make_compare_record(stats, log_softmax(la), log_softmax(lb), ids, vocab_text, labels=("tiny.gguf (file)", "Q4_0"),
                               caches=("F32", "Q8_0"), sizes=(2 << 20, 1 << 20), bpws=(8.5, 4.5), n_heads=4, elapsed_s=0.1)


def head_pair(layer: int = 1, head: int = 2) -> HeadPair:
    _, ha = fake_records(fake_run(len(TEXTS), seed=1), layer, head)
    _, hb = fake_records(fake_run(len(TEXTS), seed=2), layer, head)
    return HeadPair(layer, head, ha, hb)


def test_records_top_union_and_pareto() -> None:
    rec = synthetic_record()
    assert rec.n_tokens == len(TEXTS) and rec.kld.shape == (len(TEXTS),) and rec.n_layers == 3
    np.testing.assert_allclose(rec.kld, rec.stats.per_token_kld, rtol=1e-6)
    top = rec.top(2, "a")
    assert len(top) == 10 and all(top[i][1] >= top[i + 1][1] for i in range(9))
    la = np.log(np.full((1, 30), 1 / 30, np.float32))
    la[0, 7] = 0.0
    ids, a, b = top_union(la, la[:, ::-1].copy(), k=3)
    assert 7 in ids[0] and 22 in ids[0] and (ids[0] >= 0).sum() <= 6 and a.shape == ids.shape
    pts = [SweepPoint(n, "preset", size, 0, kld, 0, 0, 1, 10) for n, size, kld in
           (("big", 100, 0.001), ("mid", 60, 0.05), ("bad", 70, 0.2), ("small", 40, 0.5))]
    assert [pts[i].name for i in pareto_front(pts)] == ["small", "mid", "big"]
    assert rec.top(0, "b")[0][0] in rec.vocab.values()


def test_compare_view_draws_everything(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(1200, 900)
    view.set_model(synthetic_model_record(n_layers=3))
    assert view.heads.layer.maximum() == 2 and view.heads.head.maximum() == 3 and view.text.toPlainText() == eval_text()
    view.set_overrides(OverrideSpec(None, ("attn_v=Q8_0",)))
    assert "attn_v=Q8_0" in view.source.itemText(0)
    view.b_cache.setCurrentText("Q8_0")
    with qtbot.waitSignal(view.compare_requested, timeout=60_000) as sig:
        view.run.click()
    opts = sig.args[0]
    assert isinstance(opts, CompareOptions) and opts.b_cache == "Q8_0" and opts.b_source == "overrides"
    view.set_progress(TaskProgress("compare", "running A", 0.4))
    assert not view.run.isEnabled() and view.progress.value() == 400
    rec = synthetic_record()
    view.set_record(rec)
    assert view.run.isEnabled()
    assert view.summary.value("KLD mean") == f"{rec.stats.kld_mean:.6f}" and view.summary.value("tokens") == "8"
    assert view.summary.value("KV cache A / B") == "F32 / Q8_0" and "same top token" in view.status.text()
    worst = int(rec.kld[:-1].argmax())
    assert view.selected == worst and view.strip.cursor.value() == worst
    assert view.kld_text.toHtml().count("t:") >= len(TEXTS)
    view.kld_text.token_clicked.emit(3)  # as a click on a token of the text
    assert view.selected == 3 and "“·sat”" in view.bars.header.text() and "“·on”" in view.bars.header.text()
    ticks = view.bars.plots[1][0].getAxis("left")._tickLevels[0]
    assert len(ticks) == 10
    view.strip.token_clicked.emit(5)
    assert view.selected == 5
    xs, ys = view.layers.rel.getData()
    np.testing.assert_allclose(xs, [0, 1, 2])
    np.testing.assert_allclose(10 ** np.asarray(ys), rec.rel_l2, rtol=1e-5)  # drawn on a log axis


def test_heads_side_by_side_and_requests(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.set_model(synthetic_model_record(n_layers=3))
    pair = head_pair()
    view.set_heads(pair)
    img_a, img_b, img_d = (im.image for im in view.heads.images)
    assert img_a.shape == (len(TEXTS), len(TEXTS) - 1)  # key 0 hidden by default
    d = pair.difference()[:, 1:]
    np.testing.assert_allclose(img_d[np.isfinite(d)], d[np.isfinite(d)], atol=1e-6)
    assert np.isnan(img_d[0, 3])  # the first query cannot see key 4
    lo, hi = view.heads.diff_bar.levels()
    assert lo == -hi and hi > 0
    view.heads.hide_sink.setChecked(False)
    assert view.heads.images[0].image.shape == (len(TEXTS), len(TEXTS))
    with qtbot.waitSignal(view.head_requested, timeout=60_000) as sig:
        view.heads.head.setValue(3)
    assert sig.args == [1, 3]


def test_sweep_chart_points_front_and_cancel(qtbot) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(1400, 900)
    view.show()
    view.set_model(synthetic_model_record())
    with qtbot.waitSignal(view.sweep_requested, timeout=60_000) as sig:
        view.sweep.run.click()
    assert sig.args == [eval_text()]
    view.sweep_started()
    assert not view.sweep.run.isEnabled() and view.sweep.cancel.isEnabled()
    view.set_progress(TaskProgress("sweep", "Q8_0: requantizing", 0.25))
    assert view.sweep.progress.value() == 250
    for name, size, kld, kind in (("file + attn_v=Q8_0", 30 << 20, 0.0, "overrides"), ("Q8_0", 40 << 20, 1e-3, "preset"),
                                  ("Q4_0", 20 << 20, 0.3, "preset"), ("Q5_0", 25 << 20, 0.4, "preset")):
        view.add_sweep_point(SweepPoint(name, kind, size, 4.0, kld, kld * 3, 90.0, 1.1, 100))
    xs, _ = view.sweep.scatter.getData()
    assert len(xs) == 3 and len(view.sweep.special.getData()[0]) == 1 and len(view.sweep.labels) == 4  # room for all
    assert "Q5_0" in view.sweep.scatter.points()[2].data().name and "KLD mean 0.40000" in view.sweep.labels[-1].toolTip()
    assert len(view.sweep.front.getData()[0]) == 2  # Q4_0 then the overrides (KLD 0 at 30 MiB beats Q8_0)
    with qtbot.waitSignal(view.sweep_cancel_requested, timeout=60_000):
        view.sweep.cancel.click()
    view.sweep_finished(SweepDone(4, True))
    assert view.sweep.run.isEnabled() and "cancelled" in view.sweep.status.text()
    assert "Pareto front: Q4_0, file + attn_v=Q8_0" in view.sweep.status.text()
    view.failed("compare", "comparison cancelled")
    assert "cancelled" in view.status.text() and view.run.isEnabled()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 32 so the Q8_0 / Q4_0 KV caches fit; rows of 128 make the k-quants fall back as llama.cpp does
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", dim=128, n_heads=4, n_kv_heads=2,
                           hidden=256, n_ctx=256)


def test_window_compare_apply_and_sweep_on_a_tiny_model(qtbot, data_dir: Path, tiny: Path) -> None:
    from app.main_window import MainWindow

    w = MainWindow(load=False)
    qtbot.addWidget(w)
    w.show()
    w.open_model(str(tiny))
    qtbot.waitUntil(lambda: w.state.model is not None and w.quant_bridge.file_record is not None, timeout=60_000)
    view, editor = w.compare_view, w.quant_bridge.editor
    assert editor is not None and editor.record.path == str(tiny)
    editor.add_rule(".*=Q4_0")
    assert "Q4_0" in view.source.itemText(0)
    view.text.setPlainText("the cat sat on the mat and the dog sat on the log " * 4)
    view.b_cache.setCurrentText("Q4_0")
    view.run.click()
    qtbot.waitUntil(lambda: view.record is not None and view.heads.pair is not None, timeout=60_000)
    rec = view.record
    assert rec.b_label == "file + .*=Q4_0" and rec.b_cache == "Q4_0" and rec.stats.kld_mean > 0
    assert rec.b_bytes < rec.a_bytes and view.summary.rowCount() > 10
    view.heads.layer.setValue(1)
    qtbot.waitUntil(lambda: view.heads.pair.layer == 1, timeout=30_000)
    view.source.setCurrentIndex(view.source.findData("file"))  # B: the file itself with the same F32 cache: identical
    view.b_cache.setCurrentText("F32")
    view.run.click()
    qtbot.waitUntil(lambda: view.record is not rec, timeout=60_000)
    assert view.record.stats.kld_max < 1e-9 and view.record.b_label == "file"
    editor.apply.click()
    qtbot.waitUntil(lambda: editor.busy is None and not editor.applied.empty, timeout=60_000)
    assert {t.type_name for t in w.state.model_record.tensors if t.name.endswith("attn_q.weight")} == {"Q4_0"}
    assert "Q4_0" in editor.in_memory.text() and "Done" in editor.message.text()
    editor.reset.click()
    qtbot.waitUntil(lambda: editor.busy is None and editor.applied.empty, timeout=60_000)
    assert {t.type_name for t in w.state.model_record.tensors if t.name.endswith("attn_q.weight")} == {"F32"}
    view.sweep.run.click()
    qtbot.waitUntil(lambda: view.sweep.run.isEnabled(), timeout=120_000)
    names = [p.name for p in view.sweep.points]
    assert names[0] == "file + .*=Q4_0" and "Q8_0" in names and "Q2_K" in names, view.sweep.status.text()
    view.sweep.run.click()
    w.engine.cancel_task("sweep")
    qtbot.waitUntil(lambda: view.sweep.run.isEnabled(), timeout=180_000)  # a liveness bound, not a timing
    assert "cancelled" in view.sweep.status.text() or "stopped" in view.sweep.status.text()
    w.close()
    assert w.engine.threads() == []


@pytest.mark.slow
def test_real_smollm2_q4_0_against_the_file_and_q8_0_cache() -> None:
    from app.jobs.compare import CompareWorkspace, compare_job

    path = model_path(SMOLLM2_FILE)
    if path is None:
        pytest.skip(f"model {SMOLLM2_FILE} not found")
    from engine.model import load_model

    loaded: list = []  # every model the workspace loads (each job closes its own when it ends)
    ws = CompareWorkspace(lambda p, **kw: loaded.append(load_model(p, **kw)) or loaded[-1])
    try:
        opts = CompareOptions(text=eval_text(), max_tokens=200, layer=3, head=1)
        items = list(compare_job(ws, str(path), opts, OverrideSpec("Q4_0"), threading.Event(), lambda _: None))
        rec, pair = items[-2], items[-1]
        assert rec.n_tokens == 200 and rec.n_layers == 30
        # B names the preset and what really happened: the Q6_K it gives the output falls back (576-wide rows)
        assert rec.b_label == "Q4_0: 1 tensor fell back to Q8_0 (rows of 576 are not a multiple of 256)"
        assert 0.01 < rec.stats.kld_mean < 2 and 40 < rec.stats.same_top_pct < 100 and rec.stats.ppl_ratio > 1
        assert rec.rel_l2[-1] > rec.rel_l2[0] and pair.a.weights.shape == (200, 200) and (pair.layer, pair.head) == (3, 1)
        cache = dataclasses.replace(opts, b_source="file", b_cache="Q8_0")
        rec8 = list(compare_job(ws, str(path), cache, None, threading.Event(), lambda _: None))[-2]
        assert 0 < rec8.stats.kld_mean < rec.stats.kld_mean and rec8.stats.same_top_pct > 90
        numerics = dataclasses.replace(opts, b_source="numerics")
        recn = list(compare_job(ws, str(path), numerics, None, threading.Event(), lambda _: None))[-2]
        # the same weights in float32 numerics: what ggml's 8-bit activations change, small beside Q4_0's requantization
        assert recn.b_label == "file, float32 numerics" and [m.numerics for m in loaded[-2:]] == ["ggml", "float32"]
        assert 0 < recn.stats.kld_mean < rec.stats.kld_mean and recn.stats.same_top_pct > 85
        assert len(recn.rel_l2) == 30 and max(recn.rel_l2) > 0
    finally:
        ws.close()
