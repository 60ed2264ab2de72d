"""LensBridge: lens widgets ask through signals, the engine answers on a worker, records come back to them.

It also keeps the KV cache in step: the engine's cache type follows the settings, and the KVInfo each
reply sends after its prefill goes into the state (type, bytes now and at full context, attention path).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

from PySide6.QtCore import QObject

from app.jobs.lens import ATTENTION_MAX_ROWS, LensResult
from app.records.kv import KVInfo, backend_setting, cache_type_setting, kv_bytes_for, numerics_setting
from app.state import AppState
from app.views.lenses import LensSlot
from app.workers.engine import Engine

log = logging.getLogger(__name__)

LIVE_MIN_S = 2.0  # live attention overviews while a reply streams: at most this often...
LIVE_COST_FACTOR = 4.0  # ...and never more than 1/4 of the time (the overview pauses generation while it runs)
LIVE_MAX_ROWS = 64


def _attention(max_rows: int | None, hidden: tuple[int, ...] = (0,)) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.attention import make_attention_record  # noqa: PLC0415

        if cache is None or recorder is None or min(cache.length, recorder.length) == 0 or not recorder.specs:
            return None
        return make_attention_record(model, recorder, cache, texts, max_rows=max_rows, hidden_keys=hidden)

    return compute


def _roles(source: str) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.head_roles import make_head_roles_record, make_probe_record  # noqa: PLC0415

        if source == "probe":
            return make_probe_record(model)
        if cache is None or recorder is None or min(cache.length, recorder.length) < 2 or not recorder.specs:
            return None
        return make_head_roles_record(model, recorder, cache, texts)

    return compute


def _logit(position: int, width: int, memo: dict[str, Any]) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.logit_lens import make_logit_lens_record  # noqa: PLC0415

        if cache is None or cache.length == 0:
            return None
        if memo.get("cache") is not cache:  # another chat or model: the kept streams are not this context's
            memo.clear()
            memo.update(cache=cache, streams={})
        return make_logit_lens_record(model, list(cache.tokens), position if position >= 0 else None, width=width,
                                      memo=memo["streams"])

    return compute


def _head(layer: Any, head: Any, rows: Any) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.attention import make_head_record  # noqa: PLC0415

        if cache is None or recorder is None or min(cache.length, recorder.length) == 0 or not recorder.specs:
            return None
        return make_head_record(model, recorder, cache, layer, head, rows, texts)

    return compute


def _step(layer: int, head: int, query: int) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.attention import make_step_record  # noqa: PLC0415

        if cache is None or recorder is None or min(cache.length, recorder.length) == 0 or not recorder.specs:
            return None
        return make_step_record(model, recorder, cache, texts, layer, head, query)

    return compute


def _tensor(name: str, block: int) -> Callable[..., Any]:
    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        from app.records.tensor import make_tensor_record  # noqa: PLC0415

        return make_tensor_record(model, name, block_index=block)

    return compute


class LensBridge(QObject):
    """Connects the lens slots to the engine and feeds them the records they understand."""

    def __init__(self, engine: Engine, state: AppState, slots: dict[str, LensSlot], parent: QObject | None = None):
        super().__init__(parent)
        self.engine = engine
        self.state = state
        self.slots = slots
        self.visible: Callable[[str], bool] = lambda title: True
        self._live_at = 0.0
        self._live_cost = 0.0
        self._asked_at = 0.0
        self._pending: dict[str, dict[str, tuple[Any, ...]]] = {}  # hidden lens -> method -> latest args
        self.hidden_keys: tuple[int, ...] = (0,)  # the keys "hide sinks" hides in the attention grid
        self._logit_memo: dict[str, Any] = {}  # the logit lens's last residual streams (worker side only)
        engine.lens_ready.connect(self._ready)
        engine.reply_event.connect(lambda _rid, item: self.kv_info(item) if isinstance(item, KVInfo) else None)
        state.settings_changed.connect(lambda s: engine.set_cache_type(cache_type_setting(s)))
        engine.set_cache_type(cache_type_setting(state.settings))
        state.settings_changed.connect(lambda s: engine.set_backend(backend_setting(s)))
        engine.set_backend(backend_setting(state.settings))
        state.settings_changed.connect(lambda s: engine.set_numerics(numerics_setting(s)))
        engine.set_numerics(numerics_setting(state.settings))
        engine.lens_failed.connect(self._failed)
        for slot in slots.values():
            slot.ready.connect(lambda _w, s=slot: self.attach(s))
            if slot.widget is not None:
                self.attach(slot)

    def attach(self, slot: LensSlot) -> None:
        """Connect a freshly built lens widget and give it what is known already."""
        w = slot.widget
        for signal, handler in (
            ("head_requested", lambda layer, head, rows: self.engine.request_lens("head", _head(layer, head, rows))),
            ("attention_requested", lambda max_rows: self.request_attention(max_rows)),
            ("step_requested", lambda layer, head, query: self.engine.request_lens("step", _step(layer, head, query))),
            ("tensor_requested", lambda name: self.engine.request_lens("tensor", _tensor(name, 0))),
            ("block_requested", lambda name, i: self.engine.request_lens("tensor", _tensor(name, int(i)))),
            ("roles_requested", lambda source: self.engine.request_lens("roles", _roles(str(source)))),
            ("logit_requested", lambda pos, width: self.engine.request_lens("logit", _logit(int(pos), int(width),
                                                                                           self._logit_memo))),
            ("hidden_keys_changed", self.set_hidden_keys),
        ):
            sig = getattr(w, signal, None)
            if sig is not None:
                sig.connect(handler)
        self.feed(slot)

    def feed(self, slot: LensSlot) -> None:
        st = self.state
        title = slot.spec.title
        self._pending.pop(title, None)
        if st.model_record is not None:
            self.deliver(title, "set_model", st.model_record)
        rec = st.attention_record
        if rec is not None:
            self.deliver(title, "set_attention", rec)
            self.deliver(title, "set_tokens", list(rec.token_texts))

    def deliver(self, title: str, method: str, *args: Any) -> None:
        """Call the lens now if it is on screen, else keep the newest call for when its tab is shown."""
        slot = self.slots.get(title)
        if slot is None or slot.widget is None or not hasattr(slot.widget, method):
            return
        if self.visible(title):
            slot.call(method, *args)
        else:
            self._pending.setdefault(title, {})[method] = args

    def tab_shown(self, title: str) -> None:
        """A lens tab came on screen: give it what arrived while it was hidden (the model first)."""
        pending = self._pending.pop(title, {})
        slot = self.slots.get(title)
        if slot is None:
            return
        for method in sorted(pending, key=lambda m: m != "set_model"):
            slot.call(method, *pending[method])

    def set_hidden_keys(self, keys: Any) -> None:
        """The keys "hide sinks" hides changed: the grid is pooled again without them."""
        keys = tuple(sorted(int(k) for k in keys)) or (0,)
        if keys != self.hidden_keys:
            self.hidden_keys = keys
            if self.state.attention_record is not None:
                self.request_attention(ATTENTION_MAX_ROWS)

    def chat_changed(self) -> None:
        """Another chat is shown: the lenses drop the previous chat's tokens and maps."""
        self.state.attention_record = None
        self.hidden_keys = (0,)
        self._pending.pop("Attention", None)  # what was queued for the old chat must not land after the clear
        self.deliver("Attention", "clear_chat")

    def model_loaded(self) -> None:
        """A new model: every lens starts over with its ModelRecord (the old model's attention is gone)."""
        self.hidden_keys = (0,)
        self.state.attention_record = None
        for slot in self.slots.values():
            self.feed(slot)
        st = self.state
        st.kv_type = self.engine.cache_type  # the load made a fresh cache of this type
        st.kv_full_bytes = kv_bytes_for(st.model_record, st.ctx_size, st.kv_type) if st.model_record else None
        st.attention_path = ""
        self.deliver("Attention", "set_attention_path", "")

    def kv_info(self, info: KVInfo) -> None:
        """A reply's prefill ran: the cache's type and bytes, and the attention path it took, into the state."""
        st = self.state
        st.kv_type, st.kv_bytes, st.kv_full_bytes = info.cache_type, info.kv_bytes, info.full_bytes
        st.ctx_used, st.ctx_size = info.n_tokens, info.n_ctx
        if info.attention_path:
            st.attention_path = info.attention_path
            self.deliver("Attention", "set_attention_path", info.attention_path)

    def request_attention(self, max_rows: int | None = ATTENTION_MAX_ROWS) -> None:
        self._asked_at = time.perf_counter()
        self.engine.request_lens("attention", _attention(max_rows, self.hidden_keys))

    def reply_progress(self) -> None:
        """A token arrived: refresh the attention overview now and then, if someone is looking at it."""
        if not self.visible("Attention"):
            return
        now = time.perf_counter()
        if now - self._live_at < max(LIVE_MIN_S, LIVE_COST_FACTOR * self._live_cost):
            return
        self._live_at = now
        self.request_attention(LIVE_MAX_ROWS)

    def reply_finished(self, cancelled: bool) -> None:
        if not cancelled:
            self.request_attention(ATTENTION_MAX_ROWS)

    def _failed(self, kind: str, message: str) -> None:
        log.info("lens %s: %s", kind, message)
        if kind in ("roles", "logit"):  # the view that asked says so instead of waiting for ever
            self.deliver("Attention", "lens_failed", kind, message)

    def _ready(self, result: LensResult) -> None:
        rec = result.record
        if rec is None:
            return
        if result.kind == "attention":
            self._live_cost = getattr(rec, "elapsed_s", 0.0)
            self.state.attention_record = rec
            self.deliver("Attention", "set_attention", rec)
            self.deliver("Positions", "set_tokens", list(rec.token_texts))
        elif result.kind == "head":
            self.deliver("Attention", "set_head", rec)
        elif result.kind == "step":
            self.deliver("Attention", "set_step", rec)
        elif result.kind == "roles":
            self.deliver("Attention", "set_roles", rec)
        elif result.kind == "logit":
            self.deliver("Attention", "set_logit_lens", rec)
        elif result.kind == "tensor":
            self.deliver("Quantization", "set_tensor", rec)
