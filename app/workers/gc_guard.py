"""Python's cyclic garbage collector on the GUI thread only, while job threads may run.

A collection runs in whichever thread allocates past gc's threshold. When that is a job thread and a cycle it
frees holds a Qt object made on the GUI thread, the object's C++ destructor runs on the job thread: it takes the
object's mutex, then waits for the GIL, while the GUI thread (holding the GIL) waits for that same mutex to delete
a widget: a frozen window. The suite hit it in CI while a preset sweep compiled kernels on its job thread. So while
an Engine lives, automatic collection is off and a GUI-thread timer collects instead: the young generations every
tick, everything every FULL_EVERY ticks. The last Engine to shut down turns automatic collection back on.

A loaded model, its tokenizer and the window are a few hundred thousand long-lived objects: a full collection
over them pauses the GUI for 0.1-0.3 s. So a while after a model loads (the Engine asks) and every REFREEZE_EVERY
ticks, one full collection runs and what survives it is frozen (gc.freeze: left out of later collections); the
regular full collections then only walk what was made since. Cycles among frozen objects that become garbage
wait for the next refreeze, or for the last collector to stop, which unfreezes them.
"""
from __future__ import annotations

import gc

from PySide6.QtCore import QObject, QTimer

TICK_MS = 500
FULL_EVERY = 20  # a full collection every 10 s
REFREEZE_EVERY = 600  # unfreeze, collect everything and freeze the survivors every 5 min
REFREEZE_DELAY = 4  # ticks after refreeze_soon (a model just loaded: its records are still being built)

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
        self._refreeze_at = -1
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.collect)
        self._timer.start(tick_ms)

    def collect(self) -> int:
        """One tick: collect the young generations (every FULL_EVERY-th tick, all of them; at a refreeze, the
        frozen ones too); returns what was freed."""
        self.ticks += 1
        if self.ticks == self._refreeze_at or self.ticks % REFREEZE_EVERY == 0:
            return self.refreeze()
        return gc.collect(2 if self.ticks % FULL_EVERY == 0 else 1)

    def refreeze(self) -> int:
        """Collect everything, the frozen objects included, and freeze what survives; returns what was freed."""
        gc.unfreeze()
        freed = gc.collect(2)
        gc.freeze()
        return freed

    def refreeze_soon(self, delay_ticks: int = REFREEZE_DELAY) -> None:
        """Refreeze after delay_ticks ticks (after a model load, once the window has built what it shows)."""
        self._refreeze_at = self.ticks + max(1, delay_ticks)

    def stop(self) -> None:
        """No more ticks; the last collector to stop restores automatic collection as it was."""
        self._timer.stop()
        if self in _active:
            _active.remove(self)
            if not _active:
                gc.unfreeze()  # frozen garbage is collectable again
                if _enabled_before and _enabled_before[0]:
                    gc.enable()


def active() -> bool:
    """Whether collections are held on the GUI thread now."""
    return bool(_active)
