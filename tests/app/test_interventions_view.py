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
