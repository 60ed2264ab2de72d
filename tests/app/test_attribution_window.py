"""The Why lens in the real window, on the tiny random llama: before a reply it says there is nothing to explain;
after one (the tab on screen) it explains the reply's last token by itself, and the record's parts sum to the logit
the engine's own forward pass gives for that token after its predecessors; Confirm by ablation switches the picked
head off for real and reports the logit with and without it (the model's ablation is put back after); a contrast
that is not one token is refused with the engine's message. "A and B" says to run a comparison first, then (after one,
B the file as Q4_0) splits the same token in both: A's is the chat's number, each side sums to its own logit. Another version of the reply is explained when it ends,
and going back to the first shows its record again from the memo (cached per reply version).
The LensBridge asks for Why records only when there is something to explain (a decoder-only model, a reply), and drops
a record of another conversation, of the model before, or of a job that was stopped."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from app.jobs.attribution import conversation_ids
from app.records.compare import CompareOptions
from app.views.attribution import WhyLens
from engine.intervene.ablation import current
from engine.model import load_model
from tests.app.windows import greedy_window
from tests.tiny_models import make_tiny_llama

WAIT_MS = 120_000  # a hang guard, not a speed


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("why") / "llama.gguf")


def test_why_explains_the_last_reply_token_and_confirms_a_head(qtbot, llama: Path, data_dir: Path) -> None:
    w = greedy_window(qtbot, llama, data_dir, max_tokens=6)
    try:
        lens = w.lens_tabs.select("Why")
        assert isinstance(lens, WhyLens)
        qtbot.waitUntil(lambda: "send a message" in lens.empty.text().lower(), timeout=WAIT_MS)
        assert lens.record is None

        assert w.conversation.send("Tell me a story")
        qtbot.waitUntil(lambda: not w.conversation.generating, timeout=WAIT_MS)
        qtbot.waitUntil(lambda: lens.record is not None and not lens.busy, timeout=WAIT_MS)  # followed the reply
        rec = lens.record
        reply = w.conversation.current.messages[-1]
        assert reply.role == "assistant" and reply.tokens
        assert rec.target_id == reply.tokens[-1][0] and rec.contrast_id is None
        assert rec.token_index == len(rec.token_texts) - 1
        assert rec.reply_start == rec.token_index + 1 - len(reply.tokens)

        # the engine's own number: its forward pass over the predecessors, the logit of the token the reply wrote
        model = load_model(str(llama))
        ids, _start = conversation_ids(model, None, w.bridge.shown_context())
        assert ids[rec.token_index] == rec.target_id
        logits = model.net.forward(ids[: rec.token_index], model.new_cache(len(ids)), None, all_logits=False)[-1]
        assert float(np.sum(rec.values)) == pytest.approx(rec.logit_diff, abs=1e-4)
        assert rec.logit_diff == pytest.approx(float(logits[rec.target_id]), abs=1e-4)
        assert rec.heads.shape == (model.args.n_layers, model.args.n_heads)

        lens.run()  # the same question again: answered from the memo, the same record
        qtbot.waitUntil(lambda: not lens.busy, timeout=WAIT_MS)
        assert lens.record is rec and len(w.bridge.why.memo) == 1

        i = lens.selected
        assert i is not None and rec.kinds[i] == "head" and lens.confirm_button.isEnabled()
        lens.confirm_button.click()
        qtbot.waitUntil(lambda: lens.check is not None and not lens.busy, timeout=WAIT_MS)
        check = lens.check
        assert (check.kind, check.layer, check.index) == ("head", int(rec.layers[i]), int(rec.indices[i]))
        assert check.base == pytest.approx(rec.logit_diff, abs=1e-4) and np.isfinite(check.ablated)
        assert check.ablated != check.base and check.estimate == pytest.approx(float(rec.values[i]))
        assert "switched off" in lens.check_label.text()
        assert current(w.engine.session.model).empty  # the ablation was put back

        # the same token in A and B of the Compare tab's last comparison (B: the file as Q4_0)
        lens.request_pair()
        qtbot.waitUntil(lambda: lens.pair_button.isEnabled(), timeout=WAIT_MS)
        assert "comparison" in lens.pair_status.text() and lens.pair is None  # none run yet: it says what to do
        w.quant_bridge.run_compare(CompareOptions(b_source="preset", b_preset="Q4_0", text="A short text to compare.",
                                                  max_tokens=16))
        qtbot.waitUntil(lambda: w.compare_view.record is not None, timeout=WAIT_MS)
        lens.request_pair()
        qtbot.waitUntil(lambda: lens.pair is not None, timeout=WAIT_MS)
        pair = lens.pair
        assert pair.a.token_index == pair.b.token_index == rec.token_index and pair.b.target_id == rec.target_id
        assert pair.a.logit_diff == pytest.approx(rec.logit_diff, abs=1e-4)  # A is the file the chat runs
        for side in (pair.a, pair.b):
            assert float(np.sum(side.values)) == pytest.approx(side.logit_diff, abs=1e-4)
        assert pair.b.logit_diff != pair.a.logit_diff and "Q4_0" in pair.b_label  # the quantization moved it
        assert lens.plots_b.record is pair.b and lens.moved_text().startswith("What the change moved most")

        # another version of the reply: explained when it ends; back on the first, its record comes from the memo
        w.state.settings = dataclasses.replace(w.state.settings, max_tokens=3)  # greedy: the first 3 tokens of it
        w.conversation.regenerate()
        qtbot.waitUntil(lambda: not w.conversation.generating, timeout=WAIT_MS)
        second = w.conversation.current.messages[-1]
        assert len(second.tokens) == 3 and len(reply.tokens) == 6
        qtbot.waitUntil(lambda: lens.record is not rec and lens.record is not None and not lens.busy, timeout=WAIT_MS)
        assert lens.record.target_id == second.tokens[-1][0]
        w.conversation.select_version(len(w.conversation.current.messages) - 1, 0)
        qtbot.waitUntil(lambda: lens.record is rec and not lens.busy, timeout=WAIT_MS)  # the same object: cached
        assert len(w.bridge.why.memo) == 2

        lens.contrast_edit.setText("Tell me a story about a dragon")
        lens.run()
        qtbot.waitUntil(lambda: not lens.busy, timeout=WAIT_MS)
        assert "not one token" in lens.status.text() and lens.record is rec  # refused; what was shown stays
    finally:
        w.close()


class FakeConversation:
    """What the LensBridge reads of the chat: the conversation on screen (None: no reply yet)."""

    def __init__(self, context: object) -> None:
        self.context, self.generating, self.current = context, False, None

    def shown_request(self) -> object:
        return self.context


def test_the_bridge_asks_routes_and_drops_why_records(qtbot) -> None:
    from app.controllers.lenses import LensBridge, _OfModel
    from app.data.store import Settings
    from app.jobs.attribution import NO_REPLY
    from app.jobs.lens import InContext, LensResult
    from app.records.reply import GenerationRequest
    from app.state import AppState
    from app.views.lenses import LensSlot
    from tests.app.controllers.test_lens_bridge import FakeEngine
    from tests.app.test_lenses_common import synthetic_model_record
    from tests.app.views.test_attribution_view import record

    engine, state = FakeEngine(), AppState(Settings())
    slot = LensSlot(WhyLens)
    qtbot.addWidget(slot)
    bridge = LensBridge(engine, state, {WhyLens.title: slot})  # type: ignore[arg-type]
    lens = slot.widget
    assert isinstance(lens, WhyLens)
    state.model = object()  # a model is loaded (its ModelInfo: anything but None)
    t5 = synthetic_model_record(3, 4)
    state.model_record = type(t5)(**{**t5.__dict__, "encoder_decoder": True})
    bridge.model_loaded()
    bridge.conversation = FakeConversation(None)
    lens.ask(-1)
    why = lambda: [k for k, _ in engine.asked if k.startswith("why")]  # noqa: E731
    assert NO_REPLY in lens.empty.text() and not why() and not lens.busy  # T5 as any model: no reply yet

    state.model_record = synthetic_model_record(3, 4)
    bridge.model_loaded()
    bridge.conversation = FakeConversation(None)
    lens.ask(-1)
    assert NO_REPLY in lens.empty.text() and not why() and not lens.busy

    ctx = GenerationRequest(messages=(("user", "hi"),), continue_ids=(1, 2, 3))
    bridge.conversation.context = ctx
    lens.ask(-1)
    assert why() == ["why"] and lens.busy
    rec = record()
    engine.lens_ready.emit(LensResult("why", _OfModel(bridge._serial, InContext(rec, ctx))))
    assert lens.record is rec and not lens.busy

    other = GenerationRequest(messages=(("user", "another chat"),), continue_ids=(4,))
    engine.lens_ready.emit(LensResult("why", _OfModel(bridge._serial, InContext(record(), other))))
    assert lens.record is rec  # of a conversation no longer on screen: dropped
    engine.lens_failed.emit("why", "contrast 'a b' is not one token of the vocabulary")
    assert "not one token" in lens.status.text()

    old = bridge._serial
    bridge.model_loaded()  # a new model: what was asked of the old one is dropped when it arrives
    engine.lens_ready.emit(LensResult("why", _OfModel(old, InContext(record(), ctx))))
    assert lens.record is None

    lens.ask(-1)
    lens.stop_button.click()  # stopped: what the job sends after is dropped
    engine.lens_ready.emit(LensResult("why", _OfModel(bridge._serial, InContext(record(), ctx))))
    assert lens.record is None and not lens.busy and lens.status.text() == "Stopped."


def test_why_this_token_from_a_clicked_reply_token(qtbot, llama: Path, data_dir: Path) -> None:
    """A reply token clicked in the chat offers "Why this token?": the Why tab comes up and explains that token of the
    last reply (its place in the conversation found when the lens reads it); an earlier reply's token says why not."""
    w = greedy_window(qtbot, llama, data_dir, max_tokens=5)
    try:
        for text in ("first question", "second question"):
            assert w.conversation.send(text)
            qtbot.waitUntil(lambda: not w.conversation.generating, timeout=WAIT_MS)
        messages = w.conversation.current.messages
        last = max(i for i, m in enumerate(messages) if m.role == "assistant")
        widget = next(x for x in w.chat_view.widgets if x.index == last)
        assert len(widget.message.tokens) >= 3
        widget._show_alternatives(1)  # a click on the reply's second token
        assert widget.popup.why_button.isVisible()
        lens = w.lens_tabs.lens(WhyLens)
        widget.popup.why_button.click()
        assert w.lens_tabs.currentWidget() is not None and w.lens_tabs.tabText(w.lens_tabs.currentIndex()) == "Why"
        qtbot.waitUntil(lambda: lens.record is not None and not lens.busy
                        and lens.record.token_index == lens.record.reply_start + 1, timeout=WAIT_MS)
        assert lens.record.target_id == widget.message.tokens[1][0]
        banners: list[str] = []
        w.chat_view.show_banner = lambda kind, text, **_k: banners.append(text)
        first = min(i for i, m in enumerate(messages) if m.role == "assistant")
        w.chat_view.why_requested.emit(first, 0)
        assert banners and "last reply" in banners[-1]
    finally:
        w.close()
