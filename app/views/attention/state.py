"""The State view of a hybrid (Qwen3.5): what a recurrent (gated DeltaNet) layer keeps instead of a KV cache.

Each recurrent layer keeps one S x S matrix per value head (and the last inputs of its short convolution): a
constant number of bytes whatever the conversation's length, where an attention layer's KV rows grow with every
token. The top plot draws both against the context length (the attention layers' KV rows, the recurrent states,
their sum, and where the conversation is now). Below, for the chosen recurrent layer, two heatmaps of tokens x
value heads: how strongly each token wrote into the state (beta in (0, 1)) and how much of the state it kept
(exp(g) in (0, 1]: the rest is forgotten before the token writes). Hover says both, with the head's half-life.
It draws a StateRecord (app.records.recurrent) and asks for one through `state_requested`.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from app.records.model import ModelRecord
from app.records.recurrent import StateRecord
from app.views.attention.controls import NoHfwLabel
from app.views.common.colours import colormap
from app.views.common.formatting import human_bytes
from app.views.common.tokens import TokenAxis, token_label

EMPTY_TEXT = "Send a message to see what the recurrent layers wrote into their state and kept of it."
NOT_HYBRID = "This model has no recurrent layers: every layer attends and keeps KV rows."
KV_COLOUR, STATE_COLOUR, TOTAL_COLOUR = (213, 94, 0), (0, 150, 136), (90, 90, 90)
MIB = float(1 << 20)


class StateView(QWidget):
    """Bytes against context length, then beta and exp(g) per token and value head of one recurrent layer."""

    state_requested = Signal()
    hovered = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.record: StateRecord | None = None
        self.asked = False
        self.summary = NoHfwLabel(EMPTY_TEXT)
        self.summary.setWordWrap(True)
        self.summary.setTextFormat(Qt.TextFormat.PlainText)
        self.summary.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.summary.setMinimumHeight(3 * self.summary.fontMetrics().lineSpacing() + 4)
        self.layer_box = QComboBox()
        self.layer_box.setToolTip("The recurrent layer whose writes and decays are drawn")
        self.layer_box.currentIndexChanged.connect(lambda _i: self._draw_maps())
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Recurrent layer"))
        bar.addWidget(self.layer_box)
        bar.addStretch(1)
        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setBackground("w")
        self.memory = self.plots.addPlot(row=0, col=0)
        self.memory.setMenuEnabled(False)
        self.memory.hideButtons()
        self.memory.setMouseEnabled(False, False)
        self.memory.setLabel("bottom", "tokens in the context")
        self.memory.getAxis("left").enableAutoSIPrefix(False)  # the unit is in the label: KiB or MiB
        self.memory.showGrid(x=True, y=True, alpha=0.2)
        self.kv_curve = self.memory.plot(pen=pg.mkPen(KV_COLOUR, width=2))
        self.state_curve = self.memory.plot(pen=pg.mkPen(STATE_COLOUR, width=2))
        self.total_curve = self.memory.plot(pen=pg.mkPen(TOTAL_COLOUR, width=1, style=Qt.PenStyle.DashLine))
        self.now_line = pg.InfiniteLine(angle=90, pen=pg.mkPen((60, 60, 60), width=1, style=Qt.PenStyle.DashLine),
                                        label="now", labelOpts={"position": 0.9, "color": "#333"})
        self.memory.addItem(self.now_line)
        self.key = QLabel(" &nbsp; ".join(
            f"<span style='color:rgb{c}'>{line}</span> {text}" for c, line, text in (
                (KV_COLOUR, "━━", "KV rows of the attention layers (grow per token)"),
                (STATE_COLOUR, "━━", "recurrent states (constant)"),
                (TOTAL_COLOUR, "╌╌", "together"))))
        self.key.setWordWrap(True)
        self.key.setStyleSheet("font-size: 8pt;")
        self.axes: list[TokenAxis] = []
        self.maps: list[pg.PlotItem] = []
        self.images: list[pg.ImageItem] = []
        self.bars: list[pg.ColorBarItem] = []
        for row, (title, cmap) in enumerate((("wrote: β (how strongly the token wrote)", "viridis"),
                                              ("kept: exp(g) (the share of the state kept)", "cividis"))):
            axis = TokenAxis("bottom")
            plot = self.plots.addPlot(row=row + 1, col=0, axisItems={"bottom": axis})
            plot.setTitle(title, size="9pt", color="#333")
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.invertY(True)
            plot.setLabel("left", "value head")
            plot.getAxis("left").setWidth(52)
            image = pg.ImageItem(axisOrder="row-major")
            plot.addItem(image)
            cbar = pg.ColorBarItem(values=(0, 1), colorMap=colormap(cmap), interactive=False, width=10)
            cbar.setImageItem(image)
            self.plots.addItem(cbar, row=row + 1, col=1)
            image.hoverEvent = lambda ev, which=row: self._hover(ev, which)
            if self.maps:
                plot.setXLink(self.maps[0])
                plot.setYLink(self.maps[0])
            self.axes.append(axis)
            self.maps.append(plot)
            self.images.append(image)
            self.bars.append(cbar)
        self.memory.getAxis("left").setWidth(52)  # the plots' left edges line up
        layout = self.plots.ci.layout
        layout.setRowStretchFactor(0, 2)
        layout.setRowStretchFactor(1, 3)
        layout.setRowStretchFactor(2, 3)
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addLayout(bar)
        root.addWidget(self.summary)
        root.addWidget(self.key)
        root.addWidget(self.plots, 1)

    # ---- public API

    def set_model(self, model: ModelRecord) -> None:
        """A new model: the recurrent layers in the picker, the memory plot from the model's numbers."""
        self.model = model
        self.layer_box.blockSignals(True)
        self.layer_box.clear()
        for i in model.recurrent:
            self.layer_box.addItem(f"{i}", i)
        self.layer_box.blockSignals(False)
        self.clear()

    def clear(self, message: str = "") -> None:
        """Forget the record (another chat or model)."""
        self.record = None
        self.asked = False
        for image in self.images:
            image.clear()
        for axis in self.axes:
            axis.set_tokens(())
        model = self.model
        if model is not None and not model.hybrid:
            self.summary.setText(NOT_HYBRID)
            return
        self._draw_memory(0)
        self.summary.setText(message or (self._sizes_text() + " " + EMPTY_TEXT))

    def stale(self, n_tokens: int) -> bool:
        """Whether the record shown is not of a context of n_tokens (and none was asked for since)."""
        if self.model is None or not self.model.hybrid or n_tokens <= 0 or self.asked:
            return False
        return self.record is None or self.record.n_tokens != n_tokens

    def request(self) -> None:
        self.asked = True
        self.state_requested.emit()

    def set_record(self, rec: StateRecord) -> None:
        """Draw a StateRecord (the chosen layer stays when the new record has it)."""
        self.record = rec
        self.asked = False
        keep = self.layer_box.currentData()
        self.layer_box.blockSignals(True)
        self.layer_box.clear()
        for i in rec.layers:
            self.layer_box.addItem(f"{i}", i)
        self.layer_box.setCurrentIndex(max(0, self.layer_box.findData(keep)))
        self.layer_box.blockSignals(False)
        self._draw_memory(rec.n_tokens)
        self.summary.setText(self._sizes_text())
        self._draw_maps()

    def layer_index(self) -> int:
        """Index of the chosen layer in the record's layers."""
        rec = self.record
        if rec is None:
            return 0
        layer = self.layer_box.currentData()
        return rec.layers.index(layer) if layer in rec.layers else 0

    # ---- drawing

    def _numbers(self) -> tuple[int, int, int, int, int]:
        """(recurrent layers, attention layers, one state's bytes, KV bytes per token, context) from the record or the
        model."""
        rec, model = self.record, self.model
        if rec is not None:
            return len(rec.layers), len(rec.attention_layers), rec.state_bytes, rec.kv_per_token, rec.n_ctx
        if model is None:
            return 0, 0, 0, 0, 0
        from_kv = 2 * model.n_kv_heads * model.head_dim * 2  # F16 rows until the first record says the cache's type
        return len(model.recurrent), len(model.attention_layers), model.state_bytes, \
            from_kv * len(model.attention_layers), model.n_ctx

    def _sizes_text(self) -> str:
        n_rec, n_att, each, per_token, n_ctx = self._numbers()
        rec = self.record
        parts = [f"Recurrent state: {_layers(n_rec, 'layer')} × {human_bytes(each)} = {human_bytes(n_rec * each)}, "
                 "the same at any context length"]
        if rec is not None:
            s = rec.state_size
            parts[0] += (f" (per layer: {rec.n_heads} value heads × {s}×{s} float32 = {human_bytes(rec.matrix_bytes)}, "
                         f"and the convolution's last inputs {human_bytes(rec.conv_bytes)})")
            parts.append(f"KV rows of the {_layers(n_att, 'attention layer')}: {human_bytes(rec.kv_bytes)} for "
                         f"{rec.n_tokens:,} tokens ({rec.cache_type}), {human_bytes(rec.kv_at(n_ctx))} at {n_ctx:,}")
            if rec.kv_per_token:  # where the growing rows pass the constant states
                at = -(-rec.state_total // rec.kv_per_token)
                parts.append(f"They outgrow the recurrent states at {at:,} tokens")
        else:
            parts.append(f"KV rows of the {_layers(n_att, 'attention layer')} grow by {human_bytes(per_token)} per token")
        return ". ".join(parts) + "."

    def _draw_memory(self, n_tokens: int) -> None:
        n_rec, _n_att, each, per_token, n_ctx = self._numbers()
        x = np.array([0.0, float(max(1, n_ctx))])
        top = x[-1] * per_token + n_rec * each
        unit, scale = ("MiB", MIB) if top >= MIB else ("KiB", 1024.0)
        self.memory.setLabel("left", unit)
        kv = x * per_token / scale
        state = np.full(2, n_rec * each / scale)
        self.kv_curve.setData(x, kv)
        self.state_curve.setData(x, state)
        self.total_curve.setData(x, kv + state)
        self.now_line.setValue(float(n_tokens))
        self.now_line.setVisible(n_tokens > 0)
        self.memory.setXRange(0, x[-1], padding=0.02)
        self.memory.setYRange(0, float(max(kv[-1] + state[-1], 1e-3)), padding=0.05)

    def _draw_maps(self) -> None:
        rec = self.record
        if rec is None or rec.n_tokens == 0:
            return
        li = self.layer_index()
        n, h = rec.n_tokens, rec.n_heads
        rect = QRectF(0, 0, n, h)
        kept = rec.kept[li]
        low = float(np.min(kept)) if kept.size else 0.0
        low = min(low, 0.999)
        for image, cbar, data, levels in ((self.images[0], self.bars[0], rec.wrote[li], (0.0, 1.0)),
                                          (self.images[1], self.bars[1], kept, (low, 1.0))):
            image.setImage(data.T.astype(np.float32), autoLevels=False, levels=levels, rect=rect)
            cbar.setLevels(levels)
        for axis in self.axes:
            axis.set_tokens(rec.token_texts)
        for plot in self.maps:
            plot.getAxis("left").setTicks([[(k + 0.5, f"v{k}") for k in range(h)]] if h <= 16 else None)
        self.maps[0].setRange(rect, padding=0.0)

    # ---- interaction

    def describe(self, token: int, head: int) -> str:
        """What token `token` did to value head `head`'s state in the chosen layer."""
        rec = self.record
        assert rec is not None
        li = self.layer_index()
        beta, kept = float(rec.wrote[li, token, head]), float(rec.kept[li, token, head])
        life = float(rec.half_life(li)[head])
        life_text = "forgets nothing" if not np.isfinite(life) else f"half-life {life:.3g} tokens"
        return (f"layer {rec.layers[li]}, v{head}, token {token} “{token_label(rec.token(token), 12)}”: "
                f"wrote β = {beta:.3f}, kept exp(g) = {kept:.4f} · {life_text}")

    def _hover(self, ev, _which: int) -> None:
        rec = self.record
        if ev.isExit() or rec is None:
            return
        pos = ev.pos()
        token, head = int(np.floor(pos.x())), int(np.floor(pos.y()))
        if 0 <= token < rec.n_tokens and 0 <= head < rec.n_heads:
            self.hovered.emit(self.describe(token, head))


def _layers(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
