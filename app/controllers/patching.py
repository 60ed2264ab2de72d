"""PatchingBridge: the Patching view asks through signals; the job runs on the engine's 'patching' task lane."""
from __future__ import annotations

from PySide6.QtCore import QObject

from app.jobs.patching import patching_job
from app.records.compare import TaskProgress
from app.records.patching import PatchRecord
from app.state import AppState
from app.views.patching import PatchingView
from app.workers.engine import Engine

KIND = "patching"


class PatchingBridge(QObject):
    """Runs the view's patching requests on the chat's model and hands back progress, the map or the failure."""

    def __init__(self, engine: Engine, state: AppState, view: PatchingView, parent: QObject | None = None):
        super().__init__(parent)
        self.engine, self.state, self.view = engine, state, view
        view.run_requested.connect(self.run)
        view.cancel_requested.connect(lambda: engine.cancel_task(KIND, KIND))
        engine.task_event.connect(self._event)
        engine.task_done.connect(self._done)
        engine.task_failed.connect(self._failed)
        state.model_record_changed.connect(lambda rec: view.set_model(rec is not None))

    def run(self, clean: str, corrupt: str, kind: str) -> None:
        session = self.engine.session
        self.engine.run_task(KIND, KIND, lambda emit, cancel: patching_job(session, clean, corrupt, kind, cancel, emit))

    def _event(self, kind: str, item: object) -> None:
        if kind == KIND and isinstance(item, TaskProgress):
            self.view.set_progress(item.what, item.fraction)

    def _done(self, kind: str, value: object) -> None:
        if kind == KIND and isinstance(value, PatchRecord):
            self.view.set_record(value)

    def _failed(self, kind: str, message: str) -> None:
        if kind == KIND:
            self.view.failed(message)
