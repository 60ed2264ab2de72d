"""Each panel with synthetic records: chat view, token popup, model lens, sampling, chat list, status bar."""
from __future__ import annotations

import dataclasses

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextFormat
from PySide6.QtWidgets import QPlainTextEdit

from app.data.chats import Chat, Message
from app.data.store import Settings
from app.records.model_info import MetadataRow, ModelInfo, escape_text, format_value
from app.state import AppState
from app.views.chat.chat_list import ChatList
from app.views.chat.message import MessageWidget
from app.views.chat.sampling import SamplingPanel
from app.views.chat.view import Banner, ChatView
from app.views.model_info import ModelLens
from app.views.status import StatusPanel


def test_reply_renders_markdown_and_code(qtbot, sample_chat: Chat) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.show_chat(sample_chat)
    reply = view.widgets[1]
    doc = reply.body.document()
    assert "print(1)" in doc.toPlainText() and "**" not in doc.toPlainText()  # bold rendered, not literal
    fences = []
    block = doc.begin()
    while block.isValid():
        fences.append(block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence))
        block = block.next()
    assert any(fences)
    user = view.widgets[0]
    assert user.body.toPlainText() == "Show me <img src=x> code"  # user text is plain


def test_markdown_never_loads_html_or_images(qtbot) -> None:
    chat = Chat(messages=[Message("assistant", "<img src='file:///etc/passwd'> ![x](file:///etc/hosts) <b>no</b>")])
    view = ChatView()
    qtbot.addWidget(view)
    view.show_chat(chat)
    html = view.widgets[0].body.document().toHtml()
    assert "<img" not in html
    text = view.widgets[0].body.toPlainText()
    assert "<img src='file:///etc/passwd'>" in text and "[image: file:///etc/hosts]" in text and "<b>no</b>" in text


def test_token_view_and_alternatives_popup(qtbot, sample_chat: Chat) -> None:
    w = MessageWidget(1, sample_chat.messages[1])
    qtbot.addWidget(w)
    w.show()
    w.tokens_button.setChecked(True)
    assert 'href="tok:2"' in w.body.document().toHtml() or "tok:2" in w.body.document().toHtml()
    w.body.token_clicked.emit(2)
    popup = w.popup
    assert popup is not None and popup.isVisible()
    assert popup.rows[0] == ("'·**bold**'", f"{np.exp(-0.2) * 100:.2f} %")
    assert popup.rows[2][0] == "'<b>x</b>'"  # alternatives shown as plain text
    assert len(popup.rows) == 3
    popup.close()


def test_stopped_reply_is_marked_and_can_continue(qtbot, sample_chat: Chat) -> None:
    sample_chat.messages[1].stopped = True
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    view.show_chat(sample_chat)
    reply = view.widgets[1]
    assert "[stopped]" in reply.note.text()
    assert reply.continue_button.isVisibleTo(view) and reply.regen_button.isVisibleTo(view)
    with qtbot.waitSignal(view.continue_reply):
        reply.continue_button.click()


