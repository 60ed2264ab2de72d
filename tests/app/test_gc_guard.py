"""gc_guard: while an Engine lives, cyclic garbage is collected on the GUI thread, never on a job thread."""
from __future__ import annotations

import gc
import threading

from app.workers import gc_guard
from app.workers.engine import Engine


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_an_engine_holds_collections_on_the_gui_thread_until_it_shuts_down(qtbot) -> None:
    was = gc.isenabled()
    engine = Engine()
    try:
        assert gc_guard.active() and not gc.isenabled()
        freed_on: list[str] = []

        class Tracked(_Cycle):
            def __del__(self) -> None:
                freed_on.append(threading.current_thread().name)

        def make_garbage() -> None:  # a job thread allocating far past gc's thresholds collects nothing
            Tracked()
            for _ in range(50_000):
                _Cycle()

        worker = threading.Thread(target=make_garbage, name="job")
        worker.start()
        worker.join()
        assert freed_on == []
        qtbot.waitUntil(lambda: freed_on != [], timeout=3 * gc_guard.TICK_MS * gc_guard.FULL_EVERY)
        assert freed_on == [threading.current_thread().name]  # the GUI thread's timer freed it
    finally:
        assert engine.shutdown()
    assert gc.isenabled() == was and not gc_guard.active()


def test_two_engines_the_last_one_restores_collection(qtbot) -> None:
    was = gc.isenabled()
    a, b = Engine(), Engine()
    assert a.shutdown() and not gc.isenabled()
    assert b.shutdown() and gc.isenabled() == was


def test_freeze_keeps_long_lived_objects_out_and_the_idle_thaw_frees_frozen_garbage(qtbot, monkeypatch) -> None:
    engine = Engine()
    collector = engine._gc
    try:
        freed: list[str] = []

        class Tracked(_Cycle):
            def __del__(self) -> None:
                freed.append(threading.current_thread().name)

        keep = [_Cycle() for _ in range(1000)]
        doomed = Tracked()
        collector.freeze_soon(delay_ticks=1)  # what the engine asks after a model load
        qtbot.waitUntil(lambda: gc.get_freeze_count() >= len(keep), timeout=10 * gc_guard.TICK_MS)
        del doomed  # garbage now, but frozen: the regular full collections leave it
        gc.collect(2)
        assert freed == []
        busy = [True]
        collector.idle = lambda: not busy[0]
        monkeypatch.setattr(gc_guard, "THAW_EVERY", 2)  # a thaw is due every second tick
        qtbot.wait(4 * gc_guard.TICK_MS)
        assert freed == []  # a job runs: the thaw waits
        busy[0] = False
        qtbot.waitUntil(lambda: freed != [], timeout=10 * gc_guard.TICK_MS)
        assert freed == [threading.current_thread().name] and gc.get_freeze_count() >= len(keep)
    finally:
        assert engine.shutdown()
    assert gc.get_freeze_count() == 0  # the last collector unfreezes everything


def test_a_job_ending_gives_the_heap_and_the_libraries_code_pages_back(qtbot, monkeypatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(gc_guard, "trim_heap", lambda: calls.append("heap"))
    monkeypatch.setattr(gc_guard, "release_libraries", lambda: calls.append("libraries") or 0)
    engine = Engine()
    try:
        qtbot.wait(2 * gc_guard.TICK_MS)
        calls.clear()
        gc_guard.job_ended()
        qtbot.waitUntil(lambda: "libraries" in calls, timeout=10 * gc_guard.TICK_MS)
        assert calls[:2] == ["heap", "libraries"]
    finally:
        assert engine.shutdown()
