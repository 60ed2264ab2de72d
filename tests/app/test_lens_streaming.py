"""Lenses never slow the chat: while a reply streams, only the live overview (and the head it follows) is asked for,
at most once per LIVE_MIN_S and within LIVE_COST_FACTOR of its cost; head roles, the logit lens, the State and Step
through views score the chat once the reply has ended, and then cover every token it shows, also after a Stop.
(How fast generation stays with each lens on screen is measured by benchmarks/lens_overhead.py, not here.)"""
from __future__ import annotations

from pathlib import Path

import pytest

from app.controllers import lenses
from app.views.attention.lens import STREAMING_TEXT, AttentionLens
from tests.app.windows import greedy_window
from tests.tiny_models import make_tiny_llama

REPLY_MS = 120_000
WHOLE_CHAT = ("roles", "logit", "state", "step")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("stream") / "tiny.gguf", n_ctx=512)


def _asked_while(w, kinds: list[tuple[str, bool]]) -> None:  # noqa: ANN001
    """Record each lens request's kind and whether a reply was being made when it was asked."""
    real = w.engine.request_lens

    def ask(kind: str, compute) -> None:  # noqa: ANN001
        kinds.append((kind, w.conversation.generating))
        real(kind, compute)

    w.engine.request_lens = ask


@pytest.mark.parametrize("view", ["roles", "logit", "steps"])
def test_whole_chat_views_wait_for_the_reply(qtbot, tiny: Path, data_dir: Path, view: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lenses, "LIVE_MIN_S", 0.0)  # a live overview at every token (no time budget): whatever
    monkeypatch.setattr(lenses, "LIVE_COST_FACTOR", 0.0)  # else would be asked while it streams is asked
    w = greedy_window(qtbot, tiny, data_dir, max_tokens=40)
    lens = w.lens_tabs.select("Attention")
    assert isinstance(lens, AttentionLens)
    assert w.conversation.send("abc")  # a first reply, so the view has a chat to score
    qtbot.waitUntil(lambda: not w.conversation.generating and w.state.attention_record is not None, timeout=REPLY_MS)
    lens.views.setCurrentWidget({"roles": lens.roles, "logit": lens.logit, "steps": lens.steps}[view])
    kinds: list[tuple[str, bool]] = []
    _asked_while(w, kinds)
    assert w.conversation.send("def")
    qtbot.waitUntil(lambda: w.conversation.generating, timeout=REPLY_MS)
    if view == "roles":
        assert lens.roles.empty.text() == STREAMING_TEXT
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=REPLY_MS)
    cache = w.engine.session.cache
    qtbot.waitUntil(lambda: w.state.attention_record is not None
                    and w.state.attention_record.n_tokens == cache.length, timeout=REPLY_MS)
    streaming = [k for k, generating in kinds if generating]
    assert "attention" in streaming and not set(streaming) & set(WHOLE_CHAT)
    if view == "roles":
        qtbot.waitUntil(lambda: lens.roles.record is not None, timeout=REPLY_MS)
        assert lens.roles.record.roles.n_tokens == cache.length  # the whole reply scored, once it ended
    elif view == "logit":
        qtbot.waitUntil(lambda: lens.logit.panel.record is not None, timeout=REPLY_MS)
    else:  # the step is asked when the reply's whole read arrives (a live record of the same length may come first)
        qtbot.waitUntil(lambda: any(k == "step" and not g for k, g in kinds), timeout=REPLY_MS)
    after = [k for k, generating in kinds if not generating]
    assert {"roles": "roles", "logit": "logit", "steps": "step"}[view] in after
    w.close()


def test_after_a_stop_the_lenses_cover_every_token_shown(qtbot, tiny: Path, data_dir: Path) -> None:
    w = greedy_window(qtbot, tiny, data_dir, max_tokens=400)
    w.lens_tabs.select("Attention")
    steps: list[int] = []
    w.conversation.message_updated.connect(lambda *_a: steps.append(1))
    assert w.conversation.send("abc")
    qtbot.waitUntil(lambda: len(steps) >= 20, timeout=REPLY_MS)
    w.conversation.stop()
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=REPLY_MS)
    cache = w.engine.session.cache
    qtbot.waitUntil(lambda: w.state.attention_record is not None
                    and w.state.attention_record.n_tokens == cache.length, timeout=REPLY_MS)
    reply = w.conversation.current.messages[-1]
    held = "".join(w.engine.session.model.tokenizer.token_text(t) for t in cache.tokens)
    assert reply.content and held.endswith(reply.content)  # the cache (and the lens) hold every token shown
    w.close()
