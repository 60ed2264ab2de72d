"""LensBridge with a fake engine: the Attention lens clears on another chat and another model, sinks re-pool the grid."""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from app.controllers.lenses import LensBridge
from app.data.store import Settings
from app.jobs.lens import LensResult
from app.records.attention import make_attention_record
from app.state import AppState
from app.views.attention.lens import AttentionLens
from app.views.lenses import LensSlot
from tests.app.test_lenses_common import fake_run, synthetic_model_record


class FakeEngine(QObject):
    lens_ready = Signal(object)
    lens_failed = Signal(str, str)
    reply_event = Signal(int, object)

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[tuple[str, Any]] = []
        self.cache_type = "F16"

    def request_lens(self, kind: str, compute: Any) -> None:
        self.asked.append((kind, compute))

    def set_cache_type(self, _t: str) -> None: ...
    def set_backend(self, _b: str) -> None: ...
    def set_numerics(self, _n: str) -> None: ...


def test_attention_clears_on_chat_and_model_change_and_sinks_repool(qtbot) -> None:
    run = fake_run(40)
    engine, state = FakeEngine(), AppState(Settings())
    slot = LensSlot(AttentionLens)
    qtbot.addWidget(slot)
    bridge = LensBridge(engine, state, {"Attention": slot})  # type: ignore[arg-type]
    lens = slot.widget
    state.model_record = synthetic_model_record(3, 4, 2)
    bridge.model_loaded()
    att = make_attention_record(run.model, run.recorder, run.cache, run.texts, thumb=16)
    engine.lens_ready.emit(LensResult("attention", att))
    assert lens.attention is att and state.attention_record is att
    bridge.chat_changed()  # model A's chat, then another chat: nothing of the old tokens stays
    assert lens.attention is None and lens.grid.record is None and state.attention_record is None
    assert lens.overview.currentWidget() is lens.empty
    engine.lens_ready.emit(LensResult("attention", att))
    state.model_record = synthetic_model_record(2, 2, 1)  # model B
    bridge.model_loaded()
    assert lens.attention is None and lens.layer_box.count() == 4
    engine.lens_ready.emit(LensResult("attention", att))
    engine.asked.clear()
    lens.roles.hidden_keys_changed.emit((0, 7))  # two sinks ticked: the grid is pooled again without them
    assert bridge.hidden_keys == (0, 7) and [k for k, _ in engine.asked] == ["attention"]
    rec = engine.asked[0][1](run.model, run.recorder, run.cache, run.texts).record  # (tagged with its model)
    assert rec.hidden_keys == (0, 7)
    engine.asked.clear()
    lens.roles_requested.emit("chat")
    lens.logit_requested.emit(5, 8)
    assert [k for k, _ in engine.asked] == ["roles", "logit"]
    roles = engine.asked[0][1](run.model, run.recorder, run.cache, run.texts).record
    engine.lens_ready.emit(LensResult("roles", roles))
    assert lens.roles.record is roles
