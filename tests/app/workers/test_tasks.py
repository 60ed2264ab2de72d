"""Task lanes of the worker Engine: a job cancelled before it started still tells its view it ended."""
from __future__ import annotations

import threading

from app.workers.engine import Engine


def test_a_waiting_job_cancelled_reports_that_it_stopped(qtbot) -> None:
    engine = Engine()
    release, ran = threading.Event(), []
    failed: list[tuple[str, str]] = []
    engine.task_failed.connect(lambda kind, message: failed.append((kind, message)))

    def first(emit, cancel):
        release.wait(10)  # a sweep still ending: the lane is busy
        return None

    def second(emit, cancel):
        ran.append(True)

    try:
        engine.run_task("sweep", "sweep-old", first)
        qtbot.waitUntil(lambda: engine.task_running("sweep") == "sweep-old", timeout=10_000)
        engine.run_task("sweep", "sweep", second)  # asked again while the lane is busy: it waits
        engine.cancel_task("sweep")
        assert ("sweep", "cancelled before it started") in failed  # the view hears of it and re-enables Run
    finally:
        release.set()
        qtbot.waitUntil(lambda: engine.task_running("sweep") is None, timeout=10_000)
    assert not ran  # the cancelled job never runs
    engine.shutdown()
