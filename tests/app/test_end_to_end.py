"""The real app with the real SmolLM2 file: load, chat, stop, responsiveness, closing mid-reply, restore."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QElapsedTimer, QTimer

from app.data.store import Store
from app.main_window import MainWindow

pytestmark = pytest.mark.slow
LOAD_MS = 180_000
REPLY_MS = 240_000


def open_window(qtbot, model: str | None, max_tokens: int = 24) -> MainWindow:
    w = MainWindow(model=model)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.state.model is not None, timeout=LOAD_MS)
    w.state.settings = dataclasses.replace(w.state.settings, temperature=0.0, max_tokens=max_tokens, seed=1)
    return w


def wait_idle(qtbot, w: MainWindow) -> None:
    qtbot.waitUntil(lambda: not w.conversation.generating, timeout=REPLY_MS)


def wait_tokens(qtbot, w: MainWindow, n: int) -> None:
    qtbot.waitUntil(lambda: len(w.conversation.current.messages[-1].tokens) >= n, timeout=REPLY_MS)


def close(w: MainWindow) -> None:
    w.close()
    assert w.closed
    assert w.engine.threads() == [], "a worker thread is still running after close"
    assert not w.saver.isRunning()


@pytest.fixture()
def smol(smollm2_path: Path, data_dir: Path) -> str:
    return str(smollm2_path)


def test_chat_stop_persist_and_restore(qtbot, smol: str, data_dir: Path) -> None:
    w = open_window(qtbot, smol)
    assert w.windowTitle().startswith("GGUF Lens") and Path(smol).name in w.windowTitle()  # the file it runs
    assert w.compare_view.a_cache.currentText() == w.compare_view.b_cache.currentText() == w.state.kv_type  # one default
    assert w.model_lens.meta_model.rowCount() > 10 and w.state.ctx_size > 0
    w.chat_view.input.setPlainText("What is the capital of France?")
    w.chat_view._submit()
    assert w.chat_view.input.toPlainText() == ""
    wait_idle(qtbot, w)
    chat = w.conversation.current
    reply = chat.messages[-1]
    assert reply.role == "assistant" and reply.content.strip() and reply.tokens
    assert reply.stats is not None and reply.stats.tokens == len(reply.tokens) and reply.stats.ttft_s > 0
    assert "Paris" in reply.content
    assert w.state.ctx_used > 0 and w.state.kv_bytes > 0
    assert len(reply.tokens[0][3]) == 10  # top-10 alternatives kept per token
    # a long reply, stopped after a few tokens: the partial reply stays, marked [stopped]
    w.state.settings = dataclasses.replace(w.state.settings, max_tokens=400)
    w.conversation.send("Write a long story about a lighthouse keeper.")
    wait_tokens(qtbot, w, 3)
    t0 = time.perf_counter()
    w.chat_view.stop.emit()
    wait_idle(qtbot, w)
    stop_s = time.perf_counter() - t0
    partial = chat.messages[-1]
    assert partial.stopped and partial.content and partial.stats.finish_reason == "cancelled"
    assert "[stopped]" in w.chat_view.widgets[-1].note.text()
    print(f"\nstop latency {stop_s * 1000:.0f} ms")
    w.chat_view.input.setPlainText("an unsent draft")
    cid, n_messages = chat.id, len(chat.messages)
    close(w)
    saved = json.loads((data_dir / "chats" / f"{cid}.json").read_text())
    assert len(saved["messages"]) == n_messages and saved["messages"][-1]["stopped"] is True
    assert saved["draft"] == "an unsent draft"
    again = MainWindow(load=False)
    qtbot.addWidget(again)
    assert again.conversation.current.id == cid
    assert [m.content for m in again.conversation.current.messages] == [m.content for m in chat.messages]
    assert len(again.chat_view.widgets) == n_messages and again.chat_view.input.toPlainText() == "an unsent draft"
    assert again.chat_list.current_id() == cid
    close(again)


def test_event_loop_stays_responsive_while_streaming(qtbot, smol: str) -> None:
    """The GUI thread keeps turning while a reply streams: a 5 ms QTimer fires again and again during the reply, and
    sees it grow token by token (were the reply produced or drawn in one block, every tick would see 0 tokens or all
    of them). Counts, not durations: how long a stall lasts depends on the machine's load; it is printed only."""
    w = open_window(qtbot, smol, max_tokens=48)
    gaps: list[float] = []
    seen: list[int] = []  # the reply's token count at each tick while generating
    clock = QElapsedTimer()
    clock.start()
    last = [clock.elapsed()]

    def tick() -> None:
        now = clock.elapsed()
        gaps.append(now - last[0])
        last[0] = now
        if w.conversation.generating:
            msg = w.conversation.current.messages[-1]
            seen.append(len(msg.tokens) if msg.role == "assistant" else 0)

    timer = QTimer(interval=5)
    timer.timeout.connect(tick)
    w.conversation.send("List five fruits and say one thing about each.")
    timer.start()
    wait_idle(qtbot, w)
    qtbot.wait(1500)  # the attention overview arrives and is drawn after the reply
    timer.stop()
    n_tokens = len(w.conversation.current.messages[-1].tokens)
    partial = sorted({n for n in seen if 0 < n < n_tokens})
    worst = max(gaps)
    print(f"\nlongest event-loop stall while streaming: {worst:.0f} ms over {len(gaps)} ticks "
          f"({n_tokens} tokens, {len(partial)} partial replies seen by the timer); 50 ms is the target")
    with open(os.environ.get("GGUF_LENS_STALL_REPORT", "/tmp/gguf_lens_stall.txt"), "a") as f:
        f.write(f"{time.strftime('%H:%M:%S')} longest stall {worst:.0f} ms over {len(gaps)} ticks\n")
    assert n_tokens >= 8, "the reply is too short to tell"
    assert len(seen) >= 3, f"the timer fired {len(seen)} times while the reply streamed"
    assert len(partial) >= 2, f"the timer saw the reply at {partial} tokens only: it was not drawn as it streamed"
    assert len(gaps) > len(seen)  # and it kept firing after the reply (the overview drawn without blocking)
    close(w)


