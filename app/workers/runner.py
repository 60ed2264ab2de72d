"""Runner: one job on its own QThread; what the job yields comes back to the GUI thread through signals.

Jobs are plain generators (app/jobs/); `Runner` runs one, re-emitting each item it yields, then its return
value, or a message for the user when it fails.
"""
from __future__ import annotations

import logging
import threading
import traceback
from typing import Callable, Iterator

from PySide6.QtCore import QObject, QThread, Signal

from app.jobs.session import Emit
from app.workers.gc_guard import job_ended
from engine.errors import LensError

log = logging.getLogger(__name__)

Job = Callable[[Emit], Iterator[object]]
TaskJob = Callable[[Emit, threading.Event], Iterator[object]]  # job(emit, cancel)


def user_message(exc: BaseException) -> str:
    """What to tell the user about an exception from a job."""
    if isinstance(exc, LensError):
        return str(exc)
    if isinstance(exc, MemoryError):
        return "ran out of memory; close other programs or use a smaller context"
    return f"unexpected error: {type(exc).__name__}: {exc}"


class Runner(QThread):
    """Runs one job on its own thread: `yielded` per item, then `done` with the return value, or `failed`."""

    yielded = Signal(object, object)  # (tag, item)
    failed = Signal(object, str)  # (tag, message for the user)
    done = Signal(object, object)  # (tag, return value)

    def __init__(self, job: Job, name: str, tag: object = None, parent: QObject | None = None):
        super().__init__(parent)
        self.job = job
        self.tag = tag
        self.cancel = threading.Event()
        self.setObjectName(name)

    def emit(self, item: object) -> None:
        """Send an item to the GUI thread (also from callbacks inside the job)."""
        self.yielded.emit(self.tag, item)

    def run(self) -> None:
        try:
            gen = self.job(self.emit)
            while True:
                try:
                    item = next(gen)
                except StopIteration as stop:
                    self.done.emit(self.tag, stop.value)
                    return
                self.emit(item)
        except BaseException as exc:  # a job must never take the app down
            if not isinstance(exc, LensError):
                log.error("%s failed:\n%s", self.objectName(), traceback.format_exc())
            self.failed.emit(self.tag, user_message(exc))
        finally:
            job_ended()  # the GUI thread's collector gives the job's memory back once its thread is gone
