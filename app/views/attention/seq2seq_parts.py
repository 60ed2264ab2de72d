"""Parts of the encoder-decoder view: the layers x heads mosaic of one attention kind, one map with its tokens on both
axes, the input tinted by what an output token reads, and one cross-attention cell step by step."""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QUrl, Signal
from PySide6.QtWidgets import QTextBrowser

from app.records.seq2seq import CrossStepRecord
from app.views.common.colours import colormap
from app.views.common.tokens import TokenAxis, token_html, token_label

THUMB = 24  # cells per side of a mosaic thumbnail
GAP = 2


def _pool(w: np.ndarray, side: int = THUMB) -> np.ndarray:
    """(R, C) max-pooled (or repeated) to side x side."""
    r, c = w.shape
    rows = np.minimum((np.arange(side) * r) // side, r - 1)
    cols = np.minimum((np.arange(side) * c) // side, c - 1)
    if r <= side and c <= side:
        return w[rows][:, cols]
    out = np.zeros((side, side), np.float32)
    re = np.linspace(0, r, side + 1).astype(int)
    ce = np.linspace(0, c, side + 1).astype(int)
    for i in range(side):
        block = w[re[i] : max(re[i + 1], re[i] + 1)]
        out[i] = np.maximum.reduceat(block.max(axis=0), np.minimum(ce[:-1], c - 1))
    return out


class Mosaic(pg.GraphicsLayoutWidget):
    """Every (layer, head) of one kind as a small map, layers down and heads across; a click picks one."""

    picked = Signal(int, int)  # layer, head
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setBackground("w")
        self.plot = self.addPlot()
        self.plot.invertY(True)
        self.plot.setAspectLocked(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.setLabel("left", "layer")
        self.plot.setLabel("bottom", "head")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.selection = pg.QtWidgets.QGraphicsRectItem()
        self.selection.setPen(pg.mkPen((230, 30, 30), width=2.5, cosmetic=True))
        self.selection.setZValue(10)
        self.plot.addItem(self.selection)
        self.image.mouseClickEvent = self._click
        self.image.hoverEvent = self._hover
        self.shape = (0, 0)
        self.title = ""

    def set_maps(self, maps: np.ndarray, title: str, cmap: str) -> None:
        """maps (L, H, Q, K): each pooled to a thumbnail, normalised to its own maximum."""
        n_l, n_h = maps.shape[:2]
        self.shape, self.title = (n_l, n_h), title
        step = THUMB + GAP
        mosaic = np.full((n_l * step - GAP, n_h * step - GAP), np.nan, np.float32)
        for i in range(n_l):
            for h in range(n_h):
                t = _pool(np.nan_to_num(maps[i, h]))
                mosaic[i * step : i * step + THUMB, h * step : h * step + THUMB] = t / max(float(t.max()), 1e-9)
        self.image.setImage(mosaic, levels=(0, 1))
        self.image.setColorMap(colormap(cmap))
        ticks = lambda n: [[(k * step + THUMB / 2, str(k)) for k in range(n)]]  # noqa: E731
        self.plot.getAxis("left").setTicks(ticks(n_l))
        self.plot.getAxis("bottom").setTicks(ticks(n_h))
        self.plot.autoRange(padding=0.02)

    def select(self, layer: int, head: int) -> None:
        step = THUMB + GAP
        self.selection.setRect(head * step - 1, layer * step - 1, THUMB + 2, THUMB + 2)

    def _cell(self, pos) -> tuple[int, int] | None:  # noqa: ANN001
        step = THUMB + GAP
        layer, head = int(pos.y() // step), int(pos.x() // step)
        return (layer, head) if 0 <= layer < self.shape[0] and 0 <= head < self.shape[1] else None

    def _click(self, ev) -> None:  # noqa: ANN001
        cell = self._cell(ev.pos())
        if cell is not None:
            ev.accept()
            self.select(*cell)
            self.picked.emit(*cell)

    def _hover(self, ev) -> None:  # noqa: ANN001
        cell = None if ev.isExit() else self._cell(ev.pos())
        if cell is not None:
            self.hovered.emit(f"{self.title}: layer {cell[0]} head {cell[1]} (click to open)")


class MapView(pg.GraphicsLayoutWidget):
    """One attention map with the query tokens down and the key tokens across."""

    cell_clicked = Signal(int, int)
    hovered = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setBackground("w")
        self.left, self.bottom = TokenAxis("left"), TokenAxis("bottom")
        self.plot = self.addPlot(axisItems={"left": self.left, "bottom": self.bottom})
        self.plot.invertY(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), label="attention weight",
                                        interactive=False)
        self.colorbar.setImageItem(self.image, insert_in=self.plot)
        self.image.hoverEvent = self._hover
        self.image.mouseClickEvent = self._click
        self.w: np.ndarray | None = None
        self.q_texts: tuple[str, ...] = ()
        self.k_texts: tuple[str, ...] = ()

    def set_map(self, w: np.ndarray, q_texts: tuple[str, ...], k_texts: tuple[str, ...], q_label: str, k_label: str,
                causal: bool, cmap: str) -> None:
        self.w, self.q_texts, self.k_texts = w, q_texts, k_texts
        shown = np.where(np.tril(np.ones_like(w, bool)), w, np.nan) if causal else w
        self.image.setImage(shown.astype(np.float32), levels=(0, max(float(np.nanmax(w)), 1e-9)))
        self.colorbar.setColorMap(colormap(cmap))
        self.colorbar.setLevels((0, max(float(np.nanmax(w)), 1e-9)))
        self.left.set_tokens(q_texts)
        self.bottom.set_tokens(k_texts)
        self.plot.setLabel("left", q_label)
        self.plot.setLabel("bottom", k_label)
        self.plot.autoRange(padding=0)

    def _cell(self, pos) -> tuple[int, int] | None:  # noqa: ANN001
        if self.w is None:
            return None
        q, k = int(np.floor(pos.y())), int(np.floor(pos.x()))
        return (q, k) if 0 <= q < self.w.shape[0] and 0 <= k < self.w.shape[1] else None

    def _hover(self, ev) -> None:  # noqa: ANN001
        cell = None if ev.isExit() else self._cell(ev.pos())
        if cell is not None and self.w is not None:
            q, k = cell
            self.hovered.emit(f"query {q} “{token_label(self.q_texts[q], 24)}” → key {k} "
                              f"“{token_label(self.k_texts[k], 24)}”: {self.w[q, k]:.4f}")

    def _click(self, ev) -> None:  # noqa: ANN001
        cell = self._cell(ev.pos())
        if cell is not None:
            ev.accept()
            self.cell_clicked.emit(*cell)


class InputTint(QTextBrowser):
    """The output tokens (click one) and the input, each input token tinted by the chosen output token's
    cross-attention: what that output position read."""

    output_clicked = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._anchor)
        self.setPlaceholderText("Write something: the input is tinted by what each output token reads.")

    def _anchor(self, url: QUrl) -> None:
        text = url.toString()
        if text.startswith("out:"):
            self.output_clicked.emit(int(text[4:]))

    def show_row(self, inputs: tuple[str, ...], outputs: tuple[str, ...], index: int, weights: np.ndarray | None,
                 what: str, cmap: str) -> None:
        cm = colormap(cmap)
        out = []
        for j, t in enumerate(outputs):
            style = "font-weight:bold;text-decoration:underline;color:#b00" if j == index else "color:#225"
            out.append(f"<a href='out:{j}' style='text-decoration:none;{style}'>{token_html(t)}</a>")
        parts = ["<p style='color:#555'>Output (click a token):</p><div>", " ".join(out), "</div>",
                 f"<p style='color:#555'>Input, tinted by {html.escape(what)}:</p><div>"]
        w = np.zeros(len(inputs)) if weights is None else np.asarray(weights, np.float64)
        top = float(w.max()) if w.size and w.max() > 0 else 1.0
        for j, t in enumerate(inputs):
            frac = min(1.0, float(w[j]) / top)
            alpha = frac**0.6
            r, g, b = (int(255 * (1 - alpha) + c * alpha) for c in cm.map(np.array([frac]), mode="byte")[0][:3])
            ink = "#000" if (0.299 * r + 0.587 * g + 0.114 * b) > 140 else "#fff"
            parts.append(f"<span title='input {j}: {w[j]:.4f}' style='background-color:rgb({r},{g},{b});"
                         f"color:{ink}'>{token_html(t)}</span>")
        parts.append("</div>")
        self.setHtml("<div style='font-family:monospace;font-size:11pt;line-height:160%'>" + "".join(parts) + "</div>")


def step_html(rec: CrossStepRecord) -> str:
    """A cross-attention cell as the original Transformer draws it: q from the decoder, K and V from the encoder."""
    c, te = rec.cell, rec.cell.keys.shape[0]
    qt = token_label(rec.output_texts[c.query], 24)
    rows = []
    for j in rec.top_keys():
        rows.append(f"<tr><td>{j}</td><td>{html.escape(token_label(rec.input_texts[j], 20))}</td>"
                    f"<td align='right'>{c.scores[j]:+.3f}</td><td align='right'>{c.weights[j]:.4f}</td></tr>")
    head = (f"<b>Cross-attention, decoder layer {c.layer}, head {c.head}, output position {c.query} “"
            f"{html.escape(qt)}”</b><br>")
    shapes = (f"q = row {c.query} of the decoder's W<sub>q</sub> product, head {c.head}: shape ({c.d},), from the "
              f"decoder<br>K = the encoder output × W<sub>k</sub>, KV head {c.kv_head}: shape ({te} × {c.d}), from the "
              f"encoder<br>V = the encoder output × W<sub>v</sub>: shape ({te} × {c.d}), from the encoder<br>"
              f"scores = q · Kᵀ: shape ({te},), not scaled (T5 has no ÷√d<sub>k</sub>) and no position bias across<br>"
              f"weights = softmax(scores): shape ({te},), sum {float(c.weights.sum()):.4f}<br>"
              f"output = weights · V: shape ({c.d},), |output| = {float(np.linalg.norm(c.out)):.4f}<br>")
    table = ("<table cellspacing='6'><tr><th>input</th><th>token</th><th>q·k</th><th>weight</th></tr>"
             + "".join(rows) + "</table>")
    return head + shapes + table
