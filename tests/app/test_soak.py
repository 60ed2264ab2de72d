"""Soak (issue 7 item 9): one conversation per overflow policy, turn after turn, past a full 256-token context.

The real window and a tiny real model (random weights, sampled at temperature 0.8) run a warm-up chat, then 45
turns under 'drop oldest turns' and 45 under 'refuse', with a Stop every seventh turn. Resident memory
(/proc/self/statm) is compared in the same view state (an empty chat shown, freed heap trimmed) after the warm-up
and at the end, and must grow less than 5 %: the KV cache, recorder, lens records, token records, saver and
threads are all exercised 90 times. The message widgets of a chat on screen cost memory in proportion to its
length (not a leak): that is measured and printed separately. Python and OS thread counts and the app's job
threads must come back to where they were.
"""
from __future__ import annotations

import ctypes
import dataclasses
import gc
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from app.data.store import Store
from app.main_window import MainWindow
from tests.tiny_models import make_tiny_llama

TURNS = 45  # per policy
WARM_UP = 8  # turns of the first policy before the reference RSS sample
STOP_EVERY = 7
REPLY_MS = 30_000


def rss_bytes() -> int:
    """Resident set size from /proc/self/statm."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trimmed_rss(qtbot: Any) -> int:
    """RSS once deleted widgets are gone, garbage is collected and glibc has handed free pages back."""
    qtbot.wait(200)  # runs the event loop: deferred widget deletions happen
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    return rss_bytes()


def os_threads() -> int:
    """Threads of this process as the kernel counts them (QThreads included)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def settle(qtbot: Any, w: MainWindow) -> None:
    """Wait until no reply runs and every job thread (lens jobs after a reply too) has ended."""
    qtbot.waitUntil(lambda: not w.conversation.generating and not w.engine.threads(), timeout=REPLY_MS)


@dataclasses.dataclass
class Tally:
    turns: int = 0
    answered: int = 0
    refused: int = 0
    stopped: int = 0
    dropped: int = 0
    generated: int = 0
    prompt: int = 0
    shown: int = 0  # most message widgets on screen at once


def drive(qtbot: Any, w: MainWindow, policy: str, turns: int, tally: Tally, peaks: list[int]) -> None:
    """`turns` turns of one new conversation under `policy`; the RSS after each turn goes into `peaks`."""
    conv = w.conversation
    w.state.settings = dataclasses.replace(w.state.settings, overflow_policy=policy)
    conv.new_chat()
    conv.current.system_prompt = "You are a patient assistant."
    for turn in range(turns):
        text = f"{policy} turn {turn}: tell me something about the number {turn * 7}."
        w.chat_view.input.setPlainText(text)
        n_before = len(conv.current.messages)
        w.chat_view._submit()
        if turn % STOP_EVERY == STOP_EVERY - 1:
            qtbot.waitUntil(lambda: not conv.generating or len(conv.current.messages[-1].tokens) >= 2, timeout=REPLY_MS)
            conv.stop()
        settle(qtbot, w)
        tally.turns += 1
        msgs = conv.current.messages
        if len(msgs) == n_before:  # refused: the text is back in the box, the chat unchanged
            assert policy == "refuse" and w.chat_view.input.toPlainText() == text
            assert any("the model's context is 256" in b for b in w.chat_view.banner_texts())
            tally.refused += 1
            w.chat_view.input.clear()
        else:
            reply = msgs[-1]
            assert reply.role == "assistant" and msgs[-2].content == text
            assert not reply.error or "context is full" in reply.error, reply.error
            tally.answered += 1
            tally.stopped += reply.stopped
            if reply.stats is not None:
                tally.generated += reply.stats.tokens
                tally.prompt += reply.stats.prompt_tokens
        assert w.state.ctx_used <= 256
        peaks.append(rss_bytes())
    tally.dropped += sum(not m.in_context for m in conv.current.messages)
    tally.shown = max(tally.shown, len(w.chat_view.widgets))
    w.chat_view.clear_banners()


