"""Python's cyclic garbage collector on the GUI thread only, while job threads may run.

A collection runs in whichever thread allocates past gc's threshold. When that is a job thread and a cycle it
frees holds a Qt object made on the GUI thread, the object's C++ destructor runs on the job thread: it takes the
object's mutex, then waits for the GIL, while the GUI thread (holding the GIL) waits for that same mutex to delete
a widget: a frozen window. The suite hit it in CI while a preset sweep compiled kernels on its job thread. So while
an Engine lives, automatic collection is off and a GUI-thread timer collects instead: the young generations every
tick, everything every FULL_EVERY ticks. The last Engine to shut down turns automatic collection back on.
"""
from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

TICK_MS = 500
FULL_EVERY = 20  # a full collection every 10 s

_active: list["GuiThreadCollector"] = []
_enabled_before: list[bool] = []


class GuiThreadCollector(QObject):
    """While alive (until `stop`), the process's cyclic collections run on this object's (the GUI) thread."""

    def __init__(self, parent: QObject | None = None, tick_ms: int = TICK_MS):
        super().__init__(parent)
        if not _active:
            _enabled_before[:] = [gc.isenabled()]
            gc.disable()
        _active.append(self)
        self.ticks = 0
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.collect)
        self._timer.start(tick_ms)

    def collect(self) -> int:
        """One tick: collect the young generations (every FULL_EVERY-th tick, all of them); returns what was freed."""
        self.ticks += 1
        return gc.collect(2 if self.ticks % FULL_EVERY == 0 else 1)

    def stop(self) -> None:
        """No more ticks; the last collector to stop restores automatic collection as it was."""
        self._timer.stop()
        if self in _active:
            _active.remove(self)
            if not _active and _enabled_before and _enabled_before[0]:
                gc.enable()


def active() -> bool:
    """Whether collections are held on the GUI thread now."""
    return bool(_active)
