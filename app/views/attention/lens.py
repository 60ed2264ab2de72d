"""The Attention lens: a layers x heads grid, one head large with token labels, and the context tinted by attention.

The lens only draws records; heavy work happens on a worker. It asks for what it needs through signals:
`head_requested(layer, head, rows)` (layer: int | 'mean' | 'max', head: int | 'mean' | 'max', rows: slice
| None) is answered with `set_head(HeadRecord)`; `attention_requested(max_rows)` (None = every query
row, exact) is answered with `set_attention(AttentionRecord)`.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QSizePolicy,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)
from superqt.utils import qthrottled

from app.records.attention import AttentionRecord, HeadRecord
from app.records.model import ModelRecord
from app.views.attention.grid import GridView
from app.views.attention.head import HeadView
from app.views.attention.steps import StepThroughView
from app.views.attention.text import TokenTextView
from app.views.common.colours import COLORMAPS

AUTO_ALL_ROWS = 512  # up to this many tokens the head view shows every query row
ROW_WINDOWS = (("auto", 0), ("64 rows", 64), ("256 rows", 256), ("1024 rows", 1024), ("all rows", -1))
LIVE_GRID_MS = 150
LIVE_HEAD_MS = 500


class AttentionLens(QWidget):
    """BertViz-style model view and head view over records made by app.records."""

    head_requested = Signal(object, object, object)  # layer, head, rows
    attention_requested = Signal(object)  # max_rows (None = all rows, exact)
    step_requested = Signal(int, int, int)  # layer, head, query token: answered with set_step(StepRecord)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.attention: AttentionRecord | None = None
        self.head: HeadRecord | None = None
        self._pending_index: int | None = None
        self._lens_pick: tuple[object, object] | None = None  # the layer/head last handed to the step-through view
        self._build()
        self._live_grid = qthrottled(self._redraw_grid, timeout=LIVE_GRID_MS)
        self._live_head = qthrottled(self.request_head, timeout=LIVE_HEAD_MS)

    # ---- layout

    def _build(self) -> None:
        self.layer_box, self.head_box = QComboBox(), QComboBox()
        self.rows_box = QComboBox()
        for label, size in ROW_WINDOWS:
            self.rows_box.addItem(label, size)
        self.end_spin = QSpinBox()
        self.end_spin.setPrefix("to row ")
        self.end_spin.setToolTip("Last query row of the window (long contexts are shown a window at a time)")
        self.pool_box = QComboBox()
        self.pool_box.addItem("max-pool", "max")
        self.pool_box.addItem("mean-pool", "mean")
        self.norm_check = QCheckBox("scale each head")
        self.norm_check.setChecked(True)
        self.sink_check = QCheckBox("hide BOS / sink")
        self.cmap_box = QComboBox()
        self.cmap_box.addItems(COLORMAPS)
        self.follow_check = QCheckBox("follow live")
        self.follow_check.setChecked(True)
        self.exact_button = QPushButton("Exact grid")
        self.exact_button.setToolTip("Recompute the grid from every query row (live updates sample rows)")
        self.export_button = QPushButton("Export PNG…")
        self.bar = QWidget()  # the overview's controls: hidden while the step-through view (with its own) is shown
        rows = QVBoxLayout(self.bar)
        rows.setContentsMargins(0, 0, 0, 0)
        rows.setSpacing(2)
        # two rows, so the lens fits beside the chat without scrolling sideways
        for group in ((QLabel("Layer"), self.layer_box, QLabel("Head"), self.head_box, self.rows_box, self.end_spin,
                       self.pool_box),
                      (self.norm_check, self.sink_check, QLabel("Colours"), self.cmap_box, self.follow_check,
                       self.exact_button, self.export_button)):
            bar = QHBoxLayout()
            for w in group:
                bar.addWidget(w)
            bar.addStretch(1)
            rows.addLayout(bar)
        self.grid = GridView()
        self.head_view = HeadView()
        self.text_view = TokenTextView()
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.head_view)
        right.addWidget(self.text_view)
        right.setSizes([700, 250])
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.grid)
        self.splitter.addWidget(right)
        self.splitter.setSizes([440, 560])  # the grid needs room for its head labels beside the chat
        self.status = QLabel("Run a prompt to see attention.")
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # model names and tokens come from the file
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.info = QLabel("")
        self.info.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.path_label = QLabel("")
        self.path_label.setToolTip("Which attention path the last prefill took: plain (the full score matrix) or "
                                   "tiled (online softmax over key tiles, for long prompts)")
        foot = QHBoxLayout()
        foot.addWidget(self.status, 1)
        foot.addWidget(self.info)
        foot.addWidget(self.path_label)
        # hover text must never widen the lens
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.steps = StepThroughView()
        self.views = QTabWidget()
        self.views.addTab(self.splitter, "Overview")
        self.views.addTab(self.steps, "Step through")
        root = QVBoxLayout(self)
        root.addWidget(self.bar)
        root.addWidget(self.views, 1)
        root.addLayout(foot)
        self.steps.step_requested.connect(self.step_requested)
        self.steps.hovered.connect(self.status.setText)
        self.views.currentChanged.connect(lambda _i: self._views_changed())
        self.grid.head_clicked.connect(self._grid_clicked)
        self.grid.hovered.connect(self.status.setText)
        self.head_view.hovered.connect(self.status.setText)
        self.head_view.cell_clicked.connect(lambda q, k: self.show_token_attention(q))
        self.text_view.token_clicked.connect(self.show_token_attention)
        self.layer_box.activated.connect(lambda _: self.request_head())
        self.head_box.activated.connect(lambda _: self.request_head())
        self.rows_box.activated.connect(lambda _: self.request_head())
        self.end_spin.editingFinished.connect(self.request_head)
        self.pool_box.currentIndexChanged.connect(self._grid_settings)
        self.norm_check.toggled.connect(self._grid_settings)
        self.sink_check.toggled.connect(self._sink_toggled)
        self.cmap_box.currentTextChanged.connect(self.set_colormap)
        self.exact_button.clicked.connect(lambda: self.attention_requested.emit(None))
        self.export_button.clicked.connect(self._export_dialog)

    # ---- public API

    def set_model(self, model: ModelRecord) -> None:
        """A new model: rebuild the layer and head pickers; forget old records."""
        self.model = model
        self.attention = self.head = None
        self.layer_box.clear()
        for layer in model.layers:
            tag = f"  (local, window {layer.window})" if layer.window else ""
            self.layer_box.addItem(f"{layer.index}{tag}", layer.index)
        self.layer_box.addItem("mean of layers", "mean")
        self.layer_box.addItem("max of layers", "max")
        self.head_box.clear()
        for h in range(model.n_heads):
            self.head_box.addItem(f"h{h} · KV {model.kv_head(h)}" if model.group > 1 else f"h{h}", h)
        self.head_box.addItem("mean of heads", "mean")
        self.head_box.addItem("max of heads", "max")
        self.grid.set_model(model)
        self.grid.record = None
        self.grid.redraw()
        self.steps.set_model(model)
        self._lens_pick = None
        self.status.setText(f"{model.name}: {model.n_layers} layers × {model.n_heads} heads"
                            + (f", {model.n_kv_heads} KV heads (groups of {model.group})" if model.group > 1 else ""))

    def set_attention(self, rec: AttentionRecord) -> None:
        """A new grid record; redrawn at most every 150 ms while streaming."""
        grew = self.attention is None or rec.n_tokens != self.attention.n_tokens
        at_end = self.end_spin.value() >= self.end_spin.maximum()
        first = self.attention is None and self.head is None
        self.attention = rec
        self.end_spin.setMaximum(max(0, rec.n_tokens - 1))
        if at_end or first:
            self.end_spin.setValue(max(0, rec.n_tokens - 1))
        self._live_grid()
        self.steps.set_tokens(rec.token_texts)
        self._refresh_steps()
        if first and rec.n_tokens:
            self.request_head()
        elif grew and self.follow_check.isChecked() and self.head is not None:
            self._live_head()

    def set_head(self, rec: HeadRecord) -> None:
        """Draw one head's (or an aggregate's) attention for its window of query rows."""
        self.head = rec
        self.head_view.set_record(rec)
        what = _describe_selection(rec, self.model)
        rows = f"query rows {rec.row_start}–{rec.row_stop - 1} of {rec.n_tokens}"
        pooled = f", pooled ×{rec.row_step}×{rec.col_step}" if rec.row_step > 1 or rec.col_step > 1 else ""
        self.info.setText(f"{what} · {rows}{pooled} · {rec.elapsed_s * 1000:.1f} ms")
        if isinstance(rec.layer, int) and isinstance(rec.head, int):
            self.grid.select(rec.layer, rec.head)
            if self._lens_pick != (rec.layer, rec.head):  # the lens moved: the step-through view follows
                self._lens_pick = (rec.layer, rec.head)
                self.steps.select(rec.layer, rec.head)
                self._refresh_steps()
        pending, self._pending_index = self._pending_index, None
        index = pending if pending is not None else self.text_view.index
        if index is None or not (rec.row_start <= index < rec.row_stop):
            index = rec.row_stop - 1  # a new window: follow its last query row
        if rec.n_rows:
            self._show_row(index)

    def show_token_attention(self, index: int) -> None:
        """Tint the context by how much token `index` attends to each earlier token (asks for rows if needed)."""
        self.steps.select(query=index)
        self._refresh_steps()
        if self.head is not None and self._covers(self.head, index):
            self._show_row(index)
            return
        self._pending_index = index
        size = self._window_size(index + 1) or 256
        self.head_requested.emit(self._layer(), self._head(), slice(max(0, index - size + 1), index + 1))

    def set_step(self, rec: object) -> None:
        """Draw a StepRecord (one attention cell, step by step) in the step-through view."""
        self.steps.set_record(rec)  # type: ignore[arg-type]

    def set_attention_path(self, path: str) -> None:
        """Which attention path the last prefill took ('plain', 'tiled', 'plain + tiled'; '' hides it)."""
        self.path_label.setText(f"last prefill: {path} attention" if path else "")

    def show_steps(self) -> None:
        """Bring the step-through view on screen (it asks for its cell if it has none yet)."""
        self.views.setCurrentWidget(self.steps)

    def set_colormap(self, name: str) -> None:
        if self.cmap_box.currentText() != name:
            self.cmap_box.setCurrentText(name)
        self.grid.cmap_name = name
        self.head_view.set_colormap(name)
        self.text_view.cmap_name = name
        self.grid.redraw()
        if self.text_view.index is not None:
            self._show_row(self.text_view.index)

    def export_png(self, path: str) -> bool:
        """Save what the lens shows now (grid, heatmap and text) as a PNG."""
        return self.splitter.grab().save(path, "PNG")

    def request_head(self) -> None:
        """Ask for the head view the pickers describe."""
        n = self.attention.n_tokens if self.attention is not None else (self.head.n_tokens if self.head else 0)
        end = min(self.end_spin.value(), max(0, n - 1)) + 1 if n else None
        size = self._window_size(n)
        rows = None if not size or end is None else slice(max(0, end - size), end)
        self.head_requested.emit(self._layer(), self._head(), rows)

    # ---- internals

    def _layer(self) -> object:
        data = self.layer_box.currentData()
        return 0 if data is None else data

    def _head(self) -> object:
        data = self.head_box.currentData()
        return 0 if data is None else data

    def _window_size(self, n: int) -> int:
        """Rows per window for a context of n tokens: 0 means all of them."""
        size = self.rows_box.currentData() or 0
        if size == 0:  # auto
            return 0 if n <= AUTO_ALL_ROWS else 256
        return 0 if size < 0 else int(size)

    @staticmethod
    def _covers(rec: HeadRecord, index: int) -> bool:
        """Whether the record holds query row `index` exactly (no pooling)."""
        return rec.row_step == 1 and rec.col_step == 1 and rec.row_start <= index < rec.row_stop

    def _grid_clicked(self, layer: int, head: int) -> None:
        self.layer_box.setCurrentIndex(max(0, self.layer_box.findData(layer)))
        self.head_box.setCurrentIndex(max(0, self.head_box.findData(head)))
        self.request_head()

    def _views_changed(self) -> None:
        overview = self.views.currentWidget() is not self.steps
        self.bar.setVisible(overview)
        self.info.setVisible(overview)
        self._refresh_steps()

    def _refresh_steps(self) -> None:
        """Ask for the step-through view's cell when it is on screen and out of date."""
        if self.views.currentWidget() is self.steps and self.steps.stale():
            self.steps.request()

    def _grid_settings(self) -> None:
        self.grid.pool = self.pool_box.currentData() or "max"
        self.grid.normalize = self.norm_check.isChecked()
        self.grid.redraw()

    def _sink_toggled(self, hide: bool) -> None:
        self.grid.hide_sink = hide
        self.grid.redraw()
        self.head_view.set_hide_sink(hide)
        if self.text_view.index is not None:
            self._show_row(self.text_view.index)

    def _redraw_grid(self) -> None:
        rec = self.attention
        if rec is None:
            return
        self.grid.record = rec
        self.grid.redraw()
        sampled = "every query row" if rec.full else f"{rec.rows.size} sampled query rows"
        self.exact_button.setEnabled(not rec.full)
        self.grid.setToolTip(f"{rec.n_tokens} tokens, {sampled}, {rec.elapsed_s * 1000:.0f} ms")

    def _show_row(self, index: int) -> None:
        """Tint the text by query `index` from the current record (untinted, with a hint, when it is pooled)."""
        rec = self.head
        if rec is None:
            return
        exact = self._covers(rec, index)
        row = rec.weights[index - rec.row_start] if exact else None
        self.head_view.mark(index, index)
        title = f"Attention of token {index} ({_describe_selection(rec, self.model)})"
        if not exact:
            title = f"Token {index}: this view is pooled; click a token to see its exact attention"
        self.text_view.show_row(rec.token_texts, index, row, window=rec.window, hide_sink=self.sink_check.isChecked(), title=title)

    def _export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export attention view", "attention.png", "PNG images (*.png)")
        if path:
            ok = self.export_png(path)
            self.status.setText(f"Saved {path}" if ok else f"Could not save {path}")


def _describe_selection(rec: HeadRecord, model: ModelRecord | None) -> str:
    layer = f"layer {rec.layer}" if isinstance(rec.layer, int) else f"{rec.layer} of layers"
    if isinstance(rec.head, int):
        head = f"head {rec.head}"
        if rec.kv_head is not None and len(rec.group_heads) > 1:
            head += f" (KV {rec.kv_head}, shared with h{rec.group_heads[0]}–h{rec.group_heads[-1]})"
    else:
        head = f"{rec.head} of heads"
    window = f", sliding window {rec.window}" if rec.window else ""
    return f"{layer}, {head}{window}"
