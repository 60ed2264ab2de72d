"""The chat panel: banners, system prompt, the messages (repainted in batches while streaming), the input box."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QKeyEvent, QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import (
    QComboBox, QFrame, QHBoxLayout, QLabel, QMessageBox, QSizePolicy, QPlainTextEdit, QProgressBar, QPushButton, QScrollArea, QToolButton,
    QVBoxLayout, QWidget,
)

from app.data.chats import Chat
from app.views.chat.message import MessageWidget, plain_label

REPAINT_MS = 40  # streaming repaint period (first token of a reply is painted at once)
BANNER_STYLE = {
    "warning": "background: #fff4d6; border: 1px solid #e6c35c;",
    "error": "background: #fde7e7; border: 1px solid #e08c8c;",
    "info": "background: #e8f1fd; border: 1px solid #9dbde8;",
}


class InputEdit(QPlainTextEdit):
    """The message box: Enter sends, Shift+Enter starts a new line, Esc stops a reply."""

    submitted = Signal()
    escaped = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt override
        if event.key() == Qt.Key.Key_Escape:
            self.escaped.emit()
            return
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class Banner(QFrame):
    """A closable strip of plain text above the chat (template warnings, errors, notices)."""

    def __init__(self, kind: str, text: str, parent: QWidget | None = None,
                 action: tuple[str, Callable[[], None]] | None = None):
        super().__init__(parent)
        self.kind = kind
        self.setObjectName("banner")
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)  # never stretched over the chat
        self.setStyleSheet(f"QFrame#banner {{ {BANNER_STYLE.get(kind, BANNER_STYLE['info'])} border-radius: 4px; }}")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 4, 4, 4)
        self.label = plain_label(text)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.label, 1)
        if action is not None:  # one click that undoes what the banner reports
            self.action = QPushButton(action[0])
            self.action.clicked.connect(lambda: action[1]())
            lay.addWidget(self.action, 0, Qt.AlignmentFlag.AlignTop)
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss")
        close.clicked.connect(self.deleteLater)
        lay.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)


class ChatView(QWidget):
    """Shows one Chat; the controller mutates the chat and tells the view which message changed."""

    send = Signal(str)
    stop = Signal()
    regenerate = Signal()
    edit_resend = Signal(int, str)
    continue_reply = Signal()
    system_prompt_edited = Signal(str)
    draft_edited = Signal(str)
    version_requested = Signal(int, int)  # (message index, version)
    why_requested = Signal(int, int)  # (message index, token position in that reply): "Why this token?"
    branch_requested = Signal(int, str)  # (message index, new text): a new chat continues from the edit
    prompt_mode_chosen = Signal(str)  # 'template' | 'plain'

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.chat: Chat | None = None
        self.edit_box: QMessageBox | None = None  # the open "replace or branch?" question, if any
        self.setMinimumWidth(360)
        self.widgets: list[MessageWidget] = []
        self.generating = False
        self._dirty: set[int] = set()
        self._timer = QTimer(self, singleShot=True, interval=REPAINT_MS)
        self._timer.timeout.connect(self._repaint)
        self._stick = True
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.banners = QVBoxLayout()
        lay.addLayout(self.banners)
        lay.addWidget(self._system_box())
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        host = QWidget()
        self.list = QVBoxLayout(host)
        self.list.setContentsMargins(2, 2, 6, 2)
        self.list.setSpacing(8)
        self.empty = plain_label("Ask the model something. Enter sends, Shift+Enter adds a line, Esc stops a reply.",
                                 "color: #888; padding: 20px;")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.list.addWidget(self.empty)
        self.list.addStretch(1)
        self.scroll.setWidget(host)
        bar = self.scroll.verticalScrollBar()
        bar.rangeChanged.connect(lambda _lo, hi: bar.setValue(hi) if self._stick else None)
        bar.valueChanged.connect(lambda v: setattr(self, "_stick", v >= bar.maximum() - 30))
        lay.addWidget(self.scroll, 1)
        self.prefill_label = plain_label("", "color: #555;")
        self.prefill_bar = QProgressBar()
        self.prefill_bar.setMaximumHeight(12)
        self.prefill_bar.setTextVisible(False)
        for w in (self.prefill_label, self.prefill_bar):
            w.hide()
            lay.addWidget(w)
        lay.addLayout(self._input_row())
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, activated=self._stop_if_busy)

    def _system_box(self) -> QWidget:
        box = QWidget()
        v = QVBoxLayout(box)
        v.setContentsMargins(0, 0, 0, 0)
        self.kind_label = QLabel("")  # "base model: continues text, ..." for a base model
        self.kind_label.setTextFormat(Qt.TextFormat.PlainText)
        self.kind_label.setWordWrap(True)
        self.kind_label.setStyleSheet("color: #8a5a00; background: #fff8e6; border-radius: 4px; padding: 3px 6px;")
        self.kind_label.hide()
        v.addWidget(self.kind_label)
        self.prompt_mode = QComboBox()
        self.prompt_mode.addItem("chat template", "template")
        self.prompt_mode.addItem("plain text", "plain")
        self.prompt_mode.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.prompt_mode.setSizePolicy(QSizePolicy.Policy.Minimum, QSizePolicy.Policy.Fixed)
        self.prompt_mode.setToolTip("How this chat's messages reach the model: wrapped in its chat template (for an "
                                    "instruct model), or as plain text that a base model continues")
        self.prompt_mode.activated.connect(lambda _i: self.prompt_mode_chosen.emit(self.prompt_mode.currentData()))
        self.system_toggle = QToolButton()
        self.system_toggle.setText("System prompt")
        self.system_toggle.setCheckable(True)
        self.system_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.system_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.system_toggle.setAutoRaise(True)
        self.system_edit = QPlainTextEdit()
        self.system_edit.setPlaceholderText("Instructions the model sees before every message of this chat")
        self.system_edit.setMaximumHeight(90)
        self.system_edit.hide()
        self.system_toggle.toggled.connect(self._toggle_system)
        self.system_edit.textChanged.connect(lambda: self.system_prompt_edited.emit(self.system_edit.toPlainText()))
        row = QHBoxLayout()
        row.addWidget(self.system_toggle)
        row.addStretch(1)
        row.addWidget(QLabel("Prompt:"))
        row.addWidget(self.prompt_mode)
        v.addLayout(row)
        v.addWidget(self.system_edit)
        return box

    def _toggle_system(self, on: bool) -> None:
        self.system_edit.setVisible(on)
        self.system_toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)

    def _input_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.input = InputEdit()
        self.input.setPlaceholderText("Message the model…")
        self.input.setMaximumHeight(110)
        self.input.setMinimumHeight(52)
        self.input.submitted.connect(self._submit)
        self.input.escaped.connect(self._stop_if_busy)
        self.input.textChanged.connect(lambda: self.draft_edited.emit(self.input.toPlainText()))
        self.send_button = QPushButton("Send")
        self.send_button.setMinimumWidth(80)
        self.send_button.clicked.connect(self._send_or_stop)
        row.addWidget(self.input, 1)
        row.addWidget(self.send_button, 0, Qt.AlignmentFlag.AlignBottom)
        return row

    # -- user actions
    def _submit(self) -> None:
        text = self.input.toPlainText()
        if not text.strip():
            return
        if self.generating:
            return  # Enter while a reply streams does nothing; the text stays in the box
        self.send.emit(text)

    def _send_or_stop(self) -> None:
        if self.generating:
            self.stop.emit()
        else:
            self._submit()

    def _stop_if_busy(self) -> None:
        if self.generating:
            self.stop.emit()

    def clear_input(self) -> None:
        self.input.clear()

    def set_placeholder(self, text: str) -> None:
        """The input box's hint ('Loading the model…', 'Message the model…'), repainted at once: Qt repaints a
        QPlainTextEdit's placeholder only when it appears or goes, not when its text changes while shown."""
        if self.input.placeholderText() != text:
            self.input.setPlaceholderText(text)
            self.input.viewport().update()

    def set_input(self, text: str) -> None:
        self.input.blockSignals(True)
        self.input.setPlainText(text)
        self.input.blockSignals(False)
        self.input.moveCursor(QTextCursor.MoveOperation.End)

    # -- showing a chat
    def show_chat(self, chat: Chat) -> None:
        """Rebuild the view for another chat (or the same one after a big change)."""
        self.chat = chat
        for w in self.widgets:
            w.hide()
            w.deleteLater()
        self.widgets = []
        self._dirty.clear()
        for i in range(len(chat.messages)):
            self._add_widget(i)
        self.system_edit.blockSignals(True)
        self.system_edit.setPlainText(chat.system_prompt)
        self.system_edit.blockSignals(False)
        self.system_toggle.setText("System prompt" + (" (set)" if chat.system_prompt.strip() else ""))
        self.set_input(chat.draft)
        self._stick = True
        self._update_actions()

    def _add_widget(self, index: int) -> None:
        w = MessageWidget(index, self.chat.messages[index])
        w.edit_resend.connect(self.confirm_edit)
        w.regenerate.connect(self.regenerate)
        w.continue_reply.connect(self.continue_reply)
        w.version_requested.connect(self.version_requested)
        w.why_requested.connect(self.why_requested)
        self.list.insertWidget(self.list.count() - 1, w)
        w.show()
        self.widgets.append(w)
        self.empty.hide()

    def sync(self) -> None:
        """Match the widgets to the chat's messages (added at the end, or cut after an edit)."""
        if self.chat is None:
            return
        msgs = self.chat.messages
        while len(self.widgets) > len(msgs) or any(w.message is not m for w, m in zip(self.widgets, msgs)):
            w = self.widgets.pop()
            w.hide()
            w.deleteLater()
        for i in range(len(self.widgets), len(msgs)):
            self._add_widget(i)
        self.empty.setVisible(not msgs)
        self._update_actions()

    def message_changed(self, index: int, at_once: bool = False) -> None:
        """A message's text grew; repaint now (first token) or within REPAINT_MS, batched."""
        self._dirty.add(index)
        if at_once:
            self._timer.stop()
            self._repaint()
        elif not self._timer.isActive():
            self._timer.start()

    def _repaint(self) -> None:
        dirty, self._dirty = self._dirty, set()
        for i in sorted(dirty):
            if 0 <= i < len(self.widgets):
                w = self.widgets[i]
                w.streaming = self.generating and i == len(self.widgets) - 1
                w.refresh()

    def set_generating(self, on: bool) -> None:
        self.generating = on
        self.send_button.setText("Stop" if on else "Send")
        self.send_button.setToolTip("Stop the reply (Esc)" if on else "Send (Enter)")
        if not on:
            self.set_prefill(0, 0)
            if self.widgets:
                self._dirty.add(len(self.widgets) - 1)
            self._timer.stop()
            self._repaint()
            for w in self.widgets:
                w.streaming = False
                w.refresh()
        self._update_actions()

    def _update_actions(self) -> None:
        n = len(self.widgets)
        for i, w in enumerate(self.widgets):
            w.set_actions(last=i == n - 1, idle=not self.generating)

    def set_prefill(self, done: int, total: int) -> None:
        """Prompt-processing progress; hidden when total is 0 or the prompt is short."""
        show = total > 0 and done < total
        if show:
            self.prefill_label.setText(f"Reading the prompt: {done:,} / {total:,} tokens")
            self.prefill_bar.setRange(0, total)
            self.prefill_bar.setValue(done)
        self.prefill_label.setVisible(show)
        self.prefill_bar.setVisible(show)

    def confirm_edit(self, index: int, text: str) -> None:
        """Edit and resend: when later turns exist, ask whether to replace them or to branch into a new chat."""
        later = len(self.chat.messages) - index - 1 if self.chat is not None else 0
        if later <= 0:
            self.edit_resend.emit(index, text)
            return
        box = QMessageBox(QMessageBox.Icon.Question, "GGUF Lens", "Resend the edited message?", parent=self)
        box.setTextFormat(Qt.TextFormat.PlainText)
        box.setInformativeText(f"The {later} message{'s' if later > 1 else ''} after it would be removed from this "
                               "chat. A branch keeps this chat as it is and continues in a new one.")
        replace = box.addButton("Replace later messages", QMessageBox.ButtonRole.DestructiveRole)
        branch = box.addButton("Branch into a new chat", QMessageBox.ButtonRole.AcceptRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(branch)

        def answered(button: object) -> None:
            if button is replace:
                self.edit_resend.emit(index, text)
            elif button is branch:
                self.branch_requested.emit(index, text)

        box.buttonClicked.connect(answered)
        self.edit_box = box
        box.open()

    def show_model_kind(self, base: bool, why: str, encoder_decoder: bool = False) -> None:
        """Say that the model is a base model (it continues text) or an encoder-decoder (input -> output), or hide
        the note for an instruct model."""
        from app.records.model_kind import BASE_NOTE, ENCODER_DECODER_NOTE  # noqa: PLC0415

        if encoder_decoder:
            self.kind_label.setText(f"{ENCODER_DECODER_NOTE[0].upper()}{ENCODER_DECODER_NOTE[1:]}. The Attention lens "
                                    "shows the encoder's, the decoder's and the cross-attention.")
        else:
            self.kind_label.setText(f"{BASE_NOTE}. Replies are short by default and the prompt is plain text "
                                    f"(no chat template); {why}." if base else "")
        self.kind_label.setVisible(base)

    def show_prompt_mode(self, mode: str) -> None:
        """The prompt mode in use for the chat shown ('template' or 'plain')."""
        self.prompt_mode.setCurrentIndex(max(0, self.prompt_mode.findData(mode)))

    # -- banners
    def show_banner(self, kind: str, text: str, action: tuple[str, Callable[[], None]] | None = None) -> Banner:
        for i in range(self.banners.count()):
            b = self.banners.itemAt(i).widget()
            if isinstance(b, Banner) and b.label.text() == text:
                return b
        banner = Banner(kind, text, action=action)
        self.banners.addWidget(banner)
        return banner

    def clear_banners(self, kind: str | None = None) -> None:
        for i in reversed(range(self.banners.count())):
            b = self.banners.itemAt(i).widget()
            if isinstance(b, Banner) and (kind is None or b.kind == kind):
                self.banners.removeWidget(b)
                b.deleteLater()

    def banner_texts(self) -> list[str]:
        out = []
        for i in range(self.banners.count()):
            b = self.banners.itemAt(i).widget()
            if isinstance(b, Banner):
                out.append(b.label.text())
        return out
