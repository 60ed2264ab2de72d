"""AttributionFeed: the Why lens's half of the LensBridge. It turns the lens's requests into lens jobs on the engine
worker (app.jobs.attribution), tagged with the model serial and the conversation on screen like every lens record
(so a record of another model or another conversation is dropped), and hands what comes back to the lens.

The lens follows the last reply: when a reply ends, or the tab comes on screen on a conversation it has not explained,
it asks for the last token (WhyLens.follow_last). Stop drops the Why jobs waiting and stops the one running where it
checks (between its passes); what it would have sent is dropped.

Attribution patching (the lens's Patching tab, app.views.attribution_patching) is a lens job of its own kind,
`why_patch` (app.jobs.attribution.patching_check): the feed answers the tab's request signal itself, hands its
progress (one step per pass) to the tab, and the lens's Stop ends it within one pass.

The same attribution in A and B of the Compare tab runs on the compare lane (app.jobs.attribution.attribution_pair_job
on the Compare tab's workspace, `compare_workspace`, which the window sets): its A and B are loaded again there.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from app.jobs.attribution import (NO_REPLY, PAIR_TASK, AttributionMemo, ablation_check, attribution,
                                  attribution_pair_job, patching_check)
from app.jobs.lens import LensProgress
from app.records.attribution import AblationCheck, AttributionPair, AttributionRecord, PatchingRecord
from app.records.compare import TaskProgress
from app.views.attribution import WhyLens

if TYPE_CHECKING:
    from app.controllers.lenses import LensBridge

log = logging.getLogger(__name__)

PATCHING = "why_patch"  # attribution patching's lens job
KINDS = ("why", "why_check", PATCHING)  # the lens jobs' kinds (LensResult.kind)
NO_MODEL = "Load a model first."
GENERATING = "A reply is being written: the Why lens explains it when it ends (or Stop it)."
NO_CONVERSATION = "Nothing to patch: load a model and send a message (or wait for the reply to end)."


def _patching_done(lens: WhyLens, rec: PatchingRecord) -> None:
    lens.patching.set_patching(rec)


def _patching_failed(lens: WhyLens, message: str) -> None:
    lens.patching.failed(message)


def _patching_progress(lens: WhyLens, what: str, fraction: float) -> None:
    lens.patching.progress(what, fraction)


class AttributionFeed:
    """Requests of the Why lens to the engine, results back to it (see the module docstring)."""

    title = WhyLens.title

    def __init__(self, bridge: LensBridge):
        self.bridge = bridge
        self.memo = AttributionMemo()  # touched on the worker only
        self.patch_memo = AttributionMemo()  # attribution patching's records (worker only)
        self._stopped = False
        self._explained: Any = None  # the conversation of the last record shown
        self._following: Any = None  # the conversation whose last token the lens asked for by itself (not back yet)
        self.compare_workspace: Any = None  # () -> the Compare tab's CompareWorkspace (set by the window)
        self._pair_serial = -1  # the model serial the A and B attribution was asked under
        engine = bridge.engine
        for name, slot in (("lens_progress", self.progress), ("task_event", self._task_event),
                           ("task_failed", self._task_failed)):
            signal = getattr(engine, name, None)  # (a test's fake engine may have fewer)
            if signal is not None:
                signal.connect(slot)
        lens = self.lens()
        if lens is not None:  # the Patching tab's request: answered here (LensRequests names the lens's own)
            lens.patching.patching_requested.connect(self.request_patching)

    def lens(self) -> WhyLens | None:
        return self.bridge.lens(WhyLens)

    def _say(self, method: Any, *args: Any) -> None:
        self.bridge.deliver(self.lens(), method, *args)

    def _context(self) -> Any:
        """The conversation on screen, or None after telling the lens why there is nothing to explain."""
        b = self.bridge
        rec = b.state.model_record
        if rec is None or b.state.model is None:
            self._say(WhyLens.waiting, NO_MODEL)
            return None
        context = b.shown_context()
        if context is None:
            conv = b.conversation
            self._say(WhyLens.waiting, GENERATING if conv is not None and conv.generating else NO_REPLY)
        return context

    # ---- requests (LensRequests)

    def request(self, token_index: int, contrast: str, method: str = "") -> None:
        context = self._context()
        if context is None:
            return
        self._stopped = False
        self.bridge._request("why", attribution(context, int(token_index), str(contrast or ""), self.memo,
                                                self.bridge._serial, str(method or "")))

    def confirm(self, what: Any) -> None:
        if not isinstance(what, tuple) or len(what) != 6:
            return
        token_index, contrast, kind, layer, index, estimate = what
        context = self._context()
        if context is None:
            return
        self._stopped = False
        self.bridge._request("why_check", ablation_check(context, int(token_index), str(contrast), str(kind),
                                                         int(layer), int(index), float(estimate)))

    def request_patching(self, what: Any) -> None:
        """Attribution patching of a token: what = (token index, contrast '' or '#id', corrupted text)."""
        if not isinstance(what, tuple) or len(what) != 3:
            return
        token_index, contrast, corrupt = what
        context = self._context()
        if context is None:
            self._say(_patching_failed, NO_CONVERSATION)
            return
        self._stopped = False
        self.bridge._request(PATCHING, patching_check(context, int(token_index), str(contrast), str(corrupt),
                                                      self.patch_memo, self.bridge._serial))

    def request_pair(self, what: Any) -> None:
        """The same attribution in A and B of the last comparison: what = (ids, token index, reply start, contrast
        id or None)."""
        if not isinstance(what, tuple) or len(what) != 4:
            return
        ws = self.compare_workspace() if self.compare_workspace is not None else None
        if ws is None:
            self._say(WhyLens.pair_failed, "the Compare tab is not available in this window")
            return
        ids, token_index, reply_start, contrast = what
        self._pair_serial = self.bridge._serial
        self.bridge.engine.run_task("compare", PAIR_TASK, lambda emit, cancel: attribution_pair_job(
            ws, tuple(ids), int(token_index), int(reply_start), None if contrast is None else int(contrast)))

    def _task_event(self, kind: str, item: object) -> None:
        if kind != PAIR_TASK or self._pair_serial != self.bridge._serial:
            return  # another task, or asked of the model before
        if isinstance(item, TaskProgress):
            self._say(WhyLens.pair_progress, item.what)
        elif isinstance(item, AttributionPair):
            self._say(WhyLens.set_pair, item)

    def _task_failed(self, kind: str, message: str) -> None:
        if kind == PAIR_TASK and self._pair_serial == self.bridge._serial:
            self._say(WhyLens.pair_failed, message)

    def stop(self) -> None:
        """Drop the Why jobs waiting, stop the running one where it checks, and ignore what it sends."""
        self._stopped = True
        self._following = None
        engine = self.bridge.engine
        pending = getattr(engine, "_lens_pending", {})
        for kind in KINDS:
            pending.pop(kind, None)
        running = getattr(engine, "_lens", None)
        if running is not None and getattr(running, "tag", None) in KINDS:
            running.cancel.set()

    # ---- what comes back

    def ready(self, kind: str, rec: Any) -> None:
        if self._stopped:
            return
        if kind == "why" and isinstance(rec, AttributionRecord):
            self._explained, self._following = self.bridge.shown_context(), None
            self._say(WhyLens.set_attribution, rec)
        elif kind == "why_check" and isinstance(rec, AblationCheck):
            self._say(WhyLens.set_check, rec)
        elif kind == PATCHING and isinstance(rec, PatchingRecord):
            self._say(_patching_done, rec)

    def failed(self, kind: str, message: str) -> None:
        log.info("why lens %s: %s", kind, message)
        if kind == PATCHING:
            if not self._stopped:
                self._say(_patching_failed, message)
            return
        self._following = None
        if not self._stopped:
            self._say(WhyLens.failed, message)

    def progress(self, item: object) -> None:
        if isinstance(item, LensProgress) and item.kind == PATCHING:
            self._say(_patching_progress, item.what, item.fraction)
        elif isinstance(item, LensProgress) and item.kind in KINDS:
            self._say(WhyLens.progress, item.what)

    # ---- following the conversation

    def shown(self) -> None:
        """The Why tab came on screen: explain the last reply if the lens shows another conversation."""
        context = self.bridge.shown_context()
        if context is not None and context != self._explained and context != self._following:
            lens = self.lens()
            if lens is not None:
                self._following = context  # a reply's end and the context change it makes ask once
                lens.follow_last()

    def reply_ended(self) -> None:
        """A reply ended: explain its last token if the Why tab is on screen (else when it comes on screen)."""
        if self.bridge.visible(WhyLens.title):
            self.shown()

    def context_changed(self) -> None:
        """What is on screen may have changed (another chat, reply version or model): a record of another
        conversation goes, and the lens explains the new last reply when it is on screen."""
        context = self.bridge.shown_context()
        if context is None or context == self._explained:
            return
        if self._explained is not None:
            self._explained = self._following = None
            self.bridge._drop_pending(WhyLens.title)
            self._say(WhyLens.clear_chat)
        if self.bridge.visible(WhyLens.title):
            self.shown()

    def model_loaded(self) -> None:
        self._explained = self._following = None
        self.memo = AttributionMemo()
        self.patch_memo = AttributionMemo()
