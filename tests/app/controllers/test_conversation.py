"""The conversation controller with a fake engine, and the context-overflow policy with a fake model."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from PySide6.QtCore import QObject, Signal

from app.controllers.conversation import Conversation
from app.data.store import Settings, Store
from app.jobs.chat import fit_context
from app.records.reply import GenerationRequest, Prepared, ReplyDone, TokenStep
from app.workers.saver import Saver
from engine.errors import ContextFullError


class FakeEngine(QObject):
    """Records requests; the test plays the worker's part by emitting its signals."""

    reply_event = Signal(int, object)
    reply_failed = Signal(int, str)
    reply_ended = Signal(int)

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[GenerationRequest] = []
        self.stopped = 0

    def generate(self, request: GenerationRequest) -> int:
        self.requests.append(request)
        return len(self.requests)

    def stop(self) -> None:
        self.stopped += 1

    def stream(self, rid: int, pieces: list[str], reason: str = "eos", end: bool = True) -> None:
        for i, text in enumerate(pieces):
            self.reply_event.emit(rid, TokenStep((i, text, -0.1, ((i, text, -0.1),)), text, i, 0.01 * i, 10.0))
        if reason:
            self.reply_event.emit(rid, ReplyDone(reason, len(pieces), 12, 12, 100.0, 20.0, 0.5, 30, 2048, 1 << 20))
        if end:
            self.reply_ended.emit(rid)


@pytest.fixture()
def conv(qtbot, store: Store):
    engine = FakeEngine()
    saver = Saver()
    settings = Settings(max_tokens=64, overflow_policy="refuse")
    c = Conversation(store, engine, saver, lambda: settings)
    c.load()
    c.model_ready = True
    yield c
    saver.stop()


def test_send_streams_and_saves(conv: Conversation, store: Store) -> None:
    banners = []
    conv.banner.connect(lambda kind, text: banners.append(text))
    assert conv.send("Hello there")
    chat = conv.current
    assert [m.role for m in chat.messages] == ["user", "assistant"] and chat.title == "Hello there"
    req = conv.engine.requests[0]
    assert req.messages == (("user", "Hello there"),) and req.max_tokens == 64 and req.seed is None
    conv.engine.stream(1, ["Hi", "!", " How"])
    reply = chat.messages[1]
    assert reply.content == "Hi! How" and len(reply.tokens) == 3
    assert reply.stats.finish_reason == "eos" and reply.stats.tokens == 3 and reply.stats.ttft_s > 0
    assert not conv.generating and not banners
    conv.saver.flush()
    (saved,) = Store(store.root).load_chats()
    assert saved.messages[1].content == "Hi! How"


def test_stop_keeps_partial_reply(conv: Conversation) -> None:
    conv.send("Tell me a story")
    conv.engine.stream(1, ["Once", " upon"], reason="", end=False)
    conv.stop()
    assert conv.engine.stopped == 1
    conv.engine.stream(1, [], reason="cancelled")
    reply = conv.current.messages[1]
    assert reply.stopped and reply.content == "Once upon"
    conv.continue_reply()
    req = conv.engine.requests[1]
    assert req.continue_ids == (0, 1) and req.messages[-1] == ("assistant", "Once upon")
    conv.engine.stream(2, [" a time"])
    assert reply.content == "Once upon a time" and not reply.stopped and len(conv.current.messages) == 2


def test_failure_before_any_token_puts_text_back(conv: Conversation) -> None:
    restored, banners = [], []
    conv.input_restored.connect(restored.append)
    conv.banner.connect(lambda kind, text: banners.append((kind, text)))
    conv.send("a very long message")
    conv.engine.reply_failed.emit(1, str(ContextFullError(5000, 2048)))
    conv.engine.reply_ended.emit(1)
    assert conv.current.messages == [] and restored == ["a very long message"]
    assert conv.current.draft == "a very long message"
    assert banners[0][0] == "error" and "conversation is 5000 tokens" in banners[0][1]


def test_failure_mid_reply_keeps_partial(conv: Conversation) -> None:
    conv.send("go")
    conv.engine.stream(1, ["partial"], reason="", end=False)
    conv.engine.reply_failed.emit(1, "numerical error in model output (NaN) at position 9")
    conv.engine.reply_ended.emit(1)
    reply = conv.current.messages[1]
    assert reply.content == "partial" and "NaN" in reply.error


def test_regenerate_and_edit(conv: Conversation) -> None:
    conv.send("first")
    conv.engine.stream(1, ["one"])
    conv.send("second")
    conv.engine.stream(2, ["two"])
    conv.regenerate()
    assert [m.content for m in conv.current.messages] == ["first", "one", "second", ""]
    conv.engine.stream(3, ["TWO"])
    conv.edit_resend(0, "FIRST")
    assert [m.content for m in conv.current.messages] == ["FIRST", ""]
    assert conv.engine.requests[-1].messages == (("user", "FIRST"),)


