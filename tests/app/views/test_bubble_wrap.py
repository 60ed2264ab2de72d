"""A long reply wraps inside its bubble in the chat pane of a 1280x800 or 1366x768 window (about 360-420 px): its
Markdown (a heading, long words, a URL, inline code, a fenced code block with long lines, a table, a list of MoE
filler tokens) and its reasoning (a word longer than the pane) never run past the bubble, and the chat never
scrolls sideways. The window's walk (tests/app/test_nothing_cut.py) checks real replies the same way."""
from __future__ import annotations

import pytest
from PySide6.QtWidgets import QApplication

from app.data.chats import Chat, Message, ReplyStats
from app.views.chat.markdown import RichView
from app.views.chat.view import ChatView
from tests.app.test_nothing_cut import overflow

LONG_WORD = "pneumonoultramicroscopicsilicovolcanoconiosis_" * 2
REPLY = (
    "# A heading rather long for a narrow bubble of the chat pane\n\n"
    f"Some **bold** text, a word like {LONG_WORD} and a URL "
    "https://example.com/a/very/long/path/that/never/breaks/anywhere/at/all/index.html and "
    "`an_inline_code_identifier_that_is_quite_long_indeed()`.\n\n"
    "```python\n"
    "def a_function_with_a_long_name(argument_one, argument_two, argument_three, argument_four):\n"
    "    return argument_one + argument_two  # a comment that runs on and on past any pane\n"
    "```\n\n"
    "| column one | column two | column three | column four | column five |\n"
    "|---|---|---|---|---|\n"
    "| aaaaaaaaaa | bbbbbbbbbbbb | cccccccccccc | dddddddddddd | eeeeeeeeeeeeee |\n\n"
    "- an item of filler tokens " + "".join(f"<filler_{i}>" for i in range(40)) + "\n"
)
THINKING = "<think>Reasoning with aVeryLongWordThatDoesNotBreakAnywhereAtAllBecauseItIsOneTokenOfText here</think>"


def _chat() -> Chat:
    stats = ReplyStats(tokens=300, gen_tok_s=42.0, ttft_s=0.12, finish_reason="length",
                       model="gemma-3-270m-it-q4_k_m-with-a-long-file-name · Q4_K_M")
    return Chat(title="long", messages=[Message("user", "Tell me " + "x" * 120),
                                        Message("assistant", THINKING + REPLY, [], stats)])


@pytest.mark.parametrize("width", [360, 420])
def test_a_long_reply_wraps_inside_its_bubble(qtbot, width: int) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(width, 1400)
    view.show()
    view.show_chat(_chat())
    reply = view.widgets[-1]
    reply.reasoning_button.setChecked(True)  # the reasoning shown, its long word too
    for _ in range(4):
        QApplication.processEvents()
    shown = reply.reasoning_view
    assert shown.isVisible() and "aVeryLongWord" in (shown.toPlainText() if hasattr(shown, "toPlainText") else
                                                     shown.text())
    assert overflow(view) == []  # no text wider than its view, no sideways scroll
    room = view.scroll.viewport().width()
    for message in view.widgets:
        assert message.geometry().right() < room, (message.role, message.width(), room)
    bodies = [b for b in reply.findChildren(RichView) if b.isVisible()]
    assert len(bodies) == 2 and all(b.width() <= reply.width() for b in bodies)
    code = reply.body.document().toPlainText()
    assert "a_function_with_a_long_name(argument_one" in code and "aaaaaaaaaa" in code  # shown, wrapped
