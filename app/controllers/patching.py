"""PatchingBridge: the Patching view asks through signals; the map and a cell's effect run on the 'patching' task lane.

Run makes the activation patching map (app.jobs.patching.patching_job); a selected cell's effect
(patch_effect_job) follows on the same lane, so a click while a cell is measured waits for it (the newest click wins)
and a map and an effect never run at once. Effects are tagged with the model they were asked on: one of a model since
replaced is dropped, and a load forgets the kept ones.
"""
from __future__ import annotations

from PySide6.QtCore import QObject

from app.jobs.patching import EFFECT, forget_effects, patch_effect_job, patching_job
from app.records.compare import TaskProgress
from app.records.patching import PatchEffect, PatchRecord
from app.state import AppState
from app.views.patching import PatchingView
from app.workers.engine import Engine

PATCHING = "patching"  # the lane, and the map's kind on it


class PatchingBridge(QObject):
    """Runs the Patching view's map and cell effects on the chat's model and hands back progress, records or
    failures."""

    def __init__(self, engine: Engine, state: AppState, view: PatchingView, parent: QObject | None = None):
        super().__init__(parent)
        self.engine, self.view = engine, view
        self._model_serial = 0  # one more per model loaded: an effect measured on an earlier model is dropped
        view.run_requested.connect(self.run_patching)
        view.cancel_requested.connect(lambda: engine.cancel_task(PATCHING, PATCHING))
        view.effect_requested.connect(self.measure_cell)
        view.effect_stop_requested.connect(lambda: engine.cancel_task(PATCHING, EFFECT))
        engine.task_event.connect(self._event)
        engine.task_done.connect(self._done)
        engine.task_failed.connect(self._failed)
        state.model_changed.connect(self._model)

    def run_patching(self, clean: str, corrupt: str, kind: str) -> None:
        session = self.engine.session
        self.engine.run_task(PATCHING, PATCHING,
                             lambda emit, cancel: patching_job(session, clean, corrupt, kind, cancel, emit))

    def measure_cell(self, clean: str, corrupt: str, kind: str, layer: int, cell: int) -> None:
        """The effect of patching the map's cell (layer, cell) alone, after what runs on the lane."""
        session, tag = self.engine.session, (self._model_serial,)
        self.engine.run_task(PATCHING, EFFECT, lambda emit, cancel: patch_effect_job(
            session, clean, corrupt, kind, layer, cell, cancel, emit, tag))

    def _model(self, _rec: object) -> None:
        self._model_serial += 1
        forget_effects()

    def _event(self, kind: str, item: object) -> None:
        if kind == PATCHING and isinstance(item, TaskProgress):
            self.view.set_progress(item.what, item.fraction)
        elif kind == EFFECT and isinstance(item, TaskProgress):
            self.view.set_effect_progress(item.what, item.fraction)

    def _done(self, kind: str, value: object) -> None:
        if kind == PATCHING and isinstance(value, PatchRecord):
            self.view.set_record(value)
        elif kind == EFFECT and isinstance(value, PatchEffect) and value.tag == (self._model_serial,):
            self.view.set_effect(value)

    def _failed(self, kind: str, message: str) -> None:
        if kind == PATCHING:
            self.view.failed(message)
        elif kind == EFFECT:
            self.view.effect_failed(message)