def test_system_prompt_and_context_drop(conv: Conversation) -> None:
    banners = []
    conv.banner.connect(lambda kind, text: banners.append(text))
    conv.set_system_prompt("Be terse.")
    conv.send("q1")
    conv.engine.stream(1, ["a1"])
    conv.send("q2")
    assert conv.engine.requests[1].messages[0] == ("system", "Be terse.")
    conv.engine.reply_event.emit(2, Prepared(100, 128, 2, "template fell back to ChatML"))
    conv.engine.stream(2, ["a2"])
    msgs = conv.current.messages
    assert [m.in_context for m in msgs] == [False, False, True, True]
    assert any("fell back" in b for b in banners) and any("2 oldest messages" in b for b in banners)
    conv.send("q3")
    assert conv.engine.requests[2].messages == (("system", "Be terse."), ("user", "q2"), ("assistant", "a2"),
                                                ("user", "q3"))


def test_context_full_mid_reply_is_visible(conv: Conversation) -> None:
    conv.send("long")
    conv.engine.stream(1, ["cut"], reason="context")
    assert "context is full" in conv.current.messages[1].error


def test_no_model_keeps_text(conv: Conversation) -> None:
    conv.model_ready = False
    banners = []
    conv.banner.connect(lambda kind, text: banners.append(text))
    assert not conv.send("hello")
    assert conv.current.messages == [] and "No model" in banners[0]


def test_chat_list_operations(conv: Conversation, store: Store) -> None:
    first = conv.current
    conv.send("hello")
    conv.engine.stream(1, ["hi"])
    second = conv.new_chat()
    assert conv.current is second and conv.chats[0] is second
    assert conv.new_chat() is second  # an empty chat is reused
    conv.rename(first.id, "  My   chat ")
    assert first.title == "My chat" and first.titled_by_user
    conv.delete(second.id)
    assert conv.current is first
    conv.set_draft("unsent words")
    conv.save_pending()
    conv.saver.flush()
    (saved,) = Store(store.root).load_chats()
    assert saved.draft == "unsent words" and saved.title == "My chat"


# ---- the overflow policy with a fake model: one token per character of the rendered text


class FakeChat:
    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> Any:
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")
        return SimpleNamespace(text=text, warning=None, used_fallback=False)


class FakeTokenizer:
    def encode(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return [ord(c) for c in text]


FAKE_MODEL = SimpleNamespace(chat=FakeChat(), tokenizer=FakeTokenizer())


def _req(policy: str, *messages: tuple[str, str], **kw: Any) -> GenerationRequest:
    return GenerationRequest(messages=tuple(messages), overflow_policy=policy, max_tokens=10, **kw)


def test_refuse_policy_raises_context_full() -> None:
    req = _req("refuse", ("user", "x" * 100))
    with pytest.raises(ContextFullError, match="conversation is 117 tokens, the model's context is 64"):
        fit_context(FAKE_MODEL, req, 64)
    ids, dropped, _ = fit_context(FAKE_MODEL, req, 200)
    assert len(ids) == 117 and dropped == 0


def test_drop_oldest_keeps_system_and_last_turn() -> None:
    msgs = [("system", "S"), ("user", "a" * 30), ("assistant", "b" * 30), ("user", "c" * 30), ("assistant", "d" * 30),
            ("user", "q")]
    ids, dropped, _ = fit_context(FAKE_MODEL, _req("drop_oldest", *msgs), 100)
    text = "".join(map(chr, ids))
    assert dropped == 4 and text == "<system>S<user>q<assistant>"
    ids, dropped, _ = fit_context(FAKE_MODEL, _req("drop_oldest", *msgs), 180)
    assert dropped == 2 and "".join(map(chr, ids)).startswith("<system>S<user>ccc")
    with pytest.raises(ContextFullError):
        fit_context(FAKE_MODEL, _req("drop_oldest", ("system", "S" * 50), ("user", "q")), 40)


def test_continue_uses_reply_tokens() -> None:
    req = _req("refuse", ("user", "q"), ("assistant", "part"), continue_ids=(1, 2, 3))
    ids, _, _ = fit_context(FAKE_MODEL, req, 100)
    assert ids[-3:] == [1, 2, 3] and "".join(map(chr, ids[:-3])) == "<user>q<assistant>"


def test_save_failure_is_reported_and_data_kept(qtbot, conv: Conversation, monkeypatch: pytest.MonkeyPatch) -> None:
    errors: list[str] = []
    conv.saver.failed.connect(errors.append)

    def refuse(chat: object) -> None:
        raise OSError(30, "Read-only file system", "/data/chats/x.json")

    monkeypatch.setattr(conv.store, "save_chat", refuse)
    conv.set_draft("precious words")
    conv.save_pending()
    qtbot.waitUntil(lambda: bool(errors), timeout=120_000)
    assert "could not save: Read-only file system" in errors[0]
    assert conv.current.draft == "precious words"  # still in memory, saved on the next change


def test_saver_coalesces_and_flushes(qtbot) -> None:
    saver = Saver()
    done: list[int] = []
    for i in range(20):
        saver.submit("same", lambda i=i: done.append(i))
    assert saver.flush(5.0)
    assert done[-1] == 19 and len(done) < 20 or done == list(range(20))
    saver.stop()
    assert not saver.isRunning()
