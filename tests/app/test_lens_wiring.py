"""The lenses are wired by type: every request signal a lens declares reaches the LensRequests method that answers it.

A lens connects its own signals in `connect_requests(requests)` by reference, so a misspelt request fails when the
window is built (AttributeError), and a signal nobody connects is caught here: after the window is built, every
Signal each class in LENSES declares has a receiver. The LensBridge implements every LensRequests method, and what
a hidden lens is sent waits for its tab (the newest call per method, the model first).
"""
from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QMetaMethod, QObject, Signal

from app.controllers.lenses import LensBridge
from app.data.store import Settings
from app.jobs.lens import LensResult
from app.main_window import MainWindow
from app.records.attention import make_attention_record
from app.state import AppState
from app.views.attention.lens import AttentionLens
from app.views.attribution import WhyLens
from app.views.lenses import LENSES, LensRequests, LensSlot, LensTabs
from app.views.experts import ExpertsLens
from app.views.positions import PositionsLens
from app.views.quant.lens import QuantLens
from tests.app.controllers.test_lens_bridge import FakeEngine
from tests.app.test_lenses_common import fake_run, synthetic_model_record

REQUESTS = sorted(n for n, v in vars(LensRequests).items() if inspect.isfunction(v) and not n.startswith("_"))
DUMMY = {b"int": 1, b"QString": "blk.0.attn_q.weight", b"PyObject": None}  # one argument per Qt parameter type


class Recorder:
    """Answers exactly the LensRequests methods (or fewer) and records which were called, with what."""

    def __init__(self, names: list[str] = REQUESTS) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        for name in names:
            setattr(self, name, functools.partial(self._record, name))

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))


def declared_signals(cls: type) -> list[str]:
    """The request signals a lens class declares itself (not those of QWidget)."""
    return [n for n, v in vars(cls).items() if isinstance(v, Signal)]


def connected(widget: QObject, name: str) -> bool:
    return widget.isSignalConnected(QMetaMethod.fromSignal(getattr(widget, name)))


def emit_dummy(widget: QObject, name: str) -> None:
    signal = getattr(widget, name)
    signal.emit(*(DUMMY[bytes(t)] for t in QMetaMethod.fromSignal(signal).parameterTypes()))


def test_the_table_lists_each_lens_class_once_with_its_tab_title() -> None:
    assert [cls.title for cls in LENSES] == ["Attention", "Positions", "Quantization", "Experts", "Why"]
    assert LENSES == (AttentionLens, PositionsLens, QuantLens, ExpertsLens, WhyLens)
    for cls in LENSES:
        assert callable(cls.set_model) and callable(cls.connect_requests), cls.__name__


@pytest.mark.parametrize("cls", LENSES, ids=lambda c: c.title)
def test_each_request_signal_reaches_exactly_one_request_method(qtbot, cls: Any) -> None:
    lens = cls()
    qtbot.addWidget(lens)
    signals = declared_signals(cls)
    assert not any(connected(lens, n) for n in signals), "a bare lens must not answer its own requests"
    recorder = Recorder()
    lens.connect_requests(recorder)
    for name in signals:
        assert connected(lens, name), f"{cls.__name__}.{name} is declared but connect_requests leaves it unwired"
        recorder.calls.clear()
        emit_dummy(lens, name)
        assert len(recorder.calls) == 1 and recorder.calls[0][0] in REQUESTS, (name, recorder.calls)


def test_every_request_method_is_used_and_answered_by_the_bridge() -> None:
    reached: set[str] = set()
    for cls in LENSES:
        lens = cls()
        recorder = Recorder()
        lens.connect_requests(recorder)
        for name in declared_signals(cls):
            emit_dummy(lens, name)
        reached |= {n for n, _ in recorder.calls}
        lens.deleteLater()
    assert reached == set(REQUESTS), "a LensRequests method no lens asks for"
    for name in REQUESTS:
        want = list(inspect.signature(getattr(LensRequests, name)).parameters)
        have = list(inspect.signature(getattr(LensBridge, name)).parameters)
        assert len(have) == len(want), f"LensBridge.{name}{have} does not take what LensRequests.{name}{want} does"


@pytest.mark.parametrize("missing", ["request_block", "request_head"])
def test_a_missing_or_misspelt_request_fails_when_wiring(qtbot, missing: str) -> None:
    lens = QuantLens() if missing == "request_block" else AttentionLens()
    qtbot.addWidget(lens)
    with pytest.raises(AttributeError, match=missing):
        lens.connect_requests(Recorder([n for n in REQUESTS if n != missing]))


def test_the_window_wires_every_signal_of_every_lens(qtbot, data_dir: Path) -> None:
    w = MainWindow(load=False)
    qtbot.addWidget(w)
    try:
        assert isinstance(w.lens_tabs, LensTabs) and list(w.lens_slots) == [cls.title for cls in LENSES]
        for cls in LENSES:
            slot = w.lens_slots[cls.title]
            lens = w.lens_tabs.lens(cls)
            assert isinstance(slot, LensSlot) and slot.placeholder is None and lens is slot.widget, slot.error
            for name in declared_signals(cls):
                assert connected(lens, name), f"{cls.title}: {name} has no receiver in the window"
        editor = w.lens_tabs.lens(QuantLens).overrides
        assert w.quant_bridge.editor is editor and connected(editor, "apply_requested")
    finally:
        w.close()


def test_a_hidden_lens_gets_the_newest_call_per_method_model_first(qtbot) -> None:
    run = fake_run(12)
    engine, state = FakeEngine(), AppState(Settings())
    slots = {cls.title: LensSlot(cls) for cls in (AttentionLens, PositionsLens)}
    for slot in slots.values():
        qtbot.addWidget(slot)
    bridge = LensBridge(engine, state, slots)  # type: ignore[arg-type]
    shown = {"Attention"}
    bridge.visible = lambda title: title in shown
    positions = slots["Positions"].widget
    assert isinstance(positions, PositionsLens)
    att = make_attention_record(run.model, run.recorder, run.cache, run.texts, thumb=16)
    engine.lens_ready.emit(LensResult("attention", att))
    bridge.chat_changed()  # the tokens go: this newest call to set_tokens replaces the first
    engine.lens_ready.emit(LensResult("attention", att))  # and this one replaces it in turn (keeping its place)
    bridge.deliver(positions, PositionsLens.set_model, synthetic_model_record(2, 2, 1))  # queued after the tokens
    assert positions.model is None and positions.tokens == []
    shown.add("Positions")
    bridge.tab_shown("Positions")  # set_model after set_tokens would drop the tokens (another model's)
    assert positions.model is not None and positions.tokens == list(att.token_texts)
    bridge.tab_shown("Positions")  # nothing is left to give
    assert bridge.deliver(None, PositionsLens.set_tokens, []) is None  # a lens that could not be built: no-op