def test_soak_both_policies_memory_flat_no_thread_leak(qtbot: Any, tmp_path: Path, data_dir: Path) -> None:
    """90 turns over a 256-token context: replies, refusals, drops and stops; RSS growth < 5 %, no thread left."""
    model = make_tiny_llama(tmp_path / "tiny.gguf", n_ctx=256)
    py_threads0, os_threads0 = threading.active_count(), os_threads()
    t0 = time.perf_counter()
    w = MainWindow(model=str(model), store=Store(data_dir))
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.state.model is not None, timeout=REPLY_MS)
    w.state.settings = dataclasses.replace(w.state.settings, temperature=0.8, seed=-1, max_tokens=16,
                                           context_limit=256)
    w.conversation.base_model = False  # no template in the tiny model (a base model to the app): the template path
    tally, peaks = Tally(), []
    drive(qtbot, w, "drop_oldest", WARM_UP, Tally(), [])  # warm-up: every code path once, then an empty chat
    drive(qtbot, w, "refuse", WARM_UP, Tally(), [])
    w.conversation.new_chat()
    settle(qtbot, w)
    start = trimmed_rss(qtbot)
    py_threads1, os_threads1 = threading.active_count(), os_threads()
    drive(qtbot, w, "drop_oldest", TURNS, tally, peaks)
    settle(qtbot, w)
    peak_drop = max(peaks)
    drive(qtbot, w, "refuse", TURNS, tally, peaks)
    w.conversation.new_chat()  # the same view state as at the start: an empty chat on screen
    settle(qtbot, w)
    end = trimmed_rss(qtbot)
    py_threads2, os_threads2 = threading.active_count(), os_threads()
    growth = (end - start) / start
    w.close()
    assert w.engine.threads() == [] and not w.saver.isRunning()
    os_threads_closed = os_threads()
    took = time.perf_counter() - t0
    chats = Store(data_dir).load_chats()
    mib = 1 << 20
    per_widget = (peak_drop - start) / max(1, tally.shown)
    print(f"\nsoak: {tally.turns} turns in {took:.1f} s (after a {2 * WARM_UP}-turn warm-up): {tally.answered} "
          f"answered ({tally.stopped} stopped), {tally.refused} refused, {tally.dropped} messages dropped from the "
          f"context; {tally.generated} tokens generated, {tally.prompt} prompt tokens")
    print(f"  RSS after warm-up {start / mib:.1f} MiB, at the end {end / mib:.1f} MiB, growth {100 * growth:+.2f} % "
          f"(both with an empty chat shown)")
    print(f"  with the {tally.shown}-message chat on screen: up to {peak_drop / mib:.1f} MiB, "
          f"about {per_widget / 1024:.0f} KiB per message widget")
    print(f"  threads (python / OS): before the window {py_threads0} / {os_threads0}, after warm-up "
          f"{py_threads1} / {os_threads1}, at the end {py_threads2} / {os_threads2}, "
          f"after close {threading.active_count()} / {os_threads_closed}")
    assert tally.turns == 2 * TURNS and tally.dropped > 0 and tally.refused > 0 and tally.stopped > 0
    assert growth < 0.05, f"RSS grew {100 * growth:.1f} % after warm-up"
    assert per_widget < 1 << 20, "a message widget costs more than 1 MiB"
    assert py_threads2 == py_threads1 and os_threads2 <= os_threads1
    assert threading.active_count() <= py_threads0 and os_threads_closed <= os_threads1
    assert {len(c.messages) for c in chats} and all(m.content is not None for c in chats for m in c.messages)
    # no time bound: how long 90 turns take depends on the machine's load (printed above); every wait has its own
    # liveness bound


if not Path("/proc/self/statm").exists():  # pragma: no cover - Linux only
    pytestmark = pytest.mark.skip(reason="needs /proc")
