"""Interventions from the Experiments tab in the real window on SmolLM2: ablated heads are on the chat's model, the
banner and the replies' signature name them, the effect on the chat is measured, one click clears them; a bad head
is refused and nothing changes."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from tests.app.test_end_to_end import open_window, wait_idle

RUN_MS = 120_000


def test_ablation_from_the_experiments_tab(qtbot, smollm2_path: Path, data_dir: Path) -> None:
    w = open_window(qtbot, str(smollm2_path))
    w.state.settings = dataclasses.replace(w.state.settings, temperature=0.0, max_tokens=6, seed=1)
    w.conversation.send("What is the capital of France?")
    wait_idle(qtbot, w)
    panel = w.experiments_view.interventions
    w.lens_tabs.select("Experiments")
    qtbot.waitUntil(panel.apply_button.isEnabled, timeout=RUN_MS)
    panel.heads.setText("99:0")
    panel.apply_button.click()
    qtbot.waitUntil(lambda: "out of range" in panel.effect.text(), timeout=RUN_MS)
    assert "Nothing was changed" in panel.effect.text() and not w.chat_view.banner_texts()
    panel.heads.setText("3:4, 10:1, 20:0")
    panel.apply_button.click()
    qtbot.waitUntil(lambda: panel.clear_button.isEnabled(), timeout=RUN_MS)
    assert panel.active.text() == "On: ablated L3h4, L10h1, L20h0"
    assert "KLD over the chat" in panel.effect.text() and "before:" in panel.effect.text()
    assert any("ablated L3h4, L10h1, L20h0" in t for t in w.chat_view.banner_texts())
    assert list(w.engine.session.model.net.ablated_heads) == [3, 10, 20]
    w.conversation.send("And of Italy?")
    wait_idle(qtbot, w)
    assert w.conversation.current.messages[-1].stats.model.endswith("· ablated L3h4, L10h1, L20h0")
    shown = [w.chat_view.banners.itemAt(i).widget() for i in range(w.chat_view.banners.count())]
    banner = next(b for b in shown if getattr(b, "kind", "") == "intervention")
    banner.action.click()  # one click: everything off
    qtbot.waitUntil(lambda: not w.engine.session.model.net.ablated_heads, timeout=RUN_MS)
    qtbot.waitUntil(lambda: not any("ablated" in t for t in w.chat_view.banner_texts()), timeout=RUN_MS)
    assert not panel.clear_button.isEnabled() and w.conversation.model_name == w.model_label
    w.close()


def test_mean_heads_and_layers_then_regenerate(qtbot, smollm2_path: Path, data_dir: Path) -> None:
    w = open_window(qtbot, str(smollm2_path))
    w.state.settings = dataclasses.replace(w.state.settings, temperature=0.0, max_tokens=6, seed=1)
    panel = w.experiments_view.interventions
    w.lens_tabs.select("Experiments")
    qtbot.waitUntil(panel.apply_button.isEnabled, timeout=RUN_MS)
    assert not panel.experts.isEnabled() and "no experts" in panel.experts.placeholderText()
    panel.heads.setText("3:4")
    panel.head_mode.setCurrentIndex(1)
    panel.apply_button.click()  # an empty chat has nothing to average over
    qtbot.waitUntil(lambda: "send a message first" in panel.effect.text(), timeout=RUN_MS)
    assert not w.engine.session.model.net.ablated_heads
    w.conversation.send("What is the capital of France?")
    wait_idle(qtbot, w)
    first = w.conversation.current.messages[-1].content
    panel.attn_layers.setText("5")
    panel.ffn_layers.setText("7, 9")
    panel.apply_button.click()
    qtbot.waitUntil(lambda: panel.clear_button.isEnabled(), timeout=RUN_MS)
    net = w.engine.session.model.net
    n = len(w.engine.session.cache.tokens) if w.engine.session.cache is not None else 0
    assert panel.active.text().startswith("On: ablated L3h4 (mean over ") and "attention L5, FFN L7, FFN L9" in \
        panel.active.text()
    assert list(net.head_means) == [3] and net.ablated_blocks == {5: frozenset({"attn"}), 7: frozenset({"ffn"}),
                                                                  9: frozenset({"ffn"})}
    assert n == 0 and panel.regen_button.isEnabled()  # the chat's cache is cleared: the next reply reads it again
    panel.regen_button.click()
    wait_idle(qtbot, w)
    last = w.conversation.current.messages[-1]
    assert [v.content for v in last.versions] == [first] and last.stats.model.endswith("FFN L9")
    w.close()
