"""Nothing is cut at 1280x800 and 1366x768 on the real SmolLM2 and Gemma 3 files (skipped where the model cache
lacks them): after a reply asked for code and prose, test_nothing_cut's walk of every tab and page at both sizes
(the chat's bubbles included: a reply's text never runs past its bubble), with the Layers × tensors table whole,
and the status bar while a reply streams."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.views.chat.markdown import RichView
from app.views.quant.lens import QuantLens
from tests.app.test_end_to_end import wait_idle
from tests.app.test_nothing_cut import SIZES, overflow, streaming_status, walk_window
from tests.app.windows import greedy_window

pytestmark = pytest.mark.slow
PROMPT = "Write a Python function that reverses a string, then explain it in two sentences."


@pytest.mark.parametrize("model", ["smollm2_path", "gemma3_path"])
def test_nothing_is_cut_on_the_real_models(qtbot, model: str, request: pytest.FixtureRequest, data_dir: Path) -> None:
    path = request.getfixturevalue(model)
    w = greedy_window(qtbot, path, data_dir, max_tokens=48)
    assert w.conversation.send(PROMPT)
    wait_idle(qtbot, w)
    reply = w.chat_view.widgets[-1]
    assert reply.message.role == "assistant" and len(reply.message.content) > 40
    found = walk_window(qtbot, w)
    quant = w.lens_tabs.lens(QuantLens)
    grid = quant.grid
    quant.narrow.setCurrentIndex(0)  # the Tensors page: a dense model's table fits beside the chat at either size
    tables = grid.parentWidget().parentWidget().parentWidget()  # the Layers × tensors | All tensors tabs
    tables.setCurrentWidget(grid.parentWidget())
    for size in SIZES:
        w.resize(*size)
        qtbot.wait(100)
        w.lens_tabs.select("Quantization")
        qtbot.wait(100)
        assert grid.isVisible() and not grid.horizontalScrollBar().isVisible(), size
        assert grid.horizontalHeader().length() <= grid.viewport().width(), size
        if model == "smollm2_path":  # a llama's 9 roles fit whole on one page; Gemma 3's 15 take two (walked above)
            assert grid.page_labels() == ["all"] and not grid.pages.isVisible(), size
        bodies = [b for b in w.chat_view.findChildren(RichView) if b.isVisible()]
        assert bodies and overflow(w.chat_view) == [], size
    found += streaming_status(qtbot, w)
    assert found == [], "\n".join(sorted(set(found)))
    w.close()
