"""The Attention overview's controls: layer, head, row window, pooling, sinks, colours; and its empty state."""
from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QCheckBox, QComboBox, QLabel, QLayout, QLayoutItem, QPushButton, QSpinBox, QWidget

from app.records.attention import HeadRecord
from app.records.logit_lens import layer_runs
from app.records.model import ModelRecord
from app.views.common.colours import COLORMAPS

ROW_WINDOWS = (("auto", 0), ("64 rows", 64), ("256 rows", 256), ("1024 rows", 1024), ("all rows", -1),
               ("last reasoning", "reasoning"), ("last answer", "answer"))  # a reasoning model's reply, by part
EMPTY_TEXT = "Send a message to see attention."


class OverviewBar(QWidget):
    """Two rows of controls, so the lens fits beside the chat without scrolling sideways."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.layer_box, self.head_box = QComboBox(), QComboBox()
        for box in (self.layer_box, self.head_box):
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.rows_box = QComboBox()
        for label, size in ROW_WINDOWS:
            self.rows_box.addItem(label, size)
        self.rows_box.setToolTip("Query rows to show: the newest ones, all, or the last reply's reasoning or answer "
                                 "(reasoning models: <think> blocks, Gemma 4's thought channel, gpt-oss's analysis "
                                 "channel)")
        self.end_spin = QSpinBox()
        self.end_spin.setPrefix("to row ")
        self.end_spin.setRange(0, 0)
        self.end_spin.setToolTip("Last query row of the window: follows the newest token unless you set it")
        self.pool_box = QComboBox()
        self.pool_box.addItem("max-pool", "max")
        self.pool_box.addItem("mean-pool", "mean")
        self.norm_check = QCheckBox("scale each head")
        self.norm_check.setChecked(True)
        self.sink_check = QCheckBox("hide sinks")
        self.sink_check.setToolTip("Hide the attention-sink keys: key 0 (BOS), and every sink ticked in Head roles")
        self.cmap_box = QComboBox()
        self.cmap_box.addItems(COLORMAPS)
        self.follow_check = QCheckBox("follow live")
        self.follow_check.setChecked(True)
        self.exact_button = QPushButton("Exact grid")
        self.exact_button.setToolTip("Recompute the grid from every query row (live updates sample rows)")
        self.export_button = QPushButton("Export PNG…")
        flow = FlowLayout(self)
        for w in (QLabel("Layer"), self.layer_box, QLabel("Head"), self.head_box, self.rows_box, self.end_spin,
                  self.pool_box, self.norm_check, self.sink_check, QLabel("Colours"), self.cmap_box, self.follow_check,
                  self.exact_button, self.export_button):
            flow.addWidget(w)

    def set_model(self, model: ModelRecord) -> None:
        """Fill the layer and head pickers for a new model (a hybrid's recurrent layers say so)."""
        self.model = model
        self.layer_box.clear()
        for layer in model.layers:
            tag = f"  (local, window {layer.window})" if layer.window else ""
            if layer.recurrent:
                tag = "  (recurrent)"
            self.layer_box.addItem(f"{layer.index}{tag}", layer.index)
        which = "attention layers" if model.hybrid else "layers"
        self.layer_box.addItem(f"mean of {which}", "mean")
        self.layer_box.addItem(f"max of {which}", "max")
        if model.hybrid:
            tip = ("Recurrent layers (gated DeltaNet) show what each value head reads; 'mean/max of attention layers' "
                   "aggregate the softmax layers only (a read share and an attention weight are not the same quantity)")
            self.layer_box.setToolTip(tip)
        self.set_heads(model.layers[0].index if model.layers else 0)
        self.end_spin.setRange(0, 0)

    def set_heads(self, layer: object) -> None:
        """The head picker for `layer`: a recurrent layer's value heads (and the key head each reads), an attention
        layer's query heads (and their KV head); the pick stays when the new layer has it."""
        model = getattr(self, "model", None)
        if model is None:
            return
        current = self.head_box.currentData()
        recurrent = model.is_recurrent(layer)
        self.head_box.blockSignals(True)
        self.head_box.clear()
        if recurrent:
            for h in range(model.n_v_heads):
                key = f" · key {h % model.n_k_heads}" if model.n_k_heads and model.n_k_heads < model.n_v_heads else ""
                self.head_box.addItem(f"v{h}{key}", h)
        else:
            for h in range(model.n_heads):
                self.head_box.addItem(f"h{h} · KV {model.kv_head(h)}" if model.group > 1 else f"h{h}", h)
        self.head_box.addItem("mean of heads", "mean")
        self.head_box.addItem("max of heads", "max")
        i = self.head_box.findData(current) if current is not None else -1
        self.head_box.setCurrentIndex(max(0, i))
        self.head_box.blockSignals(False)


class NoHfwLabel(QLabel):
    """A word-wrapped label without height-for-width (a scroll area would turn it into a tall minimum height)."""

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return False


def empty_state(text: str = EMPTY_TEXT) -> QLabel:
    """What the overview shows before there is any attention to draw."""
    label = NoHfwLabel(text)
    label.setAlignment(Qt.AlignmentFlag.AlignCenter)
    label.setWordWrap(True)
    label.setStyleSheet("color:#666; font-size:13pt")
    return label


class ElidedLabel(QLabel):
    """One line of plain text cut with … at the right when the label is narrower (its tooltip holds all of it)."""

    def setText(self, text: str) -> None:  # noqa: N802 - Qt override
        super().setText(text)
        self.setToolTip(text)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(0, super().minimumSizeHint().height())

    def paintEvent(self, _event: object) -> None:  # noqa: N802 - Qt override
        painter = QPainter(self)
        text = self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight, self.contentsRect().width())
        painter.drawText(self.contentsRect(), int(self.alignment() | Qt.AlignmentFlag.AlignVCenter), text)


