"""LensBridge: lens widgets ask through signals, the engine answers on a worker, records come back to them.

Every lens follows the conversation on screen (`Conversation.shown_request`): the reply version shown, a chat
reopened after a restart. Each request runs on the cache holding that conversation (app.jobs.lens.in_context:
one prefill on the worker when it holds another), and a record of another conversation is dropped when it
arrives. When what is on screen changes without a reply (another version, another chat), the lenses drop
what they show and read the new conversation once, when the Attention or Positions tab is on screen.

It also keeps the KV cache in step: the engine's cache type follows the settings, and the KVInfo each
reply sends after its prefill goes into the state (type, bytes now and at full context, attention path).

A hybrid's recurrent layers are decomposed into read maps on the worker (engine.observe.recurrent_maps); the
bridge keeps a ReadsMemo that only the worker touches, so the grid, a head and head roles of one reply decompose
each layer once (the memo knows a recording that changed).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtCore import QObject

from app.controllers.attribution_feed import KINDS as WHY_KINDS
from app.controllers.attribution_feed import AttributionFeed
from app.controllers.lens_feed import LensFeeder
from app.jobs import lens_computes as lc
from app.jobs.lens import ATTENTION_MAX_ROWS, InContext, LensResult, in_context
from app.records.kv import KVInfo, backend_setting, cache_type_setting, kv_bytes_for, numerics_setting
from app.records.reply import GenerationRequest
from app.state import AppState
from app.views.attention.lens import AttentionLens
from app.views.experts import ExpertsLens
from app.views.lenses import LensSlot
from app.views.positions import PositionsLens
from app.workers.engine import Engine

log = logging.getLogger(__name__)

LIVE_MIN_S = 2.0  # live attention overviews while a reply streams: at most this often...
LIVE_COST_FACTOR = 15.0  # ...and the live records (overview, head, routing) never more than 1/15 of the time:
# each pauses the reply while it runs (benchmarks/lens_overhead.py measures what a lens on screen costs)
LIVE_MAX_ROWS = 64
READING_TEXT = ("Reading this chat: the conversation shown (the reply versions on screen) runs once through the "
                "model to show its attention…")
NO_TOKENS = "this chat has no tokens yet: send a message first"
NO_MODEL_TEXT = "This chat's attention is shown once a model is loaded."
LIVE_ROUTING_S = 1.0  # the Experts lens follows a streaming reply at most this often


@dataclass(frozen=True)
class _OfModel:
    """A lens record and the model serial it was asked under (LensBridge._serial)."""

    serial: int
    record: Any


class LensBridge(LensFeeder, QObject):
    """Answers the lenses' requests (it implements app.views.lenses.LensRequests) and feeds them their records."""

    def __init__(self, engine: Engine, state: AppState, slots: dict[str, LensSlot], parent: QObject | None = None):
        super().__init__(parent)
        self.engine = engine
        self.state = state
        self.slots = slots
        self.visible: Callable[[str], bool] = lambda title: True
        self._live_at = 0.0
        self._routing_at = 0.0
        self._live_cost = 0.0
        self._asked_at = 0.0
        self._pending = {}  # hidden lens -> method -> newest call (LensFeeder)
        self.hidden_keys: tuple[int, ...] = (0,)  # the keys "hide sinks" hides in the attention grid
        self._logit_memo: dict[str, Any] = {}  # the logit lens's last residual streams (worker side only)
        self._context_memo: dict[str, Any] = {}  # the conversation the cache was last brought to (worker side only)
        from engine.observe.recurrent_maps import ReadsMemo  # noqa: PLC0415 - numpy only

        self._reads_memo = ReadsMemo()  # a hybrid's recurrent layers decomposed (worker side only)
        self.conversation: Any = None  # app.controllers.conversation.Conversation: what is on screen
        self._shown: GenerationRequest | None = None  # the conversation the lenses' records describe
        self._want: GenerationRequest | None = None  # the conversation the lenses were cleared for and wait for
        self._due = False  # _want is read when the Attention or Positions tab comes on screen
        self._reply_chat = ""  # id of the chat whose reply is (or was last) being made
        self._asked: GenerationRequest | None = None  # the newest conversation asked for (read on the worker)
        self._serial = 0  # one more per model loaded: a record computed for an earlier model is dropped
        self._read_after_reply = False  # a reply ended: read it whole when its thread lets go of the cache
        engine.lens_ready.connect(self._ready)
        engine.reply_event.connect(lambda _rid, item: self.kv_info(item) if isinstance(item, KVInfo) else None)
        state.settings_changed.connect(lambda s: engine.set_cache_type(cache_type_setting(s)))
        engine.set_cache_type(cache_type_setting(state.settings))
        state.settings_changed.connect(lambda s: engine.set_backend(backend_setting(s)))
        engine.set_backend(backend_setting(state.settings))
        state.settings_changed.connect(lambda s: engine.set_numerics(numerics_setting(s)))
        engine.set_numerics(numerics_setting(state.settings))
        engine.lens_failed.connect(self._failed)
        self.why = AttributionFeed(self)  # the Why lens's requests and records (app.controllers.attribution_feed)
        for slot in slots.values():
            self.attach(slot)

    def bind_conversation(self, conversation: Any) -> None:
        """Follow a Conversation: its shown turns are the context of every lens request."""
        if self.conversation is conversation:
            return
        self.conversation = conversation
        conversation.messages_changed.connect(self._messages_changed)
        conversation.generating_changed.connect(self._generating_changed)

    def attach(self, slot: LensSlot) -> None:
        """Connect a lens's request signals to the methods below and give it what is known already."""
        slot.connect_requests(self)
        self.feed(slot)

    # ---- the requests (LensRequests)

    def request_head(self, layer: Any, head: Any, rows: Any) -> None:
        self._ask("head", lc.head(layer, head, rows, self._reads_memo))

    def request_state(self) -> None:
        """A hybrid's State view: what each recurrent layer's tokens wrote and kept, and what the state costs."""
        rec = self.state.model_record
        if rec is not None and getattr(rec, "recurrent", ()):
            self._ask("state", lc.state())

    def request_step(self, layer: int, head: int, query: int) -> None:
        self._ask("step", lc.step(layer, head, query))

    def request_tensor(self, name: str) -> None:
        self._request("tensor", lc.tensor(name, 0))

    def request_block(self, name: str, index: int) -> None:
        self._request("tensor", lc.tensor(name, int(index)))

    def request_roles(self, source: str) -> None:
        if str(source) == "probe":  # the probe is its own context: the chat's is not needed
            self._request("roles", lc.roles("probe"))
        else:
            self._ask("roles", lc.roles(str(source), self._reads_memo))

    def request_logit(self, position: int, width: int) -> None:
        self._ask("logit", lc.logit(int(position), int(width), self._logit_memo))

    def request_routing(self) -> None:
        """The Experts lens's record, when the model has experts (nothing to ask of a dense model)."""
        experts = self.lens(ExpertsLens)
        if experts is not None and experts.wants_routing():
            self._routing_at = time.perf_counter()
            self._ask("routing", lc.routing())

    def request_seq2seq(self) -> None:
        """An encoder-decoder model's attention record (read from the cache as it is: app.jobs.seq2seq)."""
        from app.jobs.seq2seq import seq2seq_maps  # noqa: PLC0415

        if self._seq2seq():
            self._request("seq2seq", seq2seq_maps(self.shown_context()))

    def request_cross_step(self, layer: int, head: int, query: int) -> None:
        from app.jobs.seq2seq import cross_step  # noqa: PLC0415

        if self._seq2seq():
            self._request("cross_step", cross_step(int(layer), int(head), int(query), self.shown_context()))

    def request_attribution(self, token_index: int, contrast: str, method: str) -> None:
        self.why.request(token_index, contrast, method)

    def request_ablation(self, what: Any) -> None:
        self.why.confirm(what)

    def stop_attribution(self) -> None:
        self.why.stop()

    def request_attribution_pair(self, what: Any) -> None:
        self.why.request_pair(what)

    def _seq2seq(self) -> bool:
        """Whether the model is an encoder-decoder (its lenses read the cache as it is, never a conversation)."""
        rec = self.state.model_record
        return bool(rec is not None and getattr(rec, "encoder_decoder", False))

    def _request(self, kind: str, compute: Callable[..., Any]) -> None:
        """Ask the engine for a lens record, tagged with the model it is asked of (see `_ready`)."""
        serial = self._serial

        def tagged(*args: Any) -> _OfModel:
            return _OfModel(serial, compute(*args))

        self.engine.request_lens(kind, tagged)

    # ---- the conversation on screen

    def shown_context(self) -> GenerationRequest | None:
        """The conversation on screen (None: no chat bound, no turns, or a reply is being made)."""
        conv = self.conversation
        return conv.shown_request() if conv is not None else None

    def _ask(self, kind: str, compute: Callable[..., Any]) -> GenerationRequest | None:
        """Ask the engine for a lens record of the conversation on screen; returns that conversation (None: the
        cache as it is, while a reply is being made)."""
        if self._seq2seq():  # the decoder-only lenses would prefill the decoder with the conversation
            if kind in ("roles", "logit", "head", "step", "state"):
                self.deliver(self.lens(AttentionLens), AttentionLens.lens_failed, kind,
                             "not shown for an encoder-decoder model: see its Encoder-decoder view")
            return None
        context = self.shown_context()
        conv = self.conversation
        if context is None and conv is not None and not conv.generating:  # an empty chat: nothing to read
            if kind in ("roles", "logit", "state"):  # say what to do instead of reading another chat's tokens
                self.deliver(self.lens(AttentionLens), AttentionLens.lens_failed, kind, NO_TOKENS)
            return None
        if context is not None:
            session = getattr(self.engine, "session", None)
            generating = session.generating.is_set if session is not None else (lambda: False)
            self._asked = context
            compute = in_context(compute, context, self._context_memo, generating, self._still_asked)
        self._request(kind, compute)
        return context

    def _still_asked(self, context: GenerationRequest) -> bool:
        """On the worker: whether `context` is still the newest conversation asked for (no reply since)."""
        return self._asked == context

    def context_changed(self) -> None:
        """What is on screen may have changed without a reply (another version, another chat, a new model): if the
        lenses show another conversation, they drop it and read this one once (when a lens that needs it is on
        screen), saying so meanwhile."""
        self.why.context_changed()
        want = self.shown_context()
        if want is None or want == self._shown or want == self._want:
            return
        if self._shown is not None or self.state.attention_record is not None:
            self._clear_chat()
        self._shown, self._want = None, want
        if self.state.model_record is None:  # model_loaded asks again
            self.deliver(self.lens(AttentionLens), AttentionLens.waiting, NO_MODEL_TEXT)
            return
        self.deliver(self.lens(AttentionLens), AttentionLens.waiting, READING_TEXT)
        self._due = True
        if any(self.visible(t) for t in (AttentionLens.title, PositionsLens.title, ExpertsLens.title)):
            self._read()

    def _read(self) -> None:
        """Read the conversation the lenses wait for (one prefill on the worker, then the attention overview)."""
        self._due = False
        self.request_attention(ATTENTION_MAX_ROWS)
        self.request_routing()

    def _messages_changed(self, chat_id: str) -> None:
        conv = self.conversation
        if conv is not None and conv.current is not None and conv.current.id == chat_id:
            self.context_changed()

    def _generating_changed(self, on: bool) -> None:
        conv = self.conversation
        current = conv.current.id if conv is not None and conv.current is not None else ""
        if on:
            self._asked = None  # a lens request still waiting must not bring the cache back to an older context
            self._reply_chat = current  # its live records are this chat's; nothing is waiting to be read now
            self._want, self._due, self._shown = None, False, None
            self.deliver(self.lens(AttentionLens), AttentionLens.new_reply)  # scores of the old context go
            return
        self.deliver(self.lens(AttentionLens), AttentionLens.reply_ended)
        self.why.reply_ended()
        if current == self._reply_chat and self.state.attention_record is not None:
            self._shown = self.shown_context()  # the lenses show the reply just made, as the chat shows it
        else:
            self.context_changed()
        self._reply_read()

    def _current_chat(self) -> str:
        conv = self.conversation
        return conv.current.id if conv is not None and conv.current is not None else ""

    # ---- feeding the lenses

    def tab_shown(self, title: str) -> None:
        """A lens tab came on screen: give it what arrived while it was hidden (the model first); the Attention
        and Positions tabs read the conversation shown when it is not read yet."""
        pending = self._pending.pop(title, {})
        slot = self.slots.get(title)
        if slot is None or slot.widget is None:
            return
        set_model = type(slot.widget).set_model
        for method in sorted(pending, key=lambda m: m is not set_model):
            self._call(title, pending[method])
        if self._due and title in (AttentionLens.title, PositionsLens.title, ExpertsLens.title):
            self._read()
        elif title == ExpertsLens.title:
            self.request_routing()
        elif title == self.why.title:
            self.why.shown()

    def set_hidden_keys(self, keys: Any) -> None:
        """The keys "hide sinks" hides changed: the grid is pooled again without them."""
        keys = tuple(sorted(int(k) for k in keys)) or (0,)
        if keys != self.hidden_keys:
            self.hidden_keys = keys
            if self.state.attention_record is not None:
                self.request_attention(ATTENTION_MAX_ROWS)

    def chat_changed(self) -> None:
        """Another chat is shown: the lenses drop the previous chat's tokens and maps, and read this one's."""
        self._clear_chat()
        self._shown = self._want = None
        self._due = False
        self.context_changed()

    def _clear_chat(self) -> None:
        self.state.attention_record = None
        self.hidden_keys = (0,)
        self.deliver(self.lens(PositionsLens), PositionsLens.set_tokens, [])  # the other chat's tokens are not this one's
        self._drop_pending(AttentionLens.title)  # what was queued for the old chat must not land after the clear
        self.deliver(self.lens(AttentionLens), AttentionLens.clear_chat)
        self._drop_pending(ExpertsLens.title)
        self.deliver(self.lens(ExpertsLens), ExpertsLens.clear_chat)

    def model_loaded(self) -> None:
        """A new model: every lens starts over with its ModelRecord (the old model's attention is gone) and reads
        the chat on screen again; the last model's speed is not this one's."""
        self._serial += 1  # what was asked of the last model is not this one's
        self.hidden_keys = (0,)
        self.state.attention_record = None
        self.state.tok_s = 0.0
        self._context_memo_reset()
        self.why.model_loaded()
        for slot in self.slots.values():
            self.feed(slot)
        self._shown = self._want = None
        self._due = False
        self.context_changed()
        st = self.state
        st.kv_type = self.engine.cache_type  # the load made a fresh cache of this type
        st.kv_full_bytes = kv_bytes_for(st.model_record, st.ctx_size, st.kv_type) if st.model_record else None
        st.attention_path = ""
        self.deliver(self.lens(AttentionLens), AttentionLens.set_attention_path, "")
        if self._seq2seq():
            from app.jobs.seq2seq import position_tables  # noqa: PLC0415

            self._request("t5_positions", position_tables())
            self.request_seq2seq()

    def kv_info(self, info: KVInfo) -> None:
        """A reply's prefill ran: the cache's type and bytes, and the attention path it took, into the state."""
        st = self.state
        st.kv_type, st.kv_bytes, st.kv_full_bytes = info.cache_type, info.kv_bytes, info.full_bytes
        st.ctx_used, st.ctx_size = info.n_tokens, info.n_ctx
        if info.attention_path:
            st.attention_path = info.attention_path
            self.deliver(self.lens(AttentionLens), AttentionLens.set_attention_path, info.attention_path)

    def request_attention(self, max_rows: int | None = ATTENTION_MAX_ROWS) -> None:
        self._asked_at = time.perf_counter()
        if self._seq2seq():
            self.request_seq2seq()
            return
        self._ask("attention", lc.attention(max_rows, self.hidden_keys, self._reads_memo))

    def reply_progress(self) -> None:
        """A token arrived: refresh the attention overview (and the Experts lens) now and then, if someone is
        looking at it (at the chat being answered: another chat's lenses must not show this reply)."""
        if self._current_chat() != self._reply_chat:
            return
        if self.visible(ExpertsLens.title) and time.perf_counter() - self._routing_at >= max(
                LIVE_ROUTING_S, LIVE_COST_FACTOR * self._live_cost):
            self.request_routing()
        if not self.visible(AttentionLens.title):
            return
        now = time.perf_counter()
        if now - self._live_at < max(LIVE_MIN_S, LIVE_COST_FACTOR * self._live_cost):
            return
        self._live_at = now
        self.request_attention(LIVE_MAX_ROWS)

    def reply_finished(self, cancelled: bool) -> None:
        """A reply ended (or was stopped): its chat's lenses read it whole once the reply's thread has let go of the
        cache (until then a request would read the cache as it is, without the reply's last token)."""
        self._read_after_reply = True
        conv = self.conversation
        if conv is None or not conv.generating:
            self._reply_read()

    def _reply_read(self) -> None:
        """Read the reply just made, whole, if a lens that shows it is on screen; else when one comes on screen."""
        if self._read_after_reply and self._current_chat() == self._reply_chat:
            if any(self.visible(t) for t in (AttentionLens.title, PositionsLens.title, ExpertsLens.title)):
                self.request_attention(ATTENTION_MAX_ROWS)
                self.request_routing()
            else:  # no lens looks: nothing runs now (tab_shown reads it)
                self._shown, self._want, self._due = None, self.shown_context(), True
        self._read_after_reply = False

    def _failed(self, kind: str, message: str) -> None:
        log.info("lens %s: %s", kind, message)
        if kind in WHY_KINDS:
            self.why.failed(kind, message)
        if kind in ("roles", "logit", "attention", "state"):  # the view that asked says so instead of waiting for ever
            self.deliver(self.lens(AttentionLens), AttentionLens.lens_failed, kind, message)

    def _current(self, result: LensResult) -> tuple[bool, Any]:
        """(whether the result belongs on screen, its record): a record of another conversation than the one
        shown is dropped (the screen moved on while it was computed)."""
        rec = result.record
        if isinstance(rec, InContext):
            if rec.context != self.shown_context():
                return False, None
            if result.kind == "attention" and rec.context == self._want:
                self._shown, self._want = rec.context, None
            if result.kind == "attention" and rec.n_tokens:  # the cache holds this conversation now
                self.state.ctx_used, self.state.kv_bytes = rec.n_tokens, rec.kv_bytes
            return True, rec.record
        if result.kind in ("tensor", "t5_positions") or (result.kind == "roles" and getattr(rec, "source", "") == "probe"):
            return True, rec  # of the model alone
        if result.kind in ("seq2seq", "cross_step"):  # an encoder-decoder's last input and output, of any chat
            return True, rec
        # read from the cache as it was, while a reply was being made: that reply's chat only, and not once the
        # lenses were cleared for another conversation
        return self._want is None and self._current_chat() == self._reply_chat, rec

    def _context_memo_reset(self) -> None:
        from engine.observe.recurrent_maps import ReadsMemo  # noqa: PLC0415

        self._context_memo = {}  # a fresh dict: a job still running keeps (and fills) the old one
        self._reads_memo = ReadsMemo()  # another model: its reads go with it

    def _ready(self, result: LensResult) -> None:
        tag = result.record
        if isinstance(tag, _OfModel):
            if tag.serial != self._serial:
                return  # computed for the model loaded before this one
            result = LensResult(result.kind, tag.record)
        keep, rec = self._current(result)
        if not keep:
            return
        if result.kind in WHY_KINDS:
            self.why.ready(result.kind, rec)
            return
        if rec is None:
            if result.kind in ("roles", "logit", "state"):  # nothing to score or decode: say what to do
                self.deliver(self.lens(AttentionLens), AttentionLens.lens_failed, result.kind, NO_TOKENS)
            return
        if result.kind in ("head", "routing") and self.conversation is not None and self.conversation.generating:
            self._live_cost += float(getattr(rec, "elapsed_s", 0.0))  # a live record's cost: the cycle's sum
        if result.kind == "attention":
            self._live_cost = float(rec.elapsed_s)
            self.state.attention_record = rec
        self.hand(result.kind, rec)
