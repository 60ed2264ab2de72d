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


def test_the_late_kernels_are_taken_up_when_no_job_runs(qtbot, monkeypatch) -> None:
    """A first start: once the late kernels are ready, the Engine runs warmup.finish_late on the loaded model, on a
    thread of its own, only after a pause with no other job running, and once."""
    from engine.runtime import warmup  # noqa: PLC0415

    class Net:
        _late_pending = True

    class Model:
        net = Net()

    finished: list[str] = []

    def finish(net) -> bool:
        finished.append(threading.current_thread().name)
        net._late_pending = False
        return True

    monkeypatch.setattr(warmup, "late_pending", lambda net: net._late_pending)
    monkeypatch.setattr(warmup, "finish_late", finish)
    engine = Engine()
    release = threading.Event()
    try:
        engine.session.model = Model()
        engine.run_task("compare", "compare", lambda emit, cancel: release.wait(300))  # until released below
        qtbot.wait(3 * 1000)
        assert finished == []  # a comparison runs: the model's late paths wait for it
        release.set()
        qtbot.waitUntil(lambda: finished != [], timeout=180_000)  # after a pause of LATE_IDLE_S (a hang guard)
        qtbot.wait(2 * 1000)
        assert len(finished) == 1 and finished[0] != threading.current_thread().name
    finally:
        release.set()
        engine.session.model = None
        assert engine.shutdown()


def test_a_workspace_job_started_before_the_late_kernels_keeps_the_early_paths(monkeypatch) -> None:
    """Compare, the sweep and the mix search run under early_paths: late kernels that become ready half way through
    are not taken up by the job's models (their code would stay in the process, counted in the job's memory)."""
    from app.jobs.workspace import early_paths  # noqa: PLC0415
    from engine.kernels import precompile  # noqa: PLC0415

    class Running:
        started = 0.0
        finished = False

        def done(self) -> bool:
            return self.finished

    helper = Running()
    monkeypatch.setattr(precompile, "_late", [helper])
    with early_paths():
        helper.finished = True  # the late compile ends half way through the job
        assert precompile.late_ready() is False  # the job's thread keeps the paths it started with
    assert precompile.late_ready() is True
    with early_paths():  # a job started afterwards takes the late paths
        assert precompile.late_ready() is True
