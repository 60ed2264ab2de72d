"""The only place threads start: fetch, load, generate and lens jobs, and the chat saver.

Jobs are plain generators run by `Runner` on a QThread; what they yield comes back through signals.
The loaded model, its KV cache and the Recorder live in `Session` and are only touched by jobs, under
`Session.lock`; the generate job releases the lock between tokens so lens jobs can run in between.
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from PySide6.QtCore import QObject, QThread, Signal

from app.blas import limit_blas_threads, restore_blas_threads
from engine.errors import LensError

log = logging.getLogger(__name__)

Emit = Callable[[object], None]
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


@dataclass
class Session:
    """The live engine objects of the loaded model; only jobs touch them, under `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    model: Any = None
    cache: Any = None
    recorder: Any = None
    context_limit: int = 4096
    cache_type: str = "F32"  # the type the next fresh cache holds (F32 | F16 | Q8_0 | Q4_0), set from the GUI
    backend: str = "auto"  # the array backend the next load uses (auto | numpy | cupy), set from the GUI
    generating: threading.Event = field(default_factory=threading.Event)
    requantizer: Any = None  # engine.requantize.Requantizer of `model`, made by the first requantize job

    def n_ctx(self) -> int:
        return max(16, min(int(self.model.args.n_ctx), self.context_limit)) if self.model else 0

    def fresh_cache(self) -> None:
        """A new cache and recorder sized by the current context limit (call under lock)."""
        from engine.observe.recorder import Recorder  # noqa: PLC0415

        self.cache = self.model.new_cache(self.n_ctx(), self.cache_type)
        self.recorder = Recorder(capture_q=True)

    def token_texts(self) -> list[str]:
        tok = self.model.tokenizer
        return [tok.token_text(t) for t in self.cache.tokens]


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


class Engine(QObject):
    """The GUI's handle on the engine: starts jobs on threads and re-emits their records as signals."""

    load_progress = Signal(object)  # jobs.LoadProgress, or None when loading ended
    loaded = Signal(object)  # jobs.Loaded
    load_failed = Signal(str)
    load_cancelled = Signal(str)  # the user cancelled (or a newer open superseded) a fetch or load
    reply_event = Signal(int, object)  # (reply id, Prepared | PrefillProgress | TokenStep | ReplyDone)
    reply_failed = Signal(int, str)
    reply_ended = Signal(int)  # the reply's thread has finished (after ReplyDone or reply_failed)
    lens_ready = Signal(object)  # jobs.LensResult
    lens_failed = Signal(str, str)  # (kind, message)
    task_event = Signal(str, object)  # (task kind, what its job yielded): requantize, compare, sweep...
    task_done = Signal(str, object)  # (task kind, the job's return value)
    task_failed = Signal(str, str)  # (task kind, message for the user)

    def __init__(self, context_limit: int = 4096, parent: QObject | None = None):
        super().__init__(parent)
        self.session = Session(context_limit=context_limit)
        self._runners: set[Runner] = set()
        self._loader: Runner | None = None
        self._reply: Runner | None = None
        self._queue: list[tuple[int, Any]] = []  # replies waiting for the previous one to end
        self._next_id = 0
        self._lens: Runner | None = None
        self._lens_pending: dict[str, Callable[..., Any]] = {}
        self._tasks: dict[str, Runner | None] = {}  # lane -> its running task
        self._task_pending: dict[str, dict[str, TaskJob]] = {}  # lane -> kind -> newest waiting job
        self._closing = False
        self._blas_before = limit_blas_threads()

    # -- threads
    def _start(self, runner: Runner) -> Runner:
        self._runners.add(runner)
        runner.finished.connect(lambda r=runner: self._forget(r))
        runner.start()
        return runner

    def _forget(self, runner: Runner) -> None:
        self._runners.discard(runner)
        for name in ("_loader", "_reply", "_lens"):
            if getattr(self, name) is runner:
                setattr(self, name, None)
        runner.deleteLater()

    def threads(self) -> list[QThread]:
        """Job threads still running."""
        return [r for r in self._runners if r.isRunning()]

    def shutdown(self, timeout_s: float = 15.0) -> bool:
        """Cancel everything and wait for every job thread; False if one is still running at the timeout."""
        self._closing = True
        self.stop()
        self.cancel_load()
        self._lens_pending.clear()
        self._task_pending.clear()
        end = time.monotonic() + timeout_s
        for r in list(self._runners):
            r.cancel.set()
            r.wait(max(0, int((end - time.monotonic()) * 1000)))
        if self._blas_before is not None and not self.threads():
            restore_blas_threads(self._blas_before)
            self._blas_before = None
        return not self.threads()

    # -- models
    def open_model(self, source: str) -> None:
        """Fetch (catalog names not yet installed) and load a model; the current one stays until it succeeds."""
        from app.jobs import fetch_job, load_job  # noqa: PLC0415
        from engine import catalog  # noqa: PLC0415

        self.cancel_load()
        fetch = source in catalog.CATALOG and catalog.is_installed(catalog.CATALOG[source]) is None

        def job(emit: Emit, runner: Runner) -> Iterator[object]:
            path = (yield from fetch_job(source, runner.cancel, emit)) if fetch else source
            return (yield from load_job(self.session, str(path), source, runner.cancel, emit))

        runner = self._runner("load", source, job)
        runner.yielded.connect(lambda _tag, item, r=runner: self.load_progress.emit(item) if r is self._loader else None)
        runner.done.connect(lambda _tag, result: self._on_loaded(result))
        runner.failed.connect(lambda _tag, message, r=runner: self._on_load_failed(r, message))
        self._loader = runner
        self._start(runner)

    def cancel_load(self) -> None:
        if self._loader is not None:
            self._loader.cancel.set()

    @property
    def loading(self) -> bool:
        return self._loader is not None and self._loader.isRunning()

    def _on_loaded(self, result: object) -> None:
        self.load_progress.emit(None)
        self.loaded.emit(result)  # even from a superseded runner: its model is the one in use now

    def _on_load_failed(self, runner: Runner, message: str) -> None:
        if runner is not self._loader:
            return  # a newer open_model replaced this one
        self.load_progress.emit(None)
        if runner.cancel.is_set():
            self.load_cancelled.emit(message)
        else:
            self.load_failed.emit(message)

    @staticmethod
    def _runner(name: str, tag: object, job: Callable[[Emit, Runner], Iterator[object]]) -> Runner:
        runner = Runner(lambda emit: iter(()), name, tag=tag)
        runner.job = lambda emit: job(emit, runner)
        return runner

    # -- replies
    def generate(self, request: Any) -> int:
        """Start a reply (queued behind one that is still stopping); returns its id."""
        self._next_id += 1
        rid = self._next_id
        if self._reply is not None and self._reply.isRunning():
            self._queue.append((rid, request))
        else:
            self._start_reply(rid, request)
        return rid

    def _start_reply(self, rid: int, request: Any) -> None:
        from app.jobs import generate_job  # noqa: PLC0415

        runner = self._runner("generate", rid, lambda emit, r: generate_job(self.session, request, r.cancel, emit))
        runner.yielded.connect(lambda tag, item: self.reply_event.emit(tag, item))
        runner.failed.connect(lambda tag, message: self.reply_failed.emit(tag, message))
        runner.finished.connect(lambda r=runner: self._reply_finished(r))
        self._reply = runner
        self._start(runner)

    def _reply_finished(self, runner: Runner) -> None:
        if self._reply is runner:
            self._reply = None
        self.reply_ended.emit(runner.tag)
        if self._queue and not self._closing:
            self._start_reply(*self._queue.pop(0))

    def stop(self) -> None:
        """Cancel the running reply and drop queued ones (each still gets reply_failed and reply_ended)."""
        if self._reply is not None:
            self._reply.cancel.set()
        queued, self._queue = self._queue, []
        for rid, _ in queued:
            self.reply_failed.emit(rid, "cancelled before it started")
            self.reply_ended.emit(rid)

    def set_context_limit(self, n_ctx: int) -> None:
        """The next reply uses a cache of min(n_ctx, the model's context) (a new cache when it changes)."""
        self.session.context_limit = int(n_ctx)

    def set_backend(self, backend: str) -> None:
        """The backend the next model load uses: 'auto' (CuPy when a GPU answers, else NumPy), 'numpy' or 'cupy'."""
        from engine.backend import BACKEND_NAMES  # noqa: PLC0415

        self.session.backend = backend if backend in BACKEND_NAMES else "auto"

    def set_cache_type(self, cache_type: str) -> None:
        """The next reply uses a fresh KV cache of this type (F32, F16, Q8_0, Q4_0) if the current one differs."""
        from engine.cache import CACHE_TYPES  # noqa: PLC0415

        name = str(cache_type).upper()
        self.session.cache_type = name if name in CACHE_TYPES else "F32"

    @property
    def cache_type(self) -> str:
        return self.session.cache_type

    @property
    def generating(self) -> bool:
        return (self._reply is not None and self._reply.isRunning()) or bool(self._queue)

    # -- lenses
    def request_lens(self, kind: str, compute: Callable[..., Any]) -> None:
        """Run compute(model, recorder, cache, token_texts) between tokens; the newest request per kind wins."""
        if self._closing:
            return
        self._lens_pending[kind] = compute
        if self._lens is None:
            self._next_lens()

    def _lens_finished(self, runner: Runner) -> None:
        if self._lens is runner:
            self._lens = None
            self._next_lens()

    def _next_lens(self) -> None:
        from app.jobs import lens_job  # noqa: PLC0415

        if not self._lens_pending or self._closing:
            return
        kind = next(iter(self._lens_pending))
        compute = self._lens_pending.pop(kind)
        runner = Runner(lambda emit: lens_job(self.session, kind, compute, emit), f"lens-{kind}", tag=kind)
        runner.yielded.connect(lambda _tag, item: self.lens_ready.emit(item))
        runner.failed.connect(lambda tag, msg: self.lens_failed.emit(str(tag), msg))
        runner.finished.connect(lambda r=runner: self._lens_finished(r))
        self._lens = runner
        self._start(runner)

    # -- tasks: requantizing, comparing, the preset sweep; each lane runs one job at a time
    def run_task(self, lane: str, kind: str, job: TaskJob) -> None:
        """Run job(emit, cancel) on `lane` once its running job ends; a newer waiting job of the same kind wins."""
        if self._closing:
            return
        self._task_pending.setdefault(lane, {})[kind] = job
        if self._tasks.get(lane) is None:
            self._next_task(lane)

    def cancel_task(self, lane: str, kind: str | None = None) -> None:
        """Cancel the lane's running job (only if it is of `kind`, when given) and drop its waiting jobs of that kind."""
        pending = self._task_pending.get(lane, {})
        for k in [k for k in pending if kind is None or k == kind]:
            pending.pop(k)
        runner = self._tasks.get(lane)
        if runner is not None and (kind is None or runner.tag == kind):
            runner.cancel.set()

    def task_running(self, lane: str) -> str | None:
        """The kind of the lane's running job, or None."""
        runner = self._tasks.get(lane)
        return str(runner.tag) if runner is not None and runner.isRunning() else None

    def _next_task(self, lane: str) -> None:
        pending = self._task_pending.get(lane)
        if not pending or self._closing:
            return
        kind = next(iter(pending))
        job = pending.pop(kind)
        runner = self._runner(f"task-{kind}", kind, lambda emit, r: job(emit, r.cancel))
        runner.yielded.connect(lambda tag, item: self.task_event.emit(tag, item))
        runner.done.connect(lambda tag, value: self.task_done.emit(tag, value))
        runner.failed.connect(lambda tag, message: self.task_failed.emit(tag, message))
        runner.finished.connect(lambda r=runner, ln=lane: self._task_finished(ln, r))
        self._tasks[lane] = runner
        self._start(runner)

    def _task_finished(self, lane: str, runner: Runner) -> None:
        if self._tasks.get(lane) is runner:
            self._tasks[lane] = None
            self._next_task(lane)