def test_cancel_twice_then_send_at_once(qtbot, smol: str) -> None:
    w = open_window(qtbot, smol, max_tokens=300)
    conv = w.conversation
    conv.send("Tell me everything you know about the moon.")
    wait_tokens(qtbot, w, 2)
    conv.stop()
    conv.stop()
    w.state.settings = dataclasses.replace(w.state.settings, max_tokens=8)
    assert conv.send("Now say hello.")
    wait_idle(qtbot, w)
    msgs = conv.current.messages
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[1].stopped and msgs[1].content
    assert msgs[3].content.strip() and not msgs[3].stopped and not msgs[3].error
    close(w)


def test_close_mid_reply_stops_workers_and_keeps_partial(qtbot, smol: str, data_dir: Path) -> None:
    w = open_window(qtbot, smol, max_tokens=400)
    w.conversation.send("Describe the history of Rome in detail.")
    wait_tokens(qtbot, w, 2)
    cid = w.conversation.current.id
    close(w)
    (chat,) = [c for c in Store(data_dir).load_chats() if c.id == cid]
    assert chat.messages[-1].content and chat.messages[-1].stopped


def test_bad_file_keeps_model_and_chats(qtbot, smol: str, tmp_path: Path) -> None:
    w = open_window(qtbot, smol)
    before = w.state.model
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    w.open_model(str(bad))
    qtbot.waitUntil(lambda: getattr(w, "load_error_box", None) is not None, timeout=30_000)
    box = w.load_error_box
    assert "could not be loaded" in box.text() and "stays loaded" in box.text()
    assert w.state.model is before and w.state.loading is None
    box.close()
    w.conversation.send("Say yes.")
    wait_idle(qtbot, w)
    assert w.conversation.current.messages[-1].content
    close(w)


