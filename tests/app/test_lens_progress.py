"""A lens job that reads a chat (runs its tokens first) reports its progress and can be stopped: the job level (no
Qt: app.jobs.lens), the engine's cancel_lens, and the status bar's progress with Stop."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.jobs.lens import InContext, LensProgress, LensResult, in_context, lens_job
from app.jobs.session import Session
from app.records.reply import GenerationRequest
from app.state import AppState
from app.views.status import LENS_SHOW_MS, StatusPanel
from engine.errors import LensError
from engine.model import load_model
from tests.tiny_models import make_tiny_llama

TEXT = "the house is wonderful and the garden is green; " * 12  # several prefill chunks of the lens's read


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Session:
    s = Session(context_limit=1024)
    s.model = load_model(make_tiny_llama(tmp_path_factory.mktemp("progress") / "tiny.gguf", n_ctx=1024))
    s.fresh_cache()
    return s


def _read(session: Session, cancel: threading.Event) -> tuple[list[object], object]:
    context = GenerationRequest(messages=(("user", TEXT),), plain=True)
    compute = in_context(lambda model, recorder, cache, texts: cache.length, context, {})
    items: list[object] = []
    job = lens_job(session, "attention", compute, items.append, cancel)
    try:
        result = next(job)
    except LensError as exc:
        return items, exc
    return items, result


def test_reading_a_chat_reports_progress(session: Session) -> None:
    session.fresh_cache()
    items, result = _read(session, threading.Event())
    fractions = [p.fraction for p in items if isinstance(p, LensProgress)]
    assert len(fractions) >= 2 and fractions == sorted(fractions) and fractions[-1] == 1.0
    assert isinstance(result, LensResult) and isinstance(result.record, InContext)
    assert result.record.record == session.cache.length > 64  # the compute ran on the whole chat


def test_a_stopped_read_says_so_and_computes_nothing(session: Session) -> None:
    session.fresh_cache()
    stop = threading.Event()
    stop.set()
    _items, result = _read(session, stop)
    assert isinstance(result, LensError) and "stopped" in str(result)


def test_the_status_bar_shows_a_long_read_with_stop(qtbot) -> None:
    panel = StatusPanel(AppState())
    qtbot.addWidget(panel)
    panel.show()
    stops: list[int] = []
    panel.stop_lens.connect(lambda: stops.append(1))
    panel.set_lens_progress(LensProgress("attention", "reading the chat: 64 of 600 tokens", 64 / 600))
    assert not panel.lens_stop.isVisible()  # a short job never shows
    qtbot.waitUntil(panel.lens_stop.isVisible, timeout=LENS_SHOW_MS * 20)
    assert panel.lens_bar.value() == int(64 / 600 * 1000) and "64 of 600" in panel.lens_label.text()
    panel.lens_stop.click()
    assert stops == [1]
    panel.set_lens_progress(None)
    assert not panel.lens_stop.isVisible() and not panel.lens_bar.isVisible()


def test_the_engine_stops_its_running_lens_job(qtbot, tmp_path: Path) -> None:
    from app.workers.engine import Engine  # noqa: PLC0415

    engine = Engine()
    started, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def compute(model, recorder, cache, texts):  # noqa: ANN001, ANN202 - waits until the test stops it
        from app.jobs.lens import _JOB  # noqa: PLC0415

        started.set()
        seen.append(_JOB.cancel.wait(60))
        release.set()
        return None

    engine.session.model = load_model(make_tiny_llama(tmp_path / "t.gguf"))
    engine.session.fresh_cache()
    engine.request_lens("attention", compute)
    engine.request_lens("roles", compute)  # waiting behind it: dropped by the stop
    assert started.wait(60)
    engine.cancel_lens()
    assert release.wait(60) and seen == [True]
    qtbot.waitUntil(lambda: engine._lens is None, timeout=60_000)
    assert not engine._lens_pending and seen == [True]
    engine.shutdown()


def test_the_induction_probe_reports_progress_and_stops(session: Session) -> None:
    from app.jobs.lens_computes import roles  # noqa: PLC0415

    items: list[object] = []
    result = next(lens_job(session, "roles", roles("probe"), items.append, threading.Event()))
    assert result.record.source == "probe" and any(isinstance(p, LensProgress) and "probe" in p.what for p in items)
    stop = threading.Event()
    stop.set()
    with pytest.raises(LensError, match="probe was stopped"):
        next(lens_job(session, "roles", roles("probe"), items.append, stop))
