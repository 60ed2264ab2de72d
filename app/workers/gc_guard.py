"""Python's cyclic garbage collector on the GUI thread only, while job threads may run.

A collection runs in whichever thread allocates past gc's threshold. When that is a job thread and a cycle it
frees holds a Qt object made on the GUI thread, the object's C++ destructor runs on the job thread: it takes the
object's mutex, then waits for the GIL, while the GUI thread (holding the GIL) waits for that same mutex to delete
a widget: a frozen window. The suite hit it in CI while a preset sweep compiled kernels on its job thread. So while
an Engine lives, automatic collection is off and a GUI-thread timer collects instead: the young generations every
tick, everything every FULL_EVERY ticks. The last Engine to shut down turns automatic collection back on.

A loaded model, its tokenizer and the window are a few hundred thousand long-lived objects: a full collection
over them pauses the GUI for 0.1-0.3 s. So a moment after a model loads (the Engine asks) the young generations
are collected and everything left is frozen (gc.freeze, which costs next to nothing): the regular full
collections then walk only what was made since. Cycles among frozen objects that have become garbage wait for
a thaw: every THAW_EVERY ticks, once no job runs (a reply streaming is never paused by it), one collection of
everything, frozen objects included, and what survives is frozen again; and when the last collector stops.

When a job ends (a comparison, a sweep, an Apply, a patching map, a reply: its Runner calls job_ended), the first tick
with no job thread left collects
everything not frozen and hands the C heap's free pages back (engine.kernels.pages.trim_heap, glibc's malloc_trim),
and the libraries' clean code pages that the job touched (release_libraries: a first Compare loading or compiling
kernels touches ~50 MiB of LLVM's, which stay resident until the system needs them):
a job's temporaries (chunks of logits, its models' arrays) are freed by then, but glibc keeps their pages in its
arenas and a cycle among them waits for the next full collection; so the app's memory comes back when each job ends.
"""
from __future__ import annotations

import gc
import threading
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer

from engine.kernels.pages import release_libraries, trim_heap

TICK_MS = 500
FULL_EVERY = 20  # a full collection (of what is not frozen) every 10 s
THAW_EVERY = 600  # a collection of everything, frozen objects too, every 5 min when idle
FREEZE_DELAY = 4  # ticks after freeze_soon (a model just loaded: its records are still being built)

_active: list[GuiThreadCollector] = []
_ended = threading.Event()  # a job ended since the last give_back
_enabled_before: list[bool] = []


class GuiThreadCollector(QObject):
    """While alive (until `stop`), the process's cyclic collections run on this object's (the GUI) thread.

    idle: whether nothing runs that a pause would stall (the thaw waits for it)."""

    def __init__(self, parent: QObject | None = None, tick_ms: int = TICK_MS,
                 idle: Callable[[], bool] = lambda: True):
        super().__init__(parent)
        if not _active:
            _enabled_before[:] = [gc.isenabled()]
            gc.disable()
        _active.append(self)
        self.ticks = 0
        self.idle = idle
        self._freeze_at = -1
        self._thaw_due = False
        self._busy = False  # a job ran at the last tick
        self._froze_busy = False  # a freeze happened while a job ran: its objects (models) wait for a thaw
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.collect)
        self._timer.start(tick_ms)

    def collect(self) -> int:
        """One tick: collect the young generations (every FULL_EVERY-th tick all that is not frozen; at a
        thaw, when idle, everything; once the last job has ended, give_back); returns what was freed."""
        self.ticks += 1
        idle = self.idle()
        if (self._busy or _ended.is_set()) and idle:  # the last job just ended (and its thread is gone)
            self._busy = False
            _ended.clear()
            return self.give_back()
        self._busy = not idle
        if self.ticks % THAW_EVERY == 0:
            self._thaw_due = True
        if self._thaw_due and idle:
            self._thaw_due = False
            return self.thaw()
        if self.ticks == self._freeze_at:
            self._froze_busy = self._froze_busy or not idle
            return self.freeze()
        return gc.collect(2 if self.ticks % FULL_EVERY == 0 else 1)

    def give_back(self) -> int:
        """Collect everything not frozen (everything, when a freeze caught a job's objects: its models are cycles)
        and give the C heap's free pages back to the system; returns what was freed."""
        if self._froze_busy:
            self._froze_busy = False
            freed = self.thaw()
        else:
            freed = gc.collect(2)
        trim_heap()
        release_libraries()  # LLVM's code pages that a job's kernel loads touched (~50 MiB a load; clean, on disk)
        return freed

    def freeze(self) -> int:
        """Collect the young generations and freeze what is left (cheap); returns what was freed."""
        freed = gc.collect(1)
        gc.freeze()
        return freed

    def thaw(self) -> int:
        """Collect everything, the frozen objects included, and freeze what survives; returns what was freed."""
        gc.unfreeze()
        freed = gc.collect(2)
        gc.freeze()
        return freed

    def freeze_soon(self, delay_ticks: int = FREEZE_DELAY) -> None:
        """Freeze after delay_ticks ticks (after a model load, once the window has built what it shows)."""
        self._freeze_at = self.ticks + max(1, delay_ticks)

    def stop(self) -> None:
        """No more ticks; the last collector to stop restores automatic collection as it was."""
        self._timer.stop()
        if self in _active:
            _active.remove(self)
            if not _active:
                gc.unfreeze()  # frozen garbage is collectable again
                if _enabled_before and _enabled_before[0]:
                    gc.enable()


def job_ended() -> None:
    """A job's thread is about to end (any thread may call it): the next idle tick gives its memory back."""
    _ended.set()


def active() -> bool:
    """Whether collections are held on the GUI thread now."""
    return bool(_active)