class FlowLayout(QLayout):
    """Widgets left to right, wrapping onto the next line when the pane is narrow (Qt's flow layout example)."""

    def __init__(self, parent: QWidget | None = None, spacing: int = 6):
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._height = 0
        self.setContentsMargins(0, 0, 0, 0)
        self.setSpacing(spacing)

    def addItem(self, item: QLayoutItem) -> None:  # noqa: N802 - Qt override
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, i: int) -> QLayoutItem | None:  # noqa: N802 - Qt override
        return self._items[i] if 0 <= i < len(self._items) else None

    def takeAt(self, i: int) -> QLayoutItem | None:  # noqa: N802 - Qt override
        return self._items.pop(i) if 0 <= i < len(self._items) else None

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 - Qt override
        """Place the widgets; a change in the lines they need becomes the height asked for (no height-for-width,
        which would make every layout above ask for its children's preferred heights and scroll)."""
        super().setGeometry(rect)
        height = self._place(rect, move=True)
        if height != self._height:
            self._height = height
            self.invalidate()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return self.minimumSize()

    def minimumSize(self) -> QSize:  # noqa: N802 - Qt override
        """As wide as the widest widget (everything else wraps), as tall as the lines at the last width."""
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        return QSize(size.width(), max(size.height(), self._height))

    def _place(self, rect: QRect, move: bool) -> int:
        x, y, line = rect.x(), rect.y(), 0
        gap = self.spacing()
        for item in self._items:
            hint = item.sizeHint()
            if x + hint.width() > rect.right() + 1 and line > 0:
                x, y, line = rect.x(), y + line + gap, 0
            if move:
                item.setGeometry(QRect(QPoint(x, y), hint))
            x += hint.width() + gap
            line = max(line, hint.height())
        return y + line - rect.y()


def describe_selection(rec: HeadRecord, model: ModelRecord | None) -> str:
    """'layer 3, head 4 (KV 1, shared with h3–h5), sliding window 512' for the info line and titles; a recurrent
    layer's 'layer 0 (recurrent), value head 2 (key head 0)'."""
    if rec.recurrent:
        head = f"value head {rec.head}" if isinstance(rec.head, int) else f"{rec.head} of value heads"
        if isinstance(rec.head, int) and rec.kv_head is not None and rec.n_key_heads and len(rec.group_heads) > 1:
            head += f", key head {rec.kv_head}"
        return f"layer {rec.layer} (recurrent), {head}"
    hybrid = model is not None and model.hybrid
    layer = (f"layer {rec.layer}" if isinstance(rec.layer, int)
             else f"{rec.layer} of {'attention ' if hybrid else ''}layers")
    if isinstance(rec.head, int):
        head = f"head {rec.head}"
        if rec.kv_head is not None and len(rec.group_heads) > 1:
            head += f" (KV {rec.kv_head}, shared with h{rec.group_heads[0]}–h{rec.group_heads[-1]})"
    else:
        head = f"{rec.head} of heads"
    window = f", sliding window {rec.window}" if rec.window else ""
    sink = f", {rec.sink_share:.0%} to the learned sink (nothing)" if rec.sink_share is not None else ""
    return f"{layer}, {head}{window}{sink}"


def part_rows(texts: list[str], part: str) -> tuple[slice | None, str]:
    """The query rows of the last reply's `part` ('reasoning' or 'answer') in a chat's token texts, and '' ; or
    (None: all rows, a note for the info line) when the chat has no such part."""
    from engine.chat.reasoning import token_spans  # noqa: PLC0415 - plain Python, no Qt

    spans = [s for s in token_spans(texts) if s.kind == part]
    if not spans:
        return None, f"no {part} in this chat (a reasoning model's reply has one): all rows"
    return slice(spans[-1].start, spans[-1].stop), ""


def model_line(model: ModelRecord) -> str:
    """'name: 24 layers × 16 heads, 2 KV heads (groups of 8)'; a hybrid's recurrent and attention layers apart."""
    gqa = f", {model.n_kv_heads} KV heads (groups of {model.group})" if model.group > 1 else ""
    if model.encoder_decoder:  # two stacks: the grid shows the encoder's or the decoder's layers, by kind
        return (f"{model.name}: encoder {model.n_layers} layers, decoder {model.n_dec_layers or model.n_layers} layers, "
                f"{model.n_heads} heads each{gqa}")
    if not model.hybrid:
        return f"{model.name}: {model.n_layers} layers × {model.n_heads} heads{gqa}"
    return (f"{model.name}: {model.n_layers} layers: recurrent (gated DeltaNet) {layer_runs(model.recurrent)}, "
            f"{model.n_v_heads} value heads each; attention {layer_runs(model.attention_layers)}, "
            f"{model.n_heads} heads{gqa}")
