"""Safe rich text for replies: Markdown without HTML or images, code blocks shaded, and a token-by-token view."""
from __future__ import annotations

import html
import math
from typing import Sequence

from PySide6.QtCore import QSize, Qt, QUrl, Signal
from PySide6.QtGui import QColor, QFontDatabase, QPalette, QTextBlockFormat, QTextCharFormat, QTextCursor, QTextDocument, QTextFormat
from PySide6.QtWidgets import QFrame, QSizePolicy, QTextBrowser, QWidget

from app.records.reply import TokenRecord

MD_FEATURES = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML


def render_markdown(doc: QTextDocument, text: str, code_bg: QColor) -> None:
    """Fill doc from Markdown: raw HTML stays literal text, images become '[image: alt]', code is shaded."""
    doc.setMarkdown(text, MD_FEATURES)
    mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    code = QTextBlockFormat()
    code.setBackground(code_bg)
    code.setLeftMargin(6)
    code.setNonBreakableLines(False)  # a long line of code wraps inside the bubble (its view never scrolls sideways)
    block = doc.begin()
    while block.isValid():
        if block.blockFormat().hasProperty(QTextFormat.Property.BlockCodeFence):
            cur = QTextCursor(block)
            cur.mergeBlockFormat(code)
            fmt = QTextCharFormat()
            fmt.setFont(mono)
            cur.select(QTextCursor.SelectionType.BlockUnderCursor)
            cur.mergeCharFormat(fmt)
        _replace_images(block)
        block = block.next()


def _replace_images(block: object) -> None:
    it = block.begin()  # type: ignore[attr-defined]
    spans = []
    while not it.atEnd():
        frag = it.fragment()
        if frag.isValid() and frag.charFormat().isImageFormat():
            alt = frag.charFormat().toImageFormat().name()
            spans.append((frag.position(), frag.length(), alt))
        it += 1
    for pos, length, url in reversed(spans):
        cur = QTextCursor(block.document())  # type: ignore[attr-defined]
        cur.setPosition(pos)
        cur.setPosition(pos + length, QTextCursor.MoveMode.KeepAnchor)
        cur.insertText(f"[image: {url[:200]}]", QTextCharFormat())


def token_html(tokens: Sequence[TokenRecord], selected: int = -1, fg: str = "#000000") -> str:
    """Each token as a link 'tok:i', shaded by how unlikely it was (escaped text; newlines shown as ↵)."""
    parts = ['<p style="white-space: pre-wrap; line-height: 140%;">']
    for i, (_tid, text, logprob, _alts) in enumerate(tokens):
        p = math.exp(logprob) if logprob <= 0 else 1.0
        shown = html.escape(text.replace("\n", "↵\n"), quote=True) or "∅"
        deco = "underline" if i == selected else "none"
        parts.append(f'<a href="tok:{i}" style="color: {fg}; background-color: {prob_color(p, i % 2)}; '
                     f'text-decoration: {deco};">{shown}</a>')
    parts.append("</p>")
    return "".join(parts)


def prob_color(p: float, alt: int = 0) -> str:
    """Green-grey tint for likely tokens, strong orange for unlikely ones; `alt` darkens every other token."""
    p = min(1.0, max(0.0, p))
    c = QColor.fromHsvF(0.07 + 0.2 * p, 0.12 + 0.6 * (1 - p), 1.0 - 0.07 * alt)
    return c.name()


class RichView(QTextBrowser):
    """A read-only text area that sizes to its content, opens no links and loads no resources."""

    token_clicked = Signal(int)
    link_clicked = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        self.document().setDocumentMargin(2)
        self.viewport().setAutoFillBackground(False)
        self.anchorClicked.connect(self._on_anchor)
        self._last_width = -1

    def loadResource(self, kind: int, name: QUrl) -> object:  # noqa: N802 - Qt override
        """Never load images, stylesheets or files named by untrusted text."""
        return None

    def set_markdown(self, text: str) -> None:
        code_bg = self.palette().color(QPalette.ColorRole.AlternateBase).darker(104)
        render_markdown(self.document(), text, code_bg)
        self._fit()

    def set_plain(self, text: str) -> None:
        self.setPlainText(text)
        self._fit()

    def set_tokens(self, tokens: Sequence[TokenRecord], selected: int = -1) -> None:
        fg = QColor("#101010").name()
        self.document().setHtml(token_html(tokens, selected, fg))
        self._fit()

    def _on_anchor(self, url: QUrl) -> None:
        text = url.toString()
        if text.startswith("tok:") and text[4:].isdigit():
            self.token_clicked.emit(int(text[4:]))
        else:
            self.link_clicked.emit(text)

    def _fit(self) -> None:
        width = max(50, self.viewport().width())
        doc = self.document()
        doc.setTextWidth(width)
        height = int(math.ceil(doc.size().height())) + 2 * self.frameWidth() + 2
        if self.height() != height:
            self.setFixedHeight(height)
        self._last_width = width

    def resizeEvent(self, event: object) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        if self.viewport().width() != self._last_width:
            self._fit()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(400, self.height())