def test_enter_sends_shift_enter_breaks_line(qtbot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.show_chat(Chat())
    view.input.setFocus()
    qtbot.keyClicks(view.input, "hello")
    qtbot.keyClick(view.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(view.input, "world")
    assert view.input.toPlainText() == "hello\nworld"
    with qtbot.waitSignal(view.send) as sent:
        qtbot.keyClick(view.input, Qt.Key.Key_Return)
    assert sent.args == ["hello\nworld"]


def test_esc_and_button_stop_while_generating(qtbot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    view.show_chat(Chat())
    view.set_generating(True)
    assert view.send_button.text() == "Stop"
    with qtbot.waitSignal(view.stop):
        view.send_button.click()
    view.input.setPlainText("queued text")
    with qtbot.assertNotEmitted(view.send):
        view._submit()
    assert view.input.toPlainText() == "queued text"


def test_streaming_repaints_are_batched(qtbot) -> None:
    chat = Chat(messages=[Message("user", "hi"), Message("assistant", "")])
    view = ChatView()
    qtbot.addWidget(view)
    view.show_chat(chat)
    view.set_generating(True)
    reply = view.widgets[1]
    calls = []
    original = reply.refresh
    reply.refresh = lambda force=False: (calls.append(1), original(force))
    chat.messages[1].content = "A"
    view.message_changed(1, at_once=True)
    assert len(calls) == 1  # the first token is painted at once
    for ch in "bcdefgh":
        chat.messages[1].content += ch
        view.message_changed(1)
    assert len(calls) == 1
    qtbot.waitUntil(lambda: len(calls) == 2, timeout=120_000)
    assert "Abcdefgh" in reply.body.toPlainText()


def test_banner_is_plain_text(qtbot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    banner = view.show_banner("warning", "<b>template</b> warning")
    assert isinstance(banner, Banner)
    assert banner.label.textFormat() == Qt.TextFormat.PlainText
    assert view.banner_texts() == ["<b>template</b> warning"]
    view.show_banner("warning", "<b>template</b> warning")
    assert len(view.banner_texts()) == 1


def test_edit_and_resend(qtbot, sample_chat: Chat) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.show_chat(sample_chat)
    user = view.widgets[0]
    user.start_edit()
    user.editor.setPlainText("new question")
    user._resend()
    assert view.edit_box is not None  # later turns exist: it asks before removing them
    replace = next(b for b in view.edit_box.buttons() if b.text().startswith("Replace"))
    with qtbot.waitSignal(view.edit_resend) as sig:
        replace.click()
    assert sig.args == [0, "new question"]


def _info(**kw: object) -> ModelInfo:
    rows = (
        MetadataRow("general.name", "string", escape_text("<img src=file:///x>\u202egnp.exe\n" * 3)),
        MetadataRow("llama.block_count", "uint32", "30"),
        MetadataRow("tokenizer.ggml.tokens", "array[string]", format_value(["a", "b"] * 20)),
    )
    base = dict(
        name="<b>Bold</b> model", path="/m/x.gguf", file_bytes=98 << 20, arch="llama", backend="numpy",
        args=(("dim", "576"), ("n_layers", "30")), n_ctx=2048, metadata=rows,
        template_source="{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}",
        template_origin="tokenizer.chat_template", tokenizer=(("model", "gpt2"), ("vocabulary", "49,152 tokens")),
        warnings=("3 tensors not used",), n_tensors=272,
    )
    base.update(kw)
    return ModelInfo(**base)


def test_model_lens_plain_and_searchable(qtbot) -> None:
    lens = ModelLens()
    qtbot.addWidget(lens)
    lens.show_info(_info())
    assert lens.title.textFormat() == Qt.TextFormat.PlainText and "<b>Bold</b>" in lens.title.text()
    assert lens.proxy.rowCount() == 3
    lens.search.setText("BLOCK_count")
    assert lens.proxy.rowCount() == 1
    lens.search.setText("")
    value = lens.meta_model.index(0, 2).data()
    assert "\u202e" not in value and "\\u202e" in value and "\\n" in value
    assert lens.template.isReadOnly() and "<|im_start|>" in lens.template.toPlainText()
    wrap = QPlainTextEdit.LineWrapMode
    assert lens.template_wrap.isChecked() and lens.template.lineWrapMode() == wrap.WidgetWidth  # nothing sideways
    lens.template_wrap.setChecked(False)  # the lines as written, scrolled sideways
    assert lens.template.lineWrapMode() == wrap.NoWrap
    lens.template_wrap.setChecked(True)
    assert lens.template.lineWrapMode() == wrap.WidgetWidth
    assert lens.warn_layout.count() == 1
    lens.show_info(None)
    assert lens.proxy.rowCount() == 0


def test_escape_and_format_limits() -> None:
    assert escape_text("x" * 1000, 50).endswith("…") and len(escape_text("x" * 1000, 50)) == 50
    assert escape_text("a\x00b\x1b") == "a\\x00b\\x1b"
    assert format_value(np.arange(100, dtype=np.int32)).startswith("int32[100] [0, 1, 2")
    assert format_value(True) == "true"


def test_sampling_panel_binds_settings(qtbot) -> None:
    state = AppState(Settings())
    panel = SamplingPanel(state)
    qtbot.addWidget(panel)
    with qtbot.waitSignal(state.settings_changed):
        panel.controls["temperature"].setValue(0.25)
    assert state.settings.temperature == 0.25
    panel.policy.setCurrentIndex(panel.policy.findData("drop_oldest"))
    assert state.settings.overflow_policy == "drop_oldest"
    state.settings = dataclasses.replace(state.settings, top_k=7, last_model="m.gguf")
    assert panel.controls["top_k"].value() == 7
    panel.reset()
    assert state.settings.temperature == Settings().temperature and state.settings.last_model == "m.gguf"
    assert panel.controls["seed"].text() == "random"


def test_chat_list_signals(qtbot) -> None:
    a, b = Chat(title="first"), Chat(title="<i>second</i>")
    b.updated = a.updated + 10
    lst = ChatList()
    qtbot.addWidget(lst)
    lst.show_chats([a, b], b)
    assert lst.list.item(0).text() == "<i>second</i>" and lst.current_id() == b.id
    with qtbot.waitSignal(lst.open_requested) as opened:
        lst.list.setCurrentRow(1)
    assert opened.args == [a.id]
    with qtbot.waitSignal(lst.rename_requested, timeout=60_000) as renamed:
        lst.list.item(1).setText("renamed")
    assert renamed.args == [a.id, "renamed"]


def test_status_bar_follows_state(qtbot) -> None:
    state = AppState(Settings())
    bar = StatusPanel(state)
    qtbot.addWidget(bar)
    state.model = _info()
    state.ctx_size, state.ctx_used, state.kv_bytes, state.tok_s = 2048, 100, 3 << 20, 31.5
    assert bar.model.text() == "<b>Bold</b> model" and bar.model.textFormat() == Qt.TextFormat.PlainText
    assert bar.ctx.text() == "context 100 / 2,048"
    assert bar.kv.text() == "KV 3.0 MiB" and bar.speed.text() == "31.5 tok/s"
    assert state.memory_bytes > 1 << 20
    state.loading = ("downloading", 0.5)
    assert bar.progress.isVisibleTo(bar) and bar.progress.value() == 500
    state.loading = None
    assert not bar.progress.isVisibleTo(bar)


def test_status_bar_shows_a_first_starts_background_compile(qtbot) -> None:
    from engine.kernels import precompile  # noqa: PLC0415

    bar = StatusPanel(AppState(Settings()))
    qtbot.addWidget(bar)
    bar.show_late()
    assert not bar.late.isVisibleTo(bar)
    helper = precompile.start_late("import time; time.sleep(120)", [])
    try:
        bar.show_late()  # the bar's one-second timer calls it
        assert bar.late.isVisibleTo(bar) and bar.late.text().startswith("compiling faster kernels · ")
        assert "same numbers" in bar.late.toolTip()
    finally:
        helper.stop()
    bar.show_late()
    assert not bar.late.isVisibleTo(bar)


def test_escape_key_stops(qtbot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    view.activateWindow()
    qtbot.waitExposed(view)
    view.show_chat(Chat())
    view.set_generating(True)
    view.input.setFocus()
    with qtbot.waitSignal(view.stop, timeout=60_000):
        qtbot.keyClick(view.input, Qt.Key.Key_Escape)