def test_default_model_on_first_start(qtbot, smollm2_path: Path, data_dir: Path, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "models"
    models.mkdir()
    os.symlink(smollm2_path, models / smollm2_path.name)
    monkeypatch.setenv("GGUF_LENS_MODELS_DIR", str(models))
    from engine.catalog import DEFAULT_MODEL

    w = MainWindow()
    qtbot.addWidget(w)
    assert w.initial_model() == DEFAULT_MODEL
    qtbot.waitUntil(lambda: w.state.model is not None, timeout=LOAD_MS)
    assert w.state.settings.last_model == DEFAULT_MODEL
    close(w)
    assert Store(data_dir).load_settings().last_model == DEFAULT_MODEL


def test_out_of_memory_and_nan_keep_partial_reply(qtbot, smol: str) -> None:
    w = open_window(qtbot, smol, max_tokens=40)
    model = w.engine.session.model
    real = model.forward
    calls = [0]

    def failing(fault: str, at: int):
        def forward(tokens, cache, recorder=None, all_logits=False):
            calls[0] += 1
            if calls[0] == at and fault == "oom":
                raise MemoryError
            out = real(tokens, cache, recorder, all_logits=all_logits)
            return out * float("nan") if calls[0] == at else out
        return forward

    banners: list[str] = []
    w.conversation.banner.connect(lambda kind, text: banners.append(text))
    for fault, words in (("oom", "ran out of memory"), ("nan", "numerical error")):
        calls[0] = 0
        model.forward = failing(fault, 6)
        w.conversation.send("Count from one to twenty, one number per line.")
        wait_idle(qtbot, w)
        reply = w.conversation.current.messages[-1]
        assert reply.role == "assistant" and reply.content, fault  # the partial reply is kept
        assert words in reply.error and any(words in b for b in banners)
        assert words in w.chat_view.widgets[-1].note.text()
    model.forward = real
    w.conversation.send("Say hello.")
    wait_idle(qtbot, w)
    last = w.conversation.current.messages[-1]
    assert last.content and not last.error
    close(w)


def test_context_overflow_policies_are_visible(qtbot, smol: str) -> None:
    w = open_window(qtbot, smol, max_tokens=16)
    conv = w.conversation
    w.state.settings = dataclasses.replace(w.state.settings, context_limit=256, overflow_policy="refuse")
    progress: list[tuple[int, int]] = []
    conv.prefill.connect(lambda done, total: progress.append((done, total)))
    long_text = "Please summarise this: " + "the quick brown fox jumps over the lazy dog " * 40
    w.chat_view.input.setPlainText(long_text)
    w.chat_view._submit()
    wait_idle(qtbot, w)
    assert conv.current.messages == []  # refused: nothing half-sent
    assert w.chat_view.input.toPlainText() == long_text  # and nothing typed is lost
    assert any("the model's context is 256" in t for t in w.chat_view.banner_texts())
    w.chat_view.clear_banners()
    w.state.settings = dataclasses.replace(w.state.settings, overflow_policy="drop_oldest")
    medium = "Tell me about this: " + "red green blue " * 20
    for _ in range(3):
        assert conv.send(medium)
        wait_idle(qtbot, w)
    msgs = conv.current.messages
    assert not msgs[0].in_context and msgs[-1].content and not msgs[-1].error
    assert any("oldest messages were left out" in t for t in w.chat_view.banner_texts())
    assert "left out of the model's context" in w.chat_view.widgets[0].note.text()
    assert w.state.ctx_used <= 256
    assert any(0 < done < total for done, total in progress)  # prefill progress was reported in chunks
    close(w)


def test_continue_regenerate_and_edit_with_the_real_model(qtbot, smol: str) -> None:
    w = open_window(qtbot, smol, max_tokens=300)
    conv = w.conversation
    conv.send("Name some colours.")
    wait_tokens(qtbot, w, 3)
    conv.stop()
    wait_idle(qtbot, w)
    reply = conv.current.messages[-1]
    before, n_before = reply.content, len(reply.tokens)
    assert reply.stopped
    w.state.settings = dataclasses.replace(w.state.settings, max_tokens=6)
    conv.continue_reply()
    wait_idle(qtbot, w)
    assert conv.current.messages[-1] is reply and not reply.stopped
    assert reply.content.startswith(before) and len(reply.tokens) > n_before
    assert reply.stats.prefilled_tokens < reply.stats.prompt_tokens  # the cached prefix was reused
    conv.regenerate()
    wait_idle(qtbot, w)
    assert conv.current.messages[-1] is not reply and conv.current.messages[-1].content
    conv.edit_resend(0, "Name one animal.")
    wait_idle(qtbot, w)
    msgs = conv.current.messages
    assert [m.content for m in msgs[:1]] == ["Name one animal."] and len(msgs) == 2 and msgs[1].content
    close(w)


def test_lenses_get_their_records(qtbot, smol: str) -> None:
    w = open_window(qtbot, smol, max_tokens=12)
    attention = w.lens_slots["Attention"].widget
    quant = w.lens_slots["Quantization"].widget
    positions = w.lens_slots["Positions"].widget
    if attention is None or quant is None or positions is None:
        pytest.skip("the lens widgets are not there yet")
    assert attention.model is not None and attention.model.n_layers == 30
    w.lens_tabs.setCurrentWidget(w.lens_slots["Attention"])
    w.conversation.send("Hi!")
    wait_idle(qtbot, w)
    qtbot.waitUntil(lambda: attention.attention is not None and attention.head is not None
                    and attention.attention.n_tokens == w.state.ctx_used, timeout=60_000)
    w.lens_tabs.setCurrentWidget(w.lens_slots["Positions"])  # hidden lenses get their records when shown
    assert positions.tokens and len(positions.tokens) == attention.attention.n_tokens
    w.lens_tabs.setCurrentWidget(w.lens_slots["Quantization"])
    quant.tensor_requested.emit("blk.0.attn_q.weight")
    qtbot.waitUntil(lambda: quant.tensor is not None, timeout=60_000)
    assert quant.tensor.name == "blk.0.attn_q.weight"
    close(w)
