"""ExperimentsBridge: the Experiments tab asks through signals; its jobs run on the engine's task lanes.

'interventions' sets or clears ablations, a control vector and a LoRA adapter on the chat's model (and measures
what they do to the chat); 'patching' makes the activation patching map. `interventions_changed` tells the window
what is on now (for its banner and the replies' signature).
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.jobs.interventions import interventions_job
from app.jobs.patching import patching_job
from app.records.compare import TaskProgress
from app.records.interventions import InterventionRecord
from app.records.patching import PatchRecord
from app.state import AppState
from app.views.experiments import ExperimentsView
from app.workers.engine import Engine

PATCHING, INTERVENTIONS = "patching", "interventions"


class ExperimentsBridge(QObject):
    """Runs the Experiments tab's requests on the chat's model and hands back progress, records or failures."""

    interventions_changed = Signal(str)  # the description of what is on ('' when nothing is)

    def __init__(self, engine: Engine, state: AppState, view: ExperimentsView, parent: QObject | None = None):
        super().__init__(parent)
        self.engine, self.state, self.view = engine, state, view
        self.active = ""
        view.patching.run_requested.connect(self.run_patching)
        view.patching.cancel_requested.connect(lambda: engine.cancel_task(PATCHING, PATCHING))
        view.interventions.apply_requested.connect(self.apply)
        engine.task_event.connect(self._event)
        engine.task_done.connect(self._done)
        engine.task_failed.connect(self._failed)
        state.model_changed.connect(self._model)  # a load (not a requantize, which keeps the interventions)
        state.model_record_changed.connect(
            lambda rec: view.interventions.set_experts(getattr(rec, "n_expert", 0) if rec is not None else 0))

    def run_patching(self, clean: str, corrupt: str, kind: str) -> None:
        session = self.engine.session
        self.engine.run_task(PATCHING, PATCHING,
                             lambda emit, cancel: patching_job(session, clean, corrupt, kind, cancel, emit))

    def apply(self, spec: object) -> None:
        session = self.engine.session
        self.engine.run_task(INTERVENTIONS, INTERVENTIONS,
                             lambda emit, cancel: interventions_job(session, spec, cancel, emit))  # type: ignore[arg-type]

    def _model(self, rec: object) -> None:
        self.view.set_model(rec is not None)
        if self.active:  # a new model holds no interventions
            self.active = ""
            self.interventions_changed.emit("")

    def _event(self, kind: str, item: object) -> None:
        if kind == PATCHING and isinstance(item, TaskProgress):
            self.view.patching.set_progress(item.what, item.fraction)

    def _done(self, kind: str, value: object) -> None:
        if kind == PATCHING and isinstance(value, PatchRecord):
            self.view.patching.set_record(value)
        elif kind == INTERVENTIONS and isinstance(value, InterventionRecord):
            self.view.interventions.set_record(value)
            self.active = value.description
            self.interventions_changed.emit(value.description)

    def _failed(self, kind: str, message: str) -> None:
        if kind == PATCHING:
            self.view.patching.failed(message)
        elif kind == INTERVENTIONS:
            self.view.interventions.failed(message)
