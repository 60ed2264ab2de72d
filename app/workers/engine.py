"""Engine: the GUI's handle on the engine; starts fetch, load, generate, lens and task jobs on threads.

Jobs are plain generators (app/jobs/) run by `Runner` on a QThread; what they yield comes back through signals.
The loaded model, its KV cache and the Recorder live in the `Session` (app/jobs/session.py) and are only touched
by jobs, under `Session.lock`; the generate job releases the lock between tokens so lens jobs can run in between.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterator

from PySide6.QtCore import QObject, QThread, QTimer, Signal

from app.jobs.chat import generate_job
from app.jobs.lens import LensProgress, lens_job
from app.jobs.load import fetch_job, load_job
from app.jobs.session import Emit, Session
from app.workers.blas import limit_blas_threads, restore_blas_threads
from app.workers.gc_guard import GuiThreadCollector
from app.workers.runner import Runner, TaskJob


LATE_CHECK_MS = 1000  # how often the Engine looks whether the late kernels are ready for the loaded model
LATE_IDLE_S = 5.0  # ... and takes them up after this long with no job running (a pause in the chat)


class Engine(QObject):
    """The GUI's handle on the engine: starts jobs on threads and re-emits their records as signals."""

    load_progress = Signal(object)  # app.jobs.load.LoadProgress, or None when loading ended
    loaded = Signal(object)  # app.jobs.load.Loaded
    load_failed = Signal(str)
    load_cancelled = Signal(str)  # the user cancelled (or a newer open superseded) a fetch or load
    reply_event = Signal(int, object)  # (reply id, Prepared | PrefillProgress | TokenStep | ReplyDone)
    reply_failed = Signal(int, str)
    reply_ended = Signal(int)  # the reply's thread has finished (after ReplyDone or reply_failed)
    lens_ready = Signal(object)  # app.jobs.lens.LensResult
    lens_failed = Signal(str, str)  # (kind, message)
    lens_progress = Signal(object)  # app.jobs.lens.LensProgress of the running lens job, None when it ended
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
        # cyclic collections on the GUI thread only (see gc_guard); the thaw of frozen objects waits for no jobs
        self._gc = GuiThreadCollector(self, idle=lambda: not self.threads())
        # a first start's late kernels: the loaded model takes them up at an idle moment (_finish_late)
        self._late_timer = QTimer(self, interval=LATE_CHECK_MS)
        self._late_timer.timeout.connect(self._finish_late)
        self._busy_at = time.monotonic()  # when a job thread was last seen running
        self._late_timer.start()

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

    def _finish_late(self) -> None:
        """Once a first start's late kernels are compiled, the loaded model takes them up (engine.runtime.warmup.
        finish_late: the decode step's plan, the repacked copies that replace the file's pages) on a thread of its
        own after LATE_IDLE_S with no job running: a pause, not the moment a job ends (a comparison's memory
        measured after it would include them)."""
        from engine.runtime.warmup import finish_late, late_pending  # noqa: PLC0415

        net = getattr(self.session.model, "net", None)
        now = time.monotonic()
        if self.threads():
            self._busy_at = now
        if net is None or self._closing or now - self._busy_at < LATE_IDLE_S or not late_pending(net):
            return  # (a job that uses the model first takes the late paths up itself: Model.forward)

        def job(emit: Emit, runner: Runner) -> Iterator[object]:
            with self.session.lock:
                if getattr(self.session.model, "net", None) is net:
                    finish_late(net)
            yield from ()

        self._start(self._runner("finish-late", "finish-late", job))

    def threads(self) -> list[QThread]:
        """Job threads still running."""
        return [r for r in self._runners if r.isRunning()]

    def shutdown(self, timeout_s: float = 15.0) -> bool:
        """Cancel everything and wait for every job thread; False if one is still running at the timeout."""
        self._closing = True
        self._late_timer.stop()
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
        if not self.threads():
            self._gc.stop()
        return not self.threads()

    # -- models
    def open_model(self, source: str) -> None:
        """Fetch (catalog names not yet installed) and load a model; the current one stays until it succeeds."""
        from engine import catalog  # noqa: PLC0415

        self.cancel_load()
        self.stop_jobs()  # what runs on the old model (a comparison, a sweep, a probe) stops before the switch
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

    def cancel_lens(self) -> None:
        """Stop the running lens job where it runs tokens (reading a long chat) and drop the waiting requests."""
        self._lens_pending.clear()
        if self._lens is not None:
            self._lens.cancel.set()

    def stop_jobs(self) -> None:
        """Stop every job of the loaded model: the lens requests (running and waiting) and every task lane's
        running and waiting jobs (each task says so through task_failed, as a Stop would)."""
        self.cancel_lens()
        for lane in list(self._tasks) + [ln for ln in self._task_pending if ln not in self._tasks]:
            self.cancel_task(lane)

    @property
    def loading(self) -> bool:
        return self._loader is not None and self._loader.isRunning()

    def _on_loaded(self, result: object) -> None:
        self.load_progress.emit(None)
        self.loaded.emit(result)  # even from a superseded runner: its model is the one in use now
        self._gc.freeze_soon()  # the model's long-lived objects leave the regular full collections

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

    def set_numerics(self, numerics: str) -> None:
        """How the next model load computes: 'ggml' (on the blocks, as llama.cpp) or 'float32' (the reference)."""
        self.session.numerics = numerics if numerics in ("ggml", "float32") else "ggml"

    def set_cache_type(self, cache_type: str) -> None:
        """The next reply uses a fresh KV cache of this type (F32, F16, Q8_0, Q4_0) if the current one differs."""
        from engine.cache import CACHE_TYPES  # noqa: PLC0415

        name = str(cache_type).upper()
        self.session.cache_type = name if name in CACHE_TYPES else "F16"

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
        if not self._lens_pending or self._closing:
            return
        kind = next(iter(self._lens_pending))
        compute = self._lens_pending.pop(kind)
        runner = self._runner(f"lens-{kind}", kind, lambda emit, r: lens_job(self.session, kind, compute, emit, r.cancel))
        runner.yielded.connect(
            lambda _tag, item: self.lens_progress.emit(item) if isinstance(item, LensProgress) else self.lens_ready.emit(item))
        runner.finished.connect(lambda: self.lens_progress.emit(None))
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
            # a job that never started sends no done or failed of its own: say so, or its view waits for ever
            # (a sweep asked again while the last one was ending, then cancelled, kept its Run button disabled)
            self.task_failed.emit(k, "cancelled before it started")
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
