"""The Attention lens of an encoder-decoder model (T5): its three kinds of attention, as the original Transformer
drew them.

- Encoder self-attention: input x input, bidirectional (every input token sees every other);
- Decoder self-attention: output x output, causal;
- Cross-attention: output x input, the decoder's queries over the encoder's keys and values: what each output token
  read of the input.

A mosaic of every layer and head of the chosen kind (click one), that map with its tokens on both axes, the input
tinted by what the chosen output token reads (click an output token), and, for cross-attention, one cell step by step
(q from the decoder, K and V from the encoder, their shapes). Records come from app.records.seq2seq; the view asks
through `maps_requested` and `step_requested`.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QPushButton, QScrollArea, QSizePolicy, QSpinBox,
                               QSplitter, QStackedWidget, QWidget)

from app.records.model import ModelRecord
from app.records.seq2seq import KIND_TITLES, CrossStepRecord, Seq2SeqRecord
from app.views.attention.seq2seq_parts import InputTint, MapView, Mosaic, step_html
from app.views.common.flow import FillLayout
from app.views.common.tokens import token_label

EMPTY = ("An encoder-decoder model: type an input in the chat and send it. The encoder reads it, the decoder writes the "
         "output; here you will see the encoder's self-attention, the decoder's, and the cross-attention between them.")
SHAPES = {"encoder": "input × input, bidirectional", "decoder": "output × output, causal",
          "cross": "output × input: queries from the decoder, keys and values from the encoder"}


class Seq2SeqView(QWidget):
    """Kind, layer and head pickers over the mosaic, the map, the tinted input and the cross-attention step."""

    maps_requested = Signal()
    step_requested = Signal(int, int, int)  # decoder layer, head, output position
    hovered = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.record: Seq2SeqRecord | None = None
        self.step: CrossStepRecord | None = None
        self.cmap = "viridis"
        self.output = 0  # the output token whose cross-attention tints the input
        self.kind = QComboBox()
        for key, title in KIND_TITLES.items():
            self.kind.addItem(title, key)
        self.kind.setCurrentIndex(2)  # cross-attention: what only an encoder-decoder has
        self.layer, self.head = QSpinBox(), QSpinBox()
        self.layer.setPrefix("layer ")
        self.head.setPrefix("head ")
        self.step_button = QPushButton("Step through")
        self.step_button.setToolTip("The chosen output token's cross-attention in this layer and head, step by step")
        self.shape_label = QLabel("")
        self.mosaic = Mosaic()
        self.map = MapView()
        self.tint = InputTint()
        self.step_text = QLabel("")
        self.step_text.setTextFormat(Qt.TextFormat.RichText)
        self.step_text.setWordWrap(True)
        self.step_text.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.step_text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.step_scroll = QScrollArea()  # the step's lines and table are taller than a short pane
        self.step_scroll.setWidget(self.step_text)
        self.step_scroll.setWidgetResizable(True)
        self.lower = QStackedWidget()
        self.lower.addWidget(self.tint)
        self.lower.addWidget(self.step_scroll)
        self.empty = QLabel(EMPTY)
        self.empty.setWordWrap(True)
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._layout()
        self.kind.currentIndexChanged.connect(lambda _i: self._kind_changed())
        self.layer.valueChanged.connect(lambda _v: self._redraw())
        self.head.valueChanged.connect(lambda _v: self._redraw())
        self.mosaic.picked.connect(self._picked)
        self.mosaic.hovered.connect(self.hovered)
        self.map.hovered.connect(self.hovered)
        self.map.cell_clicked.connect(lambda q, _k: self.choose_output(q) if self._kind() != "encoder" else None)
        self.tint.output_clicked.connect(self.choose_output)
        self.step_button.clicked.connect(self._ask_step)

    def _layout(self) -> None:
        bar = QHBoxLayout()
        for w in (self.kind, self.layer, self.head, self.step_button):
            bar.addWidget(w)
        bar.addStretch(1)
        self.shape_label.setWordWrap(True)
        self.shape_label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.map)
        right.addWidget(self.lower)
        right.setSizes([600, 260])
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.mosaic)
        split.addWidget(right)
        split.setSizes([300, 600])
        for w in (self.mosaic, self.map, self.tint):  # the lens is ~590 px wide at 1280x800: nothing may widen it
            w.setMinimumWidth(120)
        split.setChildrenCollapsible(False)
        self.body = QStackedWidget()
        self.body.addWidget(self.empty)
        self.body.addWidget(split)
        root = FillLayout(self)  # the wrapped shape line must not make the lens taller than its pane (it would scroll)
        root.setContentsMargins(0, 0, 0, 0)
        root.addLayout(bar)
        root.addWidget(self.shape_label)
        root.addWidget(self.body, 1)

    def showEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt override
        """Shown with nothing drawn (a new model, another chat): ask for the last input and output's maps."""
        super().showEvent(event)
        if self.record is None:
            self.maps_requested.emit()

    # ---- public API

    def set_model(self, model: ModelRecord) -> None:
        self.n_enc, self.n_dec = model.n_layers, max(1, model.n_dec_layers or model.n_layers)
        self.head.setRange(0, max(0, model.n_heads - 1))
        self.clear()
        self._kind_changed()

    def clear(self) -> None:
        self.record = self.step = None
        self.body.setCurrentWidget(self.empty)
        self.lower.setCurrentWidget(self.tint)
        self.tint.clear()
        self.step_text.clear()

    def set_record(self, rec: Seq2SeqRecord | None) -> None:
        if rec is None:
            self.clear()
            return
        self.record = rec
        self.output = len(rec.output_texts) - 1
        self.body.setCurrentIndex(1)
        self.lower.setCurrentWidget(self.tint)
        self._redraw()

    def set_step(self, rec: CrossStepRecord) -> None:
        self.step = rec
        self.step_text.setText(step_html(rec))
        self.lower.setCurrentWidget(self.step_scroll)

    def set_colormap(self, name: str) -> None:
        self.cmap = name
        self._redraw()

    def choose_output(self, index: int) -> None:
        """Tint the input by output token `index`'s cross-attention (the layer and head shown)."""
        if self.record is not None and 0 <= index < len(self.record.output_texts):
            self.output = index
            self.lower.setCurrentWidget(self.tint)
            self._draw_tint()

    # ---- drawing

    def _kind(self) -> str:
        return str(self.kind.currentData())

    def _kind_changed(self) -> None:
        kind = self._kind()
        self.layer.setRange(0, max(0, (self.n_enc if kind == "encoder" else self.n_dec) - 1))
        self.step_button.setEnabled(kind == "cross")
        self._redraw()

    def _picked(self, layer: int, head: int) -> None:
        self.layer.setValue(layer)
        self.head.setValue(head)

    def _redraw(self) -> None:
        kind, rec = self._kind(), self.record
        maps = rec.maps(kind) if rec is not None else None
        shape = ""
        if maps is not None:
            n_l, n_h, q, k = maps.shape
            stack = "encoder" if kind == "encoder" else "decoder"
            shape = f" ({q} × {k}); the grid: {n_l} {stack} layers × {n_h} heads"
        self.shape_label.setText(f"{KIND_TITLES[kind]}: {SHAPES[kind]}{shape}")
        if rec is None or maps is None:
            return
        layer, head = min(self.layer.value(), maps.shape[0] - 1), min(self.head.value(), maps.shape[1] - 1)
        self.mosaic.set_maps(maps, KIND_TITLES[kind], self.cmap)
        self.mosaic.select(layer, head)
        q_texts, k_texts = rec.axes(kind)
        names = {"encoder": ("input token (query)", "input token (key)"),
                 "decoder": ("output token (query)", "output token (key)"),
                 "cross": ("output token (query, decoder)", "input token (key, encoder)")}[kind]
        self.map.set_map(maps[layer, head], q_texts, k_texts, *names, causal=kind == "decoder", cmap=self.cmap)
        self._draw_tint()

    def _draw_tint(self) -> None:
        rec = self.record
        if rec is None:
            return
        layer = min(self.layer.value(), rec.cross.shape[0] - 1)
        head = min(self.head.value(), rec.cross.shape[1] - 1)
        o = min(self.output, len(rec.output_texts) - 1)
        what = (f"output token {o} “{token_label(rec.output_texts[o], 16)}”'s cross-attention, decoder layer {layer} "
                f"head {head}")
        self.tint.show_row(rec.input_texts, rec.output_texts, o, np.asarray(rec.cross[layer, head, o]), what, self.cmap)

    def _ask_step(self) -> None:
        if self.record is not None:
            self.step_requested.emit(min(self.layer.value(), self.n_dec - 1), self.head.value(), self.output)
