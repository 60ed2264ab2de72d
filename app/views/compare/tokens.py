"""The text coloured by per-token KLD, the KLD strip under it, and both next-token distributions of a clicked token."""
from __future__ import annotations

import html
import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QUrl, Signal
from PySide6.QtWidgets import QLabel, QSizePolicy, QTextBrowser, QVBoxLayout, QWidget

from app.records.compare import TOP_K, CompareRecord
from app.views.common.tokens import token_html, token_label

A_COLOUR = (0, 114, 178)  # Okabe-Ito blue for A, vermillion for B
B_COLOUR = (213, 94, 0)
KLD_FLOOR = 1e-6
SCALE_QUANTILES = (0.05, 0.99)  # the text's shading runs over log KLD between these quantiles of the comparison


def kld_scale(kld: np.ndarray) -> tuple[float, float]:
    """(white, red) ends of the shading: this comparison's 5th and 99th percentile KLD, at least a decade apart."""
    if kld.size == 0:
        return KLD_FLOOR, 1.0
    lo, hi = (max(float(q), KLD_FLOOR) for q in np.quantile(kld, SCALE_QUANTILES))
    return lo, max(hi, 10 * lo)


def kld_level(kld: float, scale: tuple[float, float]) -> float:
    """0..1: where a KLD sits on the log shading scale."""
    lo, hi = math.log10(scale[0]), math.log10(scale[1])
    return float(np.clip((math.log10(max(kld, KLD_FLOOR)) - lo) / (hi - lo), 0.0, 1.0))


def kld_background(kld: float, scale: tuple[float, float]) -> str:
    """An rgba() background for a token: white at the low end of the scale, deep red at the top."""
    return f"rgba(215,48,39,{0.85 * kld_level(kld, scale):.2f})"


class KldText(QTextBrowser):
    """The compared text, each token shaded by KL(A‖B) of the prediction made after it; click to select."""

    token_clicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._clicked)
        self.record: CompareRecord | None = None
        self.selected = -1

    def set_record(self, rec: CompareRecord, selected: int = -1) -> None:
        """Show the text of a comparison with one token outlined."""
        self.record = rec
        self.selected = selected
        parts = []
        scale = kld_scale(rec.kld)
        for i, text in enumerate(rec.token_texts):
            style = f"background:{kld_background(float(rec.kld[i]), scale)};color:#000;text-decoration:none"
            if i == selected:
                style += ";border:2px solid #000;font-weight:bold"
            title = f"token {i}: KLD {rec.kld[i]:.4g}"
            parts.append(f'<a href="t:{i}" title="{title}" style="{style}">{token_html(text)}</a>')
        bar = self.verticalScrollBar().value()
        self.setHtml("<div style='font-family:monospace;font-size:10pt;line-height:150%'>" + "".join(parts) + "</div>")
        self.verticalScrollBar().setValue(bar)

    def _clicked(self, url: QUrl) -> None:
        text = url.toString()
        if text.startswith("t:"):
            self.token_clicked.emit(int(text[2:]))


class KldStrip(pg.PlotWidget):
    """One bar per token: KL(A‖B) of the next-token distributions; the selected token is marked; click to select."""

    token_clicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent, background="w")
        self.setMenuEnabled(False)
        self.hideButtons()
        self.setLabel("left", "KLD")
        self.setMouseEnabled(x=True, y=False)
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.9, brush=pg.mkBrush(215, 48, 39, 200), pen=None)
        self.addItem(self.bars)
        self.cursor = pg.InfiniteLine(angle=90, pen=pg.mkPen((0, 0, 0), width=1.5))
        self.cursor.setVisible(False)
        self.addItem(self.cursor)
        self.scene().sigMouseClicked.connect(self._clicked)
        self.n = 0

    def set_record(self, rec: CompareRecord) -> None:
        self.n = rec.n_tokens
        self.bars.setOpts(x=np.arange(self.n), height=rec.kld, width=0.9)
        self.setXRange(-0.5, self.n - 0.5, padding=0.01)
        top = float(np.quantile(rec.kld, 0.995)) if self.n else 1.0
        self.setYRange(0, max(top, 1e-6) * 1.05, padding=0)
        lo, hi = kld_scale(rec.kld)
        self.setTitle(f"KL(A‖B) per token · mean {rec.stats.kld_mean:.3g} · max {rec.stats.kld_max:.3g} · text: "
                      f"log KLD, {lo:.2g} white → {hi:.2g} red", size="8pt")

    def select(self, i: int) -> None:
        self.cursor.setValue(i)
        self.cursor.setVisible(0 <= i < self.n)

    def _clicked(self, ev) -> None:
        if self.n == 0:
            return
        pos = self.getViewBox().mapSceneToView(ev.scenePos())
        i = int(round(pos.x()))
        if 0 <= i < self.n:
            self.token_clicked.emit(i)


class TopBars(QWidget):
    """A's and B's ten most likely next tokens after the selected one, each bar beside the other model's p."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.header = QLabel("Click a token to see both models' next-token distributions.")
        self.header.setWordWrap(True)
        self.header.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setBackground("w")
        box = QVBoxLayout(self)
        box.setContentsMargins(0, 0, 0, 0)
        box.setSpacing(2)
        box.addWidget(self.header)
        box.addWidget(self.graphics, 1)
        self.plots = []
        for col, (name, colour) in enumerate((("A", A_COLOUR), ("B", B_COLOUR))):
            plot = self.graphics.addPlot(row=0, col=col, title=f"{name}: top {TOP_K}")
            plot.invertY(True)
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.setMouseEnabled(x=False, y=False)
            plot.setLabel("bottom", "p")
            plot.getAxis("bottom").enableAutoSIPrefix(False)
            self.plots.append((plot, colour))

    def show_position(self, rec: CompareRecord, i: int) -> None:
        """Bars for the prediction made after token i (filled: this model; outlined: the other model)."""
        after = token_label(rec.token_texts[i], 20)
        nxt = f" (next in the text: “{token_label(rec.token_texts[i + 1], 20)}”)" if i + 1 < rec.n_tokens else ""
        for (plot, colour), side, other_colour in zip(self.plots, ("a", "b"), (B_COLOUR, A_COLOUR)):
            plot.clear()
            rows = rec.top(i, side)
            y = np.arange(len(rows))
            mine = np.array([p for _, p, _ in rows])
            other = np.array([q for _, _, q in rows])
            plot.addItem(pg.BarGraphItem(x0=0, y=y, height=0.7, width=mine, brush=pg.mkBrush(*colour, 200), pen=None))
            plot.addItem(pg.BarGraphItem(x0=0, y=y, height=0.35, width=other, brush=pg.mkBrush(*other_colour, 90),
                                         pen=pg.mkPen(other_colour, width=1)))
            ticks = [(float(k), token_label(t, 10)) for k, (t, _, _) in enumerate(rows)]
            plot.getAxis("left").setTicks([ticks])
            plot.setXRange(0, max(1e-3, float(max(mine.max(initial=0), other.max(initial=0)))) * 1.05, padding=0)
            plot.setYRange(-0.6, TOP_K - 0.4, padding=0)
            plot.setTitle(f"<span style='color:{_hex(colour)}'>{'A' if side == 'a' else 'B'}</span>", size="9pt")
        self.header.setText(f"After token {i} “{html.escape(after)}”{html.escape(nxt)} · KLD {rec.kld[i]:.3g} · "
                            f"<span style='color:{_hex(A_COLOUR)}'>A</span> and "
                            f"<span style='color:{_hex(B_COLOUR)}'>B</span> top {TOP_K}; thin bars: the other model's p")


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#%02x%02x%02x" % rgb
