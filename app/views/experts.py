"""The Experts lens: which experts a Mixture-of-Experts model routes each token to, layer by layer, live.

For the layer picked: a map of experts (rows) x tokens (columns) coloured by the weight each token gave each
expert (or the router's probability over all experts), each token's router entropy under it, and each expert's
load over the chat beside it (how many tokens chose it, and its share of all weight). Clicking a cell shows that
token's experts in every layer and the tokens that expert was chosen for in this layer ("what does expert 12 of
layer 9 do?"). It asks through `routing_requested` (answered with `set_routing(RoutingRecord)`) and only draws.
A dense model gets a sentence saying there is nothing to route.
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QSizePolicy, QSplitter, QStackedWidget, QTextBrowser,
                               QVBoxLayout, QWidget)

from app.records.model import ModelRecord
from app.records.routing import RoutingRecord
from app.views.attention.controls import ElidedLabel, empty_state
from app.views.common.colours import colormap
from app.views.common.tokens import TokenAxis, token_html, token_label

if TYPE_CHECKING:
    from app.views.lenses import LensRequests

    from engine.observe.routing import LayerRouting

DENSE_TEXT = ("This model has no experts: every token goes through the same feed-forward network. The Experts "
              "lens shows routing for Mixture-of-Experts files (qwen3moe, qwen2moe, Mixtral-style llama).")
EMPTY_TEXT = "Send a message to see which experts each token is routed to."
NO_MODEL_TEXT = "Load a model to see its experts."
PICK_TEXT = ("<p style='color:#666'>Click a cell of the map: that token's experts in every layer, and every token "
             "the expert was chosen for in this layer.</p>")
MAX_EXPERT_TICKS = 64  # up to this many experts, every row is labelled
COLOUR_BY = (("weight the token gave it", "weight"), ("router probability", "probs"))
PARTS = (("whole chat", ""), ("last reasoning", "reasoning"), ("last answer", "answer"))  # which tokens count


class ExpertsLens(QWidget):
    """Routing of the chat, one MoE layer at a time (see the module docstring)."""

    title: ClassVar[str] = "Experts"
    routing_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.record: RoutingRecord | None = None
        self.picked: tuple[int, int] | None = None  # (token, expert) clicked
        self._build()

    # ---- layout

    def _build(self) -> None:
        self.layer_box = QComboBox()
        self.colour_box = QComboBox()
        for label, key in COLOUR_BY:
            self.colour_box.addItem(label, key)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Layer"))
        bar.addWidget(self.layer_box)
        bar.addSpacing(12)
        bar.addWidget(QLabel("Colour"))
        bar.addWidget(self.colour_box)
        bar.addSpacing(12)
        self.part_box = QComboBox()
        for label, key in PARTS:
            self.part_box.addItem(label, key)
        self.part_box.setToolTip("The tokens the load and status count and the map shows: the whole chat, or the last "
                                 "reply's reasoning or answer (reasoning models)")
        bar.addWidget(QLabel("Tokens"))
        bar.addWidget(self.part_box)
        bar.addStretch(1)
        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setBackground("w")
        self.tokens_axis = TokenAxis("bottom")
        self.map = self.plots.addPlot(row=0, col=0, axisItems={"bottom": self.tokens_axis})
        self.map.setLabel("left", "expert")
        self.map.invertY(True)
        self.map.setMenuEnabled(False)
        self.map.hideButtons()
        self.image = pg.ImageItem(axisOrder="row-major")
        self.map.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), label="weight", interactive=False)
        self.colorbar.setImageItem(self.image)
        self.plots.addItem(self.colorbar, row=0, col=2)  # beside, not inside: the map and entropy stay aligned
        self.marker = pg.QtWidgets.QGraphicsRectItem()
        self.marker.setPen(pg.mkPen((230, 30, 30), width=2, cosmetic=True))
        self.marker.setVisible(False)
        self.map.addItem(self.marker)
        self.load = self.plots.addPlot(row=0, col=1)
        self.load.setLabel("bottom", "tokens routed")
        self.load.invertY(True)
        self.load.setYLink(self.map)
        self.load.setMenuEnabled(False)
        self.load.hideButtons()
        self.load.getAxis("left").setStyle(showValues=False)
        self.bars = pg.BarGraphItem(x0=[], y=[], height=0.8, width=[], brush=(90, 120, 200))
        self.load.addItem(self.bars)
        self.plots.ci.layout.setColumnStretchFactor(0, 5)
        self.plots.ci.layout.setColumnStretchFactor(1, 1)
        self.entropy = self.plots.addPlot(row=1, col=0)
        self.entropy.setLabel("left", "entropy (bits)")
        self.entropy.setXLink(self.map)
        self.entropy.setMenuEnabled(False)
        self.entropy.hideButtons()
        self.entropy.setMaximumHeight(130)
        self.entropy_curve = self.entropy.plot(pen=pg.mkPen((40, 40, 40), width=1.5), stepMode="center")
        for plot in (self.map, self.entropy):  # one width for both left axes: token columns line up
            plot.getAxis("left").setWidth(54)
        self.detail = QTextBrowser()
        self.detail.setOpenLinks(False)
        self.detail.setMinimumWidth(180)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.plots)
        self.splitter.addWidget(self.detail)
        self.splitter.setSizes([650, 260])
        self.empty = empty_state(NO_MODEL_TEXT)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(self.splitter)
        self.status = ElidedLabel("")
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        root = QVBoxLayout(self)
        root.addLayout(bar)
        root.addWidget(self.stack, 1)
        root.addWidget(self.status)
        self.layer_box.currentIndexChanged.connect(lambda _i: self.redraw())
        self.colour_box.currentIndexChanged.connect(lambda _i: self.redraw())
        self.part_box.currentIndexChanged.connect(lambda _i: self.redraw())
        self.image.hoverEvent = self._hover
        self.image.mouseClickEvent = self._click

    # ---- public API

    def connect_requests(self, to: LensRequests) -> None:
        self.routing_requested.connect(to.request_routing)

    def set_model(self, model: ModelRecord) -> None:
        """A new model: its MoE layers in the picker, the old routing gone (a dense model says so)."""
        self.model = model
        self.layer_box.blockSignals(True)
        self.layer_box.clear()
        if model.n_expert:
            for i in range(model.n_layers):  # a hybrid's recurrent layers route their FFN like the attention ones
                self.layer_box.addItem(f"{i} (recurrent)" if model.is_recurrent(i) else f"{i}", i)
        self.layer_box.setToolTip("Every layer's feed-forward part routes, whatever mixes its tokens (a hybrid's "
                                  "recurrent layers too)" if model.hybrid else "")
        self.layer_box.blockSignals(False)
        self.clear_chat()

    def clear_chat(self) -> None:
        """Another chat or model: nothing of the old tokens stays."""
        self.record = None
        self.picked = None
        self.image.clear()
        self.marker.setVisible(False)
        self.detail.setHtml(PICK_TEXT)
        self.status.setText("")
        dense = self.model is not None and not self.model.n_expert
        self.empty.setText(NO_MODEL_TEXT if self.model is None else DENSE_TEXT if dense else EMPTY_TEXT)
        self.stack.setCurrentWidget(self.empty)

    def waiting(self, text: str) -> None:
        if self.record is None and self.model is not None and self.model.n_expert:
            self.empty.setText(text)
            self.stack.setCurrentWidget(self.empty)

    def wants_routing(self) -> bool:
        """Whether the loaded model has experts to show."""
        return self.model is not None and bool(self.model.n_expert)

    def set_routing(self, rec: RoutingRecord | None) -> None:
        """Draw a RoutingRecord (None: nothing routed yet)."""
        if rec is None or not rec.layers:
            if self.record is None:
                self.clear_chat()
            return
        self.record = rec
        self.stack.setCurrentWidget(self.splitter)
        self.tokens_axis.set_tokens(rec.token_texts)
        self.redraw()
        if self.picked is not None and self.picked[0] < rec.n_tokens:
            self.pick(*self.picked)

    def current(self) -> LayerRouting | None:
        if self.record is None:
            return None
        layer = self.layer_box.currentData()
        return self.record.layer(int(layer) if layer is not None else self.record.layers[0].layer)

    def matrix(self) -> np.ndarray:
        """What the map shows for the current layer: (n_expert, n_tokens)."""
        lr = self.current()
        if lr is None:
            return np.zeros((0, 0), np.float32)
        if self.colour_box.currentData() == "probs":
            return lr.probs.T.astype(np.float32)
        out = np.zeros((lr.n_expert, lr.experts.shape[0]), np.float32)
        cols = np.repeat(np.arange(lr.experts.shape[0]), lr.experts.shape[1])
        out[lr.experts.reshape(-1), cols] = lr.weights.reshape(-1)
        return out

    def span(self) -> tuple[int, int] | None:
        """The token positions [start, stop) the Tokens picker selects, or None (the whole chat, or a part the chat
        does not have)."""
        from engine.chat.reasoning import token_spans  # noqa: PLC0415 - plain Python, no Qt

        part = self.part_box.currentData()
        if not part or self.record is None:
            return None
        spans = [s for s in token_spans(list(self.record.token_texts)) if s.kind == part]
        return (spans[-1].start, spans[-1].stop) if spans else None

    def redraw(self) -> None:
        whole = self.current()
        if whole is None:
            return
        span = self.span()
        lr = whole if span is None else whole.part(*span)
        m = self.matrix()
        self.image.setImage(m, autoLevels=False, levels=(0.0, max(1e-6, float(m.max()))))
        self.image.setRect(0, 0, m.shape[1], m.shape[0])
        self.colorbar.setLevels((0.0, max(1e-6, float(m.max()))))
        self.colorbar.getAxis("left").setLabel(self.colour_box.currentText())
        load = lr.load()
        self.bars.setOpts(x0=np.zeros(lr.n_expert), y=np.arange(lr.n_expert) + 0.5, width=load, height=0.8)
        top = int(load.max()) if load.size else 0  # the narrow column has no room for a row of ticks: 0, and the
        self.load.getAxis("bottom").setTicks([[(0, "0")], []])  # busiest expert's count in the axis label
        self.load.setLabel("bottom", f"tokens, max {top}")
        ent = whole.entropy()
        self.entropy_curve.setData(np.arange(len(ent) + 1), ent)
        self.entropy.setYRange(0, np.log2(lr.n_expert))
        left = self.map.getAxis("left")
        left.setTicks([[(e + 0.5, str(e)) for e in range(lr.n_expert)]] if lr.n_expert <= MAX_EXPERT_TICKS else None)
        self.map.setLimits(xMin=0, xMax=max(1, m.shape[1]), yMin=0, yMax=lr.n_expert)
        x_range = (0, max(1, m.shape[1])) if span is None else span
        self.map.setRange(xRange=x_range, yRange=(0, lr.n_expert), padding=0)
        busiest = int(np.argmax(load))
        part = self.part_box.currentData()
        which = "" if not part else (f"tokens {span[0]}–{span[1] - 1} (the last {part}): " if span is not None
                                      else f"no {part} in this chat, the whole chat: ")
        ent = lr.entropy() if lr.experts.shape[0] else ent
        kind = ""
        if self.model is not None and self.model.hybrid:
            kind = " (recurrent; its FFN routes as in any layer)" if self.model.is_recurrent(lr.layer) else " (attention)"
        self.status.setText(f"{which}layer {lr.layer}{kind}: {lr.n_expert} experts, {lr.experts.shape[1]} per token, "
                            f"{int((load > 0).sum())} used by the chat; busiest expert {busiest} "
                            f"({int(load[busiest])} of {lr.experts.shape[0]} tokens); mean entropy "
                            f"{float(ent.mean()):.2f} of {np.log2(lr.n_expert):.2f} bits")

    def pick(self, token: int, expert: int) -> None:
        """Token's experts in every layer, and the tokens `expert` was chosen for in the current layer."""
        rec, lr = self.record, self.current()
        if rec is None or lr is None or not (0 <= token < rec.n_tokens) or not (0 <= expert < lr.n_expert):
            return
        self.picked = (token, expert)
        self.marker.setRect(token, expert, 1, 1)
        self.marker.setVisible(True)
        rows = []
        for other in rec.layers:
            chosen = ", ".join(f"<b>{e}</b> ({w:.2f})" if e == expert and other is lr else f"{e} ({w:.2f})"
                               for e, w in zip(other.experts[token].tolist(), other.weights[token].tolist()))
            rows.append(f"<tr><td>L{other.layer}</td><td>{chosen}</td><td>{other.entropy()[token]:.2f}</td></tr>")
        who = lr.positions_of(expert)
        words = " ".join(f"<span style='background:#e8eefc'>{token_html(rec.token_texts[p])}</span>" for p in who[:400])
        more = f" … and {len(who) - 400} more" if len(who) > 400 else ""
        self.detail.setHtml(
            f"<p><b>Token {token}</b> {html.escape(token_label(rec.token_texts[token], 24))}: its experts "
            f"(weight) in every layer</p><table cellspacing=4><tr><th>layer</th><th>experts</th><th>entropy</th></tr>"
            + "".join(rows) + f"</table><p><b>Expert {expert} of layer {lr.layer}</b>: chosen for {len(who)} of "
            f"{rec.n_tokens} tokens, {lr.weight_share()[expert] * 100:.1f}% of the layer's weight</p><p>{words}{more}</p>")

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        """On screen with nothing drawn for a model with experts: ask for the chat's routing."""
        super().showEvent(event)
        if self.record is None and self.wants_routing():
            self.routing_requested.emit()

    # ---- mouse

    def _cell(self, pos) -> tuple[int, int] | None:
        lr = self.current()
        if lr is None:
            return None
        t, e = int(np.floor(pos.x())), int(np.floor(pos.y()))
        return (t, e) if 0 <= t < lr.experts.shape[0] and 0 <= e < lr.n_expert else None

    def _hover(self, ev) -> None:
        if ev.isExit() or self.record is None:
            return
        cell = self._cell(ev.pos())
        lr = self.current()
        if cell is None or lr is None:
            return
        t, e = cell
        slots = lr.experts[t].tolist()
        rank = f"chosen #{slots.index(e) + 1}, weight {lr.weights[t, slots.index(e)]:.3f}" if e in slots else "not chosen"
        self.status.setText(f"token {t} {token_label(self.record.token_texts[t], 16)} · expert {e}: {rank}; "
                            f"router probability {float(lr.probs[t, e]):.3f}")

    def _click(self, ev) -> None:
        cell = self._cell(ev.pos())
        if cell is not None:
            ev.accept()
            self.pick(*cell)
