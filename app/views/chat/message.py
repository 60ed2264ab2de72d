"""One message in the chat: header with actions, the body (Markdown, tokens, or an editor), and its stats."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCursor, QGuiApplication
from PySide6.QtWidgets import (
    QFrame, QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QToolButton, QVBoxLayout, QWidget,
)

from app.data.chats import Message
from app.views.chat.markdown import RichView
from app.views.chat.token_popup import TokenPopup
from engine.chat.reasoning import THINK_CLOSE, THINK_OPEN, Reasoning, split_reasoning

ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}
STYLE = {
    "user": "QFrame#message { background: #eef3fb; border: 1px solid #d3def0; border-radius: 8px; }",
    "assistant": "QFrame#message { background: #ffffff; border: 1px solid #e2e2e2; border-radius: 8px; }",
}


def plain_label(text: str = "", style: str = "") -> QLabel:
    """A QLabel that never interprets its text as rich text."""
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setWordWrap(True)
    if style:
        label.setStyleSheet(style)
    return label


class MessageWidget(QFrame):
    """Shows one Message; emits what the user asks of it (edit and resend, regenerate, continue)."""

    edit_resend = Signal(int, str)  # (message index, new text)
    regenerate = Signal()
    continue_reply = Signal()
    version_requested = Signal(int, int)  # (message index, version to show)
    why_requested = Signal(int, int)  # (message index, token position in the reply): "Why this token?"

    def __init__(self, index: int, message: Message, parent: QWidget | None = None):
        super().__init__(parent)
        self.index = index
        self.message = message
        self.role = message.role
        self.setObjectName("message")
        self.setStyleSheet(STYLE.get(self.role, ""))
        self.streaming = False
        self.selected_token = -1
        self._shown = None  # what the body shows now, to skip identical repaints
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 6)
        lay.setSpacing(3)
        head = QHBoxLayout()
        self.role_label = plain_label(ROLE_NAMES.get(self.role, self.role), "font-weight: bold; color: #444;")
        self.role_label.setWordWrap(False)
        head.addWidget(self.role_label)
        head.addStretch(1)
        self.prev_version = self._tool("‹", "The previous version of this reply")
        self.version_label = plain_label("", "color: #555;")
        self.version_label.setWordWrap(False)
        self.version_label.setToolTip("Versions of this reply: Regenerate keeps the earlier ones")
        self.next_version = self._tool("›", "The next version of this reply")
        self.prev_version.clicked.connect(lambda: self._step_version(-1))
        self.next_version.clicked.connect(lambda: self._step_version(1))
        self.tokens_button = self._tool("Tokens", "Show the reply token by token; click a token for its alternatives")
        self.tokens_button.setCheckable(True)
        self.tokens_button.toggled.connect(lambda _on: self.refresh(force=True))
        self.copy_button = self._tool("Copy", "Copy the text")
        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.copy_text()))
        self.edit_button = self._tool("Edit", "Edit this message and resend from here")
        self.edit_button.clicked.connect(self.start_edit)
        self.regen_button = self._tool("Regenerate", "A new version of this reply (the earlier ones are kept: ‹ ›)")
        self.regen_button.clicked.connect(self.regenerate)
        self.continue_button = self._tool("Continue", "Let the model continue this reply")
        self.continue_button.clicked.connect(self.continue_reply)
        for b in (self.tokens_button, self.copy_button, self.edit_button, self.regen_button):
            head.addWidget(b)
        lay.addLayout(head)
        # a reasoning model's thinking, collapsed above its answer (as LM Studio shows it)
        self.reasoning_button = self._tool("", "Show or hide the model's reasoning")
        self.reasoning_button.setCheckable(True)
        self.reasoning_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.reasoning_button.toggled.connect(lambda _on: self.refresh(force=True))
        self.reasoning_view = RichView()  # wraps a long word anywhere: a label would widen the bubble past the chat
        self.reasoning_view.setStyleSheet("QTextBrowser { color: #666; border: none; border-left: 3px solid #ddd; "
                                          "padding-left: 6px; }")
        lay.addWidget(self.reasoning_button, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addWidget(self.reasoning_view)
        self.reasoning: Reasoning = Reasoning("", "")
        self.body = RichView()
        self.body.token_clicked.connect(self._show_alternatives)
        lay.addWidget(self.body)
        self.editor: QPlainTextEdit | None = None
        self.editor_bar: QWidget | None = None
        self.note = plain_label("", "color: #a05a00;")
        self.stats = plain_label("", "color: #777; font-size: 11px;")
        self.model_label = plain_label("", "color: #555; font-size: 11px;")  # the model (and quantization) that wrote it
        lay.addWidget(self.note)
        foot = QHBoxLayout()  # under the reply, as LM Studio: < 2/3 > and the model that wrote it
        foot.setSpacing(2)
        for w in (self.prev_version, self.version_label, self.next_version):
            foot.addWidget(w)
        foot.addSpacing(6)
        foot.addWidget(self.model_label, 1)
        foot.addWidget(self.continue_button, 0, Qt.AlignmentFlag.AlignTop)
        lay.addLayout(foot)
        lay.addWidget(self.stats)
        self.popup: TokenPopup | None = None
        self.set_actions(last=False, idle=True)
        self.refresh(force=True)

    def _tool(self, text: str, tip: str) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.setAutoRaise(True)
        b.setCursor(QCursor(Qt.CursorShape.PointingHandCursor))
        return b

    def set_actions(self, last: bool, idle: bool) -> None:
        """Which buttons make sense: edit (user), regenerate and continue (the last reply, when idle)."""
        m = self.message
        is_reply = self.role == "assistant"
        self.tokens_button.setVisible(is_reply and bool(m.tokens))
        self.edit_button.setVisible(self.role == "user")
        self.edit_button.setEnabled(idle)
        self.regen_button.setVisible(is_reply and last)
        self.regen_button.setEnabled(idle)
        can_continue = last and is_reply and (m.stopped or (m.stats is not None and m.stats.finish_reason == "length"))
        self.continue_button.setVisible(bool(can_continue))
        self.continue_button.setEnabled(idle)
        many = is_reply and m.n_versions > 1
        for w in (self.prev_version, self.version_label, self.next_version):
            w.setVisible(many)
        self.version_label.setText(f"{m.version + 1}/{m.n_versions}")
        self.prev_version.setEnabled(idle and m.version > 0)
        self.next_version.setEnabled(idle and m.version < m.n_versions - 1)

    def _step_version(self, delta: int) -> None:
        target = self.message.version + delta
        if 0 <= target < self.message.n_versions:
            self.version_requested.emit(self.index, target)

    def refresh(self, force: bool = False) -> None:
        """Repaint from the message (cheap when nothing changed)."""
        m = self.message
        if self.editor is not None:
            return
        mode = "tokens" if self.tokens_button.isChecked() and m.tokens else "md" if self.role == "assistant" else "plain"
        key = (mode, len(m.content), len(m.tokens), self.selected_token, m.content[-32:])
        if force or key != self._shown:
            self._show_reasoning(mode == "md")
            if mode == "tokens":
                self.body.set_tokens(m.tokens, self.selected_token)
            elif mode == "md":
                answer = self.reasoning.answer if self.reasoning.style else m.content
                self.body.set_markdown(answer if answer or not self.streaming else "…")
            else:
                self.body.set_plain(m.content)
            self._shown = key
        notes = []
        if m.stopped:
            notes.append("[stopped]")
        if m.error:
            notes.append(m.error)
        if not m.in_context:
            notes.append("left out of the model's context by the overflow policy")
        self.note.setText("  ".join(notes))
        self.note.setVisible(bool(notes))
        self.stats.setText(m.stats.summary() if m.stats and not self.streaming else "")
        model = m.stats.model if m.stats is not None and self.role == "assistant" else ""
        self.model_label.setText(f"written by {model}" if model else "")
        self.model_label.setVisible(bool(model))
        self.stats.setVisible(bool(self.stats.text()))
        self.body.setStyleSheet("" if m.in_context else "color: #888;")

    def _show_reasoning(self, shown: bool) -> None:
        """Split the reply into reasoning and answer; the reasoning's header says how long it is (and whether it
        is still going), its text shows when the header is pressed."""
        m = self.message
        text = m.content if self.role == "assistant" else ""
        self.reasoning = split_reasoning(text, opened=THINK_CLOSE in text and THINK_OPEN not in text)
        r = self.reasoning
        has = bool(r.style) and shown
        words = len(r.reasoning.split())
        arrow = "▾" if self.reasoning_button.isChecked() else "▸"
        self.reasoning_button.setText(f"{arrow} Thinking… ({words} words)" if r.thinking
                                      else f"{arrow} Thought for {words} words")
        self.reasoning_button.setVisible(has)
        self.reasoning_view.set_plain(r.reasoning)
        self.reasoning_view.setVisible(has and self.reasoning_button.isChecked() and bool(r.reasoning))

    def copy_text(self) -> str:
        """What Copy puts on the clipboard: the answer (a reasoning model's thinking left out)."""
        return self.reasoning.answer if self.reasoning.style else self.message.content

    def _show_alternatives(self, position: int) -> None:
        if not 0 <= position < len(self.message.tokens):
            return
        self.selected_token = position
        self.refresh()
        if self.popup is None:
            self.popup = TokenPopup(self)
            self.popup.why_requested.connect(lambda p: self.why_requested.emit(self.index, p))
        self.popup.set_token(position, self.message.tokens[position])
        self.popup.popup_at(QCursor.pos())

    def start_edit(self) -> None:
        """Swap the body for an editor with 'Save & resend' and 'Cancel'."""
        if self.editor is not None:
            return
        self.editor = QPlainTextEdit(self.message.content)
        self.editor.setMinimumHeight(80)
        self.body.hide()
        lay = self.layout()
        lay.insertWidget(2, self.editor)
        self.editor_bar = QWidget()
        bar = QHBoxLayout(self.editor_bar)
        bar.setContentsMargins(0, 0, 0, 0)
        bar.addStretch(1)
        cancel = QPushButton("Cancel")
        save = QPushButton("Save && resend")
        save.setDefault(True)
        bar.addWidget(cancel)
        bar.addWidget(save)
        lay.insertWidget(3, self.editor_bar)
        cancel.clicked.connect(self.end_edit)
        save.clicked.connect(self._resend)
        self.editor.setFocus()

    def _resend(self) -> None:
        text = self.editor.toPlainText() if self.editor else ""
        if text.strip():
            self.end_edit()
            self.edit_resend.emit(self.index, text)

    def end_edit(self) -> None:
        for w in (self.editor, self.editor_bar):
            if w is not None:
                w.hide()
                w.deleteLater()
        self.editor = self.editor_bar = None
        self.body.show()
        self.refresh(force=True)
