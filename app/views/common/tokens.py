"""Tokens as the lenses show them: axis labels with whitespace made visible, HTML for text, a token axis."""
from __future__ import annotations

import html
import math

import pyqtgraph as pg

_VISIBLE = str.maketrans({" ": "·", "\n": "⏎", "\t": "⇥", "\r": "␍"})


def token_label(text: str, limit: int = 12) -> str:
    """A token as an axis label: whitespace made visible, long tokens cut with an ellipsis."""
    shown = text.translate(_VISIBLE) if text.strip() != text or "\n" in text else text
    shown = shown or "∅"
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def token_html(text: str) -> str:
    """A token as HTML for the text view: escaped, newlines kept as line breaks."""
    return html.escape(text).replace("\n", "⏎<br>") or "∅"


class TokenAxis(pg.AxisItem):
    """An axis in token-index coordinates that shows token texts when they fit and indices otherwise."""

    def __init__(self, orientation: str, **kw):
        super().__init__(orientation, **kw)
        self.texts: tuple[str, ...] = ()
        vertical = orientation in ("left", "right")
        self.px_per_label = 14 if vertical else 44  # horizontal labels are cut shorter so more of them fit
        self.label_chars = 12 if vertical else 6

    def set_tokens(self, texts: tuple[str, ...] | list[str]) -> None:
        self.texts = tuple(texts)
        self.picture = None
        self.update()

    def tickValues(self, minVal: float, maxVal: float, size: float):  # noqa: N802, N803 - pyqtgraph API
        minVal, maxVal = sorted((minVal, maxVal))  # an inverted view box hands the range over reversed
        lo, hi = max(0.0, minVal), min(float(len(self.texts)), maxVal) if self.texts else maxVal
        span = max(hi - lo, 1e-9)
        n_fit = max(1, int(size / self.px_per_label))
        if self.texts and span <= n_fit:  # every token fits: one tick at each cell centre
            first, last = int(math.floor(lo)), int(math.ceil(hi))
            return [(1.0, [i + 0.5 for i in range(first, last)])]
        step = _nice_step(span / n_fit)
        first = math.ceil(lo / step) * step
        return [(step, [v + 0.5 for v in _frange(first, hi, step)])]

    def tickStrings(self, values, scale, spacing):  # noqa: N802 - pyqtgraph API
        out = []
        for v in values:
            i = int(math.floor(v))
            if spacing <= 1.0 and 0 <= i < len(self.texts):
                out.append(token_label(self.texts[i], self.label_chars))
            else:
                out.append(str(i))
        return out


def _nice_step(raw: float) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that is >= raw."""
    if raw <= 1:
        return 1
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return int(m * mag)
    return int(10 * mag)


def _frange(start: float, stop: float, step: float) -> list[float]:
    n = max(0, int((stop - start) / step) + 1)
    return [start + i * step for i in range(min(n, 500))]
