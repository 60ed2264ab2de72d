"""The context as text, each earlier token tinted by how much one query token attends to it."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QUrl, Signal
from PySide6.QtWidgets import QTextBrowser

from app.views.common.colours import colormap
from app.views.common.tokens import token_html

MAX_TOKENS = 600  # tokens rendered before the query; older ones are summarised in one line


class TokenTextView(QTextBrowser):
    """Tokens as HTML spans; clicking one asks for its attention row (token_clicked)."""

    token_clicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._anchor)
        self.cmap_name = "viridis"
        self.index: int | None = None
        self.setPlaceholderText("Click a token (or a cell of the heatmap) to tint the context by its attention.")

    def _anchor(self, url: QUrl) -> None:
        text = url.toString()
        if text.startswith("tok:"):
            self.token_clicked.emit(int(text[4:]))

    def show_row(
        self,
        texts: tuple[str, ...],
        index: int,
        weights: np.ndarray | None,
        *,
        window: int | None = None,
        hidden: tuple[int, ...] = (),
        title: str = "",
    ) -> None:
        """Render tokens 0..index (and a few after, greyed) with backgrounds from `weights` (N,) of query `index`."""
        self.index = index
        n = len(texts)
        lo = max(0, index - MAX_TOKENS)
        hi = min(n, index + 40)
        cmap = colormap(self.cmap_name)
        w = np.zeros(n, np.float32) if weights is None else np.nan_to_num(np.asarray(weights, np.float32)[:n])
        visible = w[lo : index + 1].copy()
        if lo == 0 and len(visible) > 1:
            visible[0] = 0.0  # the sink is scaled apart: it saturates instead of washing out every other token
        for k in hidden:
            if lo <= k <= index:
                visible[k - lo] = 0.0  # hidden sinks do not set the scale either
        top = float(visible.max()) if visible.size and visible.max() > 0 else 1.0
        parts = [f"<p style='color:#555'>{title}</p>"] if title else []
        if lo > 0:
            parts.append(f"<span style='color:#888'>… {lo} earlier tokens not shown …</span> ")
        for j in range(lo, hi):
            body = token_html(texts[j])
            if j > index:
                parts.append(f"<span style='color:#bbb'>{body}</span>")
                continue
            outside = window is not None and index - j >= window
            frac = 0.0 if j in hidden or outside else min(1.0, float(w[j]) / top)
            alpha = frac**0.6  # blend towards white so weak weights stay readable
            r, g, b = (int(255 * (1 - alpha) + c * alpha) for c in cmap.map(np.array([frac]), mode="byte")[0][:3])
            ink = "#000" if (0.299 * r + 0.587 * g + 0.114 * b) > 140 else "#fff"
            if outside:
                style = "color:#aaa;text-decoration:line-through"
            elif weights is None:
                style = "color:#000"
            else:
                style = f"background-color:rgb({r},{g},{b});color:{ink}"
            if j == index:
                style += ";font-weight:bold;text-decoration:underline"
                parts.append("<a name='query'></a>")
            tip = f"key {j}: {w[j]:.4f}" if weights is not None else f"token {j}"
            parts.append(f"<a href='tok:{j}' title='{tip}' style='text-decoration:none;{style}'><span style='{style}'>{body}</span></a>")
        self.setHtml("<div style='font-family:monospace;font-size:11pt;line-height:160%'>" + "".join(parts) + "</div>")
        self.scrollToAnchor("query")
