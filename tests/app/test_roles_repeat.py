"""Head roles score the same chat the same, however the chat came to the cache: right after its reply (the reply's
last token was sampled, never run), scored again, and reopened after another chat (the conversation prefilled
again). Each time every token of the conversation is scored, so the rows and the scores agree (to float rounding:
a reply decoded token by token and the same tokens prefilled in one batch differ in the last bits)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.records.head_roles import HeadRolesRecord
from app.views.attention.lens import AttentionLens
from tests.app.test_end_to_end import wait_idle
from tests.app.windows import greedy_window
from tests.tiny_models import make_tiny_llama

RUN_MS = 120_000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("roles") / "tiny.gguf")


def _score(qtbot, lens: AttentionLens) -> HeadRolesRecord:  # noqa: ANN001 - pytest-qt
    lens.roles.clear()
    lens.roles.roles_requested.emit("chat")
    qtbot.waitUntil(lambda: lens.roles.record is not None, timeout=RUN_MS)
    return lens.roles.record


def _same(a: HeadRolesRecord, b: HeadRolesRecord) -> None:
    assert a.roles.n_tokens == b.roles.n_tokens and a.token_texts == b.token_texts
    assert np.array_equal(a.roles.rows, b.roles.rows)
    for role, scores in a.roles.scores.items():
        assert np.allclose(scores, b.roles.scores[role], rtol=0, atol=1e-6, equal_nan=True), role
    assert [s.key for s in a.roles.sinks] == [s.key for s in b.roles.sinks]


def test_the_same_chat_scores_the_same(qtbot, tiny: Path, data_dir: Path) -> None:
    w = greedy_window(qtbot, tiny, data_dir, max_tokens=8)
    w.conversation.send("Hello there, how are you today?")
    wait_idle(qtbot, w)
    chat = w.conversation.current
    reply = chat.messages[-1]
    assert reply.stats.finish_reason == "length"  # its last token was sampled and never run by the reply
    lens = w.lens_tabs.select("Attention")
    lens.views.setCurrentWidget(lens.roles)
    first = _score(qtbot, lens)
    assert first.token_texts[-1] == reply.tokens[-1][1]  # the reply's last token is scored too
    _same(first, _score(qtbot, lens))
    w.conversation.new_chat()
    w.conversation.send("Something else entirely")
    wait_idle(qtbot, w)
    w.conversation.open_chat(chat.id)  # the cache now holds the other chat: this one is prefilled again
    _same(first, _score(qtbot, lens))
    w.close()
