"""ExperimentsBridge: the Experiments tab asks through signals; its jobs run on the engine's task lanes.

'interventions' sets or clears ablations, a control vector and a LoRA adapter on the chat's model and measures what
the change does to the conversation on screen (its next-token distributions before and after); the activation
patching map and its cells' effects are app.controllers.patching's. `interventions_changed` tells the window what is
on now (for its banner and the replies' signature); the Compare view is told which adapter files are on, to offer them
as B.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Signal

from app.controllers.patching import PatchingBridge
from app.jobs.interventions import interventions_job
from app.records.compare import TaskProgress
from app.records.interventions import InterventionRecord, InterventionSpec
from app.state import AppState
from app.views.experiments import ExperimentsView
from app.workers.engine import Engine

INTERVENTIONS = "interventions"
OTHER_CHAT = "the effect was measured on the chat shown at Apply; Apply again to see it on this one"


class ExperimentsBridge(QObject):
    """Runs the Experiments tab's requests on the chat's model and hands back progress, records or failures.

    `conversation` (app.controllers.conversation.Conversation): the chat whose tokens the effect is measured on and
    whose last reply Regenerate makes again; `compare` (app.views.compare.view.CompareView): offered the adapters."""

    interventions_changed = Signal(str)  # the description of what is on ('' when nothing is)

    def __init__(self, engine: Engine, state: AppState, view: ExperimentsView, parent: QObject | None = None,
                 conversation: Any = None, compare: Any = None):
        super().__init__(parent)
        self.engine, self.state, self.view = engine, state, view
        self.conversation, self.compare = conversation, compare
        self.active = ""
        self._model_serial = 0  # one more per model loaded: a record of an earlier model is dropped
        panel = view.interventions
        self.patching = PatchingBridge(engine, state, view.patching, self)
        panel.apply_requested.connect(self.apply)
        panel.stop_requested.connect(lambda: engine.cancel_task(INTERVENTIONS, INTERVENTIONS))
        engine.task_event.connect(self._event)
        engine.task_done.connect(self._done)
        engine.task_failed.connect(self._failed)
        state.model_changed.connect(self._model)  # a load (not a requantize, which keeps the interventions)
        state.model_record_changed.connect(
            lambda rec: panel.set_experts(getattr(rec, "n_expert", 0) if rec is not None else 0))
        if conversation is not None:  # Regenerate is there whenever the chat on screen has a turn to answer again
            conversation.chat_opened.connect(lambda _chat: self._regenerate_state())
            conversation.messages_changed.connect(lambda _cid: self._regenerate_state())
            conversation.generating_changed.connect(lambda _on: self._regenerate_state())

    def run_patching(self, clean: str, corrupt: str, kind: str) -> None:
        """Make the activation patching map (as the Patching view's Run does)."""
        self.patching.run_patching(clean, corrupt, kind)

    def apply(self, spec: object) -> None:
        """Set `spec` (an empty InterventionSpec: clear all) and measure it on the conversation on screen."""
        assert isinstance(spec, InterventionSpec)
        session = self.engine.session
        conv = self.conversation
        context = conv.shown_request() if conv is not None else None  # None while a reply is made: the cache's tokens
        tag, model = (self._chat_id(), self._model_serial), session.model  # the model asked about (read, not touched)
        self.view.interventions.started()
        self.engine.run_task(INTERVENTIONS, INTERVENTIONS,
                             lambda emit, cancel: interventions_job(session, spec, cancel, emit, context, tag, model))

    def _chat_id(self) -> str:
        conv = self.conversation
        return conv.current.id if conv is not None and conv.current is not None else ""

    def _regenerate_state(self) -> None:
        conv = self.conversation
        chat = conv.current if conv is not None else None
        can = (self.state.model is not None and chat is not None and not conv.generating
               and any(m.role == "user" for m in chat.messages))
        self.view.interventions.set_can_regenerate(bool(can))

    def _model(self, rec: object) -> None:
        self._model_serial += 1
        self.view.set_model(rec is not None)
        self._regenerate_state()
        if self.compare is not None:
            self.compare.set_loaded_adapters(())
        if self.active:  # a new model holds no interventions
            self.active = ""
            self.interventions_changed.emit("")

    def _event(self, kind: str, item: object) -> None:
        if kind == INTERVENTIONS and isinstance(item, TaskProgress):
            self.view.interventions.set_progress(item.what, item.fraction)

    def _done(self, kind: str, value: object) -> None:
        if kind == INTERVENTIONS and isinstance(value, InterventionRecord):
            self._intervened(value)

    def _intervened(self, rec: InterventionRecord) -> None:
        chat, serial = rec.tag if len(rec.tag) == 2 else (self._chat_id(), self._model_serial)
        if serial != self._model_serial:  # set on a model since replaced: nothing of it is on the model shown
            self.view.interventions.set_model(self.state.model is not None)
            return
        if chat != self._chat_id() and rec.measured:  # the other chat's numbers are not this one's
            rec = dataclasses.replace(rec, kld=np.zeros(0), top_before=(), top_after=(), note=OTHER_CHAT)
        self.view.interventions.set_record(rec)
        self._regenerate_state()
        if self.compare is not None:
            self.compare.set_loaded_adapters(rec.adapters)
        self.active = rec.description
        self.interventions_changed.emit(rec.description)

    def _failed(self, kind: str, message: str) -> None:
        if kind == INTERVENTIONS:
            self.view.interventions.failed(message)
