"""Saver: the thread that writes chats and settings off the GUI thread."""
from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import Callable

from PySide6.QtCore import QObject, QThread, Signal

log = logging.getLogger(__name__)


class Saver(QThread):
    """Writes files off the GUI thread; the newest write per key wins; `flush` waits for pending writes.

    A write that fails (read-only folder, disk full) is kept and tried again with the next submit and at `stop`,
    unless a newer write for its key replaces it, so nothing is lost once the folder is writable again.
    """

    failed = Signal(str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.setObjectName("saver")
        self._cond = threading.Condition()
        self._pending: dict[str, Callable[[], None]] = {}
        self._failed: dict[str, Callable[[], None]] = {}  # key -> its newest write that failed
        self._busy = False
        self._stop = False

    def submit(self, key: str, write: Callable[[], None]) -> None:
        with self._cond:
            self._pending[key] = write
            self._retry_failed()
            self._cond.notify_all()
        if not self.isRunning() and not self._stop:
            self.start()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every submitted write has run; False on timeout."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._pending or self._busy:
                left = end - time.monotonic()
                if left <= 0 or not self.isRunning():
                    break
                self._cond.wait(left)
            rest = self._pending if not self.isRunning() else {}
            self._pending = {} if rest else self._pending
        for key, write in rest.items():  # thread not running: write here rather than lose data
            self._write(write, key)
        return not self._pending and not self._busy

    def _retry_failed(self) -> None:
        """Queue the writes that failed again (call under the condition)."""
        for key, write in self._failed.items():
            self._pending.setdefault(key, write)
        self._failed.clear()

    def stop(self) -> None:
        with self._cond:
            self._retry_failed()
            self._cond.notify_all()
        self.flush()  # writes on this thread if the saver thread is not running
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.wait(5000)

    def run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                if not self._pending and self._stop:
                    return
                key = next(iter(self._pending))
                write = self._pending.pop(key)
                self._busy = True
            self._write(write, key)
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _write(self, write: Callable[[], None], key: str) -> None:
        try:
            write()
        except OSError as exc:
            self._keep_failed(key, write)
            self.failed.emit(f"could not save: {exc.strerror or exc} ({getattr(exc, 'filename', '') or ''}). "
                             "Nothing is lost: the app keeps it and saves again with the next change or when it closes.")
        except Exception as exc:  # noqa: BLE001 - reported, never raised into the GUI
            log.error("save failed:\n%s", traceback.format_exc())
            self.failed.emit(f"could not save: {exc}")
        else:
            with self._cond:
                self._failed.pop(key, None)

    def _keep_failed(self, key: str, write: Callable[[], None]) -> None:
        with self._cond:
            if key not in self._pending:  # a newer write for the key replaces this one
                self._failed[key] = write
