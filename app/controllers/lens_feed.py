"""LensFeeder: how the LensBridge hands records to the lens widgets. A lens on screen gets a call at once; a hidden
one keeps the newest call of each method until its tab comes on screen (a new model first), so a hidden lens costs
nothing while the chat runs."""
from __future__ import annotations

import logging
from functools import partial
from typing import Any, Callable, Concatenate, ParamSpec, TypeVar

from app.state import AppState
from app.views.attention.lens import AttentionLens
from app.views.attribution import WhyLens
from app.views.experts import ExpertsLens
from app.views.lenses import LensSlot
from app.views.positions import PositionsLens
from app.views.quant.lens import QuantLens

log = logging.getLogger(__name__)
L = TypeVar("L", AttentionLens, PositionsLens, QuantLens, ExpertsLens, WhyLens)
P = ParamSpec("P")


class LensFeeder:
    """The feeding half of app.controllers.lenses.LensBridge: `slots` by title, `visible(title)`, the calls kept
    for hidden lenses (`_pending`)."""

    state: AppState
    slots: dict[str, LensSlot]
    visible: Callable[[str], bool]
    _pending: dict[str, dict[Callable[..., Any], partial[Any]]]

    def lens(self, cls: type[L]) -> L | None:
        """The built lens of class `cls`, if it has a slot here."""
        slot = self.slots.get(cls.title)
        widget = slot.widget if slot is not None else None
        return widget if isinstance(widget, cls) else None

    def feed(self, slot: LensSlot) -> None:
        """Give a lens the model and the chat's attention it missed (a new model: every lens starts over)."""
        st, w = self.state, slot.widget
        self._pending.pop(slot.title, None)
        if w is None:
            return
        if st.model_record is not None:
            self.deliver(w, type(w).set_model, st.model_record)
        rec = st.attention_record
        if rec is not None and isinstance(w, AttentionLens):
            self.deliver(w, AttentionLens.set_attention, rec)
        if rec is not None and isinstance(w, PositionsLens):
            self.deliver(w, PositionsLens.set_tokens, list(rec.token_texts))

    def deliver(self, lens: L | None, method: Callable[Concatenate[L, P], object], *args: P.args,
                **kwargs: P.kwargs) -> None:
        """Call method(lens, ...) now if the lens is on screen, else keep the newest call for when its tab is shown.

        `method` is the lens class's own function (`AttentionLens.set_head`): a misspelt name fails where it is
        written. No lens (one that could not be built): nothing to do.
        """
        if lens is None:
            return
        call = partial(method, lens, *args, **kwargs)
        if self.visible(lens.title):
            self._call(lens.title, call)
        else:
            self._pending.setdefault(lens.title, {})[method] = call

    @staticmethod
    def _call(title: str, call: partial[Any]) -> None:
        """Lens errors are logged, never raised: a broken view must not stop the others from being fed."""
        try:
            call()
        except Exception:  # noqa: BLE001
            log.exception("%s: %s failed", title, call.func.__qualname__)

    def _drop_pending(self, title: str) -> None:
        """Forget what a hidden lens was to be given of the old chat; a new model it has not seen yet stays."""
        pending = self._pending.get(title, {})
        for method in [m for m in pending if m.__name__ != "set_model"]:
            pending.pop(method)

    def hand(self, kind: str, rec: Any) -> None:
        """A lens job's record to the lens that shows it (by the job's kind)."""
        attention = self.lens(AttentionLens)
        to: dict[str, tuple[Any, Callable[..., Any]]] = {
            "attention": (attention, AttentionLens.set_attention), "head": (attention, AttentionLens.set_head),
            "step": (attention, AttentionLens.set_step), "roles": (attention, AttentionLens.set_roles),
            "logit": (attention, AttentionLens.set_logit_lens), "state": (attention, AttentionLens.set_state),
            "seq2seq": (attention, AttentionLens.set_seq2seq), "cross_step": (attention, AttentionLens.set_cross_step),
            "tensor": (self.lens(QuantLens), QuantLens.set_tensor),
            "routing": (self.lens(ExpertsLens), ExpertsLens.set_routing),
            "t5_positions": (self.lens(PositionsLens), PositionsLens.set_t5_tables)}
        if kind in to:
            self.deliver(*to[kind], rec)
        if kind == "attention":
            self.deliver(self.lens(PositionsLens), PositionsLens.set_tokens, list(rec.token_texts))
