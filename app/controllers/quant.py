"""QuantBridge: the override editor and the Compare view ask through signals; jobs run on the engine's task lanes.

Lanes (one job at a time each): 'quant' requantizes the chat's model (apply, reset, save); 'compare'
runs comparisons and their heads on the compare workspace; 'sweep' runs the preset sweep on its own
workspace, so a comparison need not wait minutes for a sweep to end.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.controllers.lenses import LensBridge
from app.data.overrides import OverrideSpec, with_types
from app.jobs.compare import CompareWorkspace, compare_job, head_job, release_job
from app.jobs.quant import (
    Applied,
    Saved,
    apply_job,
    imatrix_clear_job,
    imatrix_compute_job,
    imatrix_load_job,
    reset_job,
    save_job,
)
from app.jobs.sweep import SWEEP_PRESETS, sweep_job
from app.records.imatrix import ImatrixRecord
from app.records.logit_lens import LogitLensPair
from app.records.compare import CompareOptions, CompareRecord, HeadPair, SweepDone, SweepPoint, TaskProgress
from app.state import AppState
from app.views.compare.view import CompareView
from app.views.quant.imatrix import ImatrixPanel
from app.views.quant.lens import QuantLens
from app.views.quant.overrides import OverrideEditor
from app.workers.engine import Engine
from engine.quant.types import GGMLType

log = logging.getLogger(__name__)

QUANT_TASKS = ("apply", "reset", "save")
# the task kinds this bridge starts and answers; the engine's task signals carry every controller's kinds, and
# the others (patching, interventions, ...) are answered by their own controllers
MY_TASKS = ("compare", "heads", "logit", "imatrix", "mix", "sweep", "release", *QUANT_TASKS)


class QuantBridge(QObject):
    """Connects the Quantization lens's override editor and the Compare view to the engine."""

    applied = Signal(object)  # the OverrideSpec the chat's model holds now (empty: the file's weights)

    def __init__(self, engine: Engine, state: AppState, quant_lens: QuantLens | None, compare: CompareView,
                 lenses: LensBridge, parent: QObject | None = None):
        super().__init__(parent)
        self.engine = engine
        self.state = state
        self.compare = compare
        self.lenses = lenses
        self.editor: OverrideEditor | None = None
        self.lens: QuantLens | None = None  # the Quantization lens and its imatrix panel (None: it could not be built)
        self.imatrix_panel: ImatrixPanel | None = None
        self.file_record: Any = None  # the ModelRecord of the file as loaded (types before any Apply)
        self.workspace = CompareWorkspace()
        self.sweep_workspace = CompareWorkspace()
        engine.task_event.connect(self._event)
        engine.task_done.connect(self._done)
        engine.task_failed.connect(self._failed)
        engine.loaded.connect(lambda result: self.model_loaded(result.record))
        compare.compare_requested.connect(self.run_compare)
        compare.cancel_requested.connect(lambda: engine.cancel_task("compare"))
        compare.head_requested.connect(self.run_heads)
        compare.sweep_requested.connect(self.run_sweep)
        compare.sweep_cancel_requested.connect(lambda: engine.cancel_task("sweep"))
        compare.mix_requested.connect(self.run_mix)
        compare.apply_requested.connect(self.apply_from_compare)
        compare.logit_pair.logit_requested.connect(self.run_logit_pair)
        if quant_lens is not None:
            self.attach(quant_lens)

    def attach(self, lens: QuantLens) -> None:
        """Connect the Quantization lens's override editor and imatrix panel."""
        editor = self.editor = lens.overrides
        editor.apply_requested.connect(self.apply)
        editor.reset_requested.connect(
            lambda: self._quant("reset", lambda emit, cancel: reset_job(self.engine.session, cancel, emit)))
        editor.save_requested.connect(self.save)
        editor.cancel_requested.connect(lambda: self.engine.cancel_task("quant"))
        editor.spec_changed.connect(self.compare.set_overrides)
        self.lens = lens
        panel = self.imatrix_panel = lens.imatrix_panel
        panel.load_requested.connect(lambda path: self._imatrix(
            lambda emit, cancel: imatrix_load_job(self.engine.session, path, cancel, emit)))
        panel.compute_requested.connect(lambda path, n_ctx: self._imatrix(
            lambda emit, cancel: imatrix_compute_job(self.engine.session, path, n_ctx, cancel, emit)))
        panel.clear_requested.connect(lambda: self._imatrix(
            lambda emit, cancel: imatrix_clear_job(self.engine.session, cancel, emit)))
        panel.cancel_requested.connect(lambda: self.engine.cancel_task("quant", "imatrix"))
        if self.file_record is not None:
            editor.set_model(self.file_record)
        self.compare.set_overrides(editor.spec())

    def model_loaded(self, record: Any) -> None:
        """A model was loaded (its weights are the file's): editor and Compare view start from its record."""
        if record is None:
            return
        self.file_record = record
        if self.lens is not None:
            self.lens.set_imatrix(None)  # a new model has a new requantizer, without a matrix
        for lane, ws in (("compare", self.workspace), ("sweep", self.sweep_workspace)):
            if ws.path is not None and ws.path != record.path:
                self.engine.run_task(lane, "release", lambda emit, cancel, w=ws: release_job(w))
        if self.editor is not None:
            self.editor.set_model(record)
            self.editor.set_applied(OverrideSpec())
            self.editor.show_message("")  # a reload (even of the same file) undid what the last message described
        self.compare.set_model(record)

    def spec(self) -> OverrideSpec:
        return self.editor.spec() if self.editor is not None else OverrideSpec()

    def close(self) -> None:
        """Close the workspaces' models, unless a job thread still runs (it may be using them)."""
        if self.engine.threads():
            log.warning("a job is still running; the compare models stay open until the process ends")
            return
        self.workspace.close()
        self.sweep_workspace.close()

    # ---- requests

    def apply(self, spec: OverrideSpec) -> None:
        self._quant("apply", lambda emit, cancel: apply_job(self.engine.session, spec, cancel, emit))

    def save(self, spec: OverrideSpec, path: str) -> None:
        self._quant("save", lambda emit, cancel: save_job(self.engine.session, spec, path, cancel, emit))

    def _imatrix(self, job: Any) -> None:
        """Load, compute or clear the importance matrix on the 'quant' lane (after any apply or save)."""
        if self.imatrix_panel is not None:
            self.imatrix_panel.set_busy(True, "waiting", 0.0)
        self.engine.run_task("quant", "imatrix", job)

    def _quant(self, kind: str, job: Any) -> None:
        if self.editor is not None:
            self.editor.set_busy(kind, "waiting", 0.0)
            self.editor.show_message("")
        self.engine.run_task("quant", kind, job)

    def run_compare(self, opts: CompareOptions) -> None:
        if self.file_record is None:
            self.compare.failed("compare", "no model is loaded")
            return
        path, spec = self.file_record.path, self.spec()
        self.compare.set_running(True)
        self.compare.set_progress(TaskProgress("compare", "waiting", 0.0))
        self.engine.run_task("compare", "compare",
                             lambda emit, cancel: compare_job(self.workspace, path, opts, spec, cancel, emit))

    def run_heads(self, layer: int, head: int) -> None:
        if self.compare.record is not None:
            self.engine.run_task("compare", "heads", lambda emit, cancel: head_job(self.workspace, layer, head))

    def run_logit_pair(self, position: int, width: int) -> None:
        from app.jobs.logit_lens import logit_pair_job  # noqa: PLC0415

        if self.compare.record is not None:
            self.engine.run_task("compare", "logit", lambda emit, cancel: logit_pair_job(self.workspace, position, width))

    def run_sweep(self, text: str, presets: Sequence[str] = SWEEP_PRESETS, max_tokens: int = 512) -> None:
        """Measure each preset (all of llama-quantize's by default; the tour asks for fewer, on fewer tokens)."""
        if self.file_record is None:
            self.compare.sweep_finished(None, "Load a model first.")
            return
        path, spec, chosen = self.file_record.path, self.spec(), tuple(presets)
        self.compare.sweep_started()
        self.engine.run_task("sweep", "sweep", lambda emit, cancel: sweep_job(
            self.sweep_workspace, path, text, spec, cancel, emit, presets=chosen, max_tokens=max_tokens))

    def run_mix(self, budget_bpw: float, text: str) -> None:
        """Search the best mix under budget_bpw on the sweep's lane (it shares the sweep's copy of the model)."""
        from app.jobs.mix import mix_job, session_imatrix  # noqa: PLC0415

        if self.file_record is None:
            self.compare.mix_finished(None, "Load a model first.")
            return
        path = self.file_record.path
        self.compare.mix_started()
        self.engine.run_task("sweep", "mix",
                             lambda emit, cancel: mix_job(self.sweep_workspace, path, budget_bpw, text, cancel, emit,
                                                          imatrix=session_imatrix(self.engine.session, path)))

    def apply_from_compare(self, spec: OverrideSpec) -> None:
        """A sweep point's preset or mix goes into the Quantization lens's overrides and is applied."""
        if self.editor is None:
            self.compare.sweep.status.setText("Open the Quantization lens once, then apply again.")
            return
        self.editor.set_spec(spec)
        self.apply(spec)

    # ---- results

    def _event(self, kind: str, item: object) -> None:
        if kind not in MY_TASKS:
            return
        if isinstance(item, TaskProgress):
            if item.task == "imatrix":
                if self.imatrix_panel is not None:
                    self.imatrix_panel.set_busy(True, item.what, item.fraction)
            elif item.task in QUANT_TASKS:
                if self.editor is not None:
                    self.editor.set_busy(item.task, item.what, item.fraction)
            else:
                self.compare.set_progress(item)
        elif isinstance(item, CompareRecord):
            self.compare.set_record(item)
        elif isinstance(item, HeadPair):
            self.compare.set_heads(item)
        elif isinstance(item, LogitLensPair):
            self.compare.logit_pair.set_pair(item)
        elif isinstance(item, SweepPoint) and item.kind == "mix":
            self.compare.mix_finished(item)
        elif isinstance(item, SweepPoint):
            self.compare.add_sweep_point(item)
        elif isinstance(item, SweepDone) and kind == "mix":
            if item.cancelled:
                self.compare.mix_finished(None, "Mix search cancelled; the tensors measured so far are cached, "
                                                "so Find the best mix resumes from them.")
        elif isinstance(item, SweepDone):
            self.compare.sweep_finished(item)

    def _done(self, kind: str, value: object) -> None:
        if kind not in MY_TASKS:
            return
        if kind == "imatrix":
            record = value if isinstance(value, ImatrixRecord) else None
            if self.lens is not None:
                self.lens.set_imatrix(record)
            return
        if isinstance(value, Applied):
            self._applied(value)
        elif isinstance(value, Saved):
            self.editor.set_busy(None)
            self.editor.show_message(f"Saved {value.path}: {value.summary} ({value.elapsed_s:.1f} s)")
        elif kind == "compare":
            self.compare.set_running(False)

    def _applied(self, value: Applied) -> None:
        if self.file_record is not None:
            types = {n: GGMLType[t] for n, t in value.types.items()}
            self.state.model_record = with_types(self.file_record, types)
            self.lenses.deliver(self.lens, QuantLens.set_model, self.state.model_record)
        if self.editor is not None:
            self.editor.set_busy(None)
            self.editor.set_applied(value.spec, value.summary)
            what = "the file's weights are back" if value.spec.empty else f"applied {value.summary}"
            self.editor.show_message(f"Done: {what}. The chat uses them from the next reply (its KV cache was cleared).")
        self.applied.emit(value.spec)

    def _failed(self, kind: str, message: str) -> None:
        if kind not in MY_TASKS:
            return
        if kind == "imatrix":
            if self.imatrix_panel is not None:
                self.imatrix_panel.show_message(message)
        elif kind in QUANT_TASKS:
            if self.editor is not None:
                self.editor.set_busy(None)
                self.editor.show_message(message, error=True)
        elif kind in ("compare", "heads"):
            self.compare.failed("compare", message)
        elif kind == "sweep":
            self.compare.failed("sweep", message)
        elif kind == "mix":
            self.compare.failed("mix", message)
        else:
            log.info("task %s failed: %s", kind, message)
