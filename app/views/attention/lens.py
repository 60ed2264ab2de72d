"""The Attention lens: a layers x heads grid, one head large with token labels, and the context tinted by attention.

The lens only draws records; heavy work happens on a worker. It asks through signals (`connect_requests`):
`head_requested(layer, head, rows)` (layer: int | 'mean' | 'max', head: int | 'mean' | 'max', rows: slice
| None) is answered with `set_head(HeadRecord)`; `attention_requested(max_rows)` (None = every query
row, exact) is answered with `set_attention(AttentionRecord)`.

A hybrid (Qwen3.5) shows its recurrent layers in the same grid and head view (each value head's read map), and
one more view, State (`state_requested`, answered with `set_state(StateRecord)`): what the recurrent layers
keep instead of a KV cache.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QLabel, QSizePolicy, QSplitter, QStackedWidget, QTabWidget,
                               QVBoxLayout, QWidget)
from superqt.utils import qthrottled

from app.records.attention import AttentionRecord, HeadRecord
from app.records.model import ModelRecord
from app.views.attention.controls import EMPTY_TEXT, ElidedLabel, OverviewBar, empty_state, model_line
from app.views.attention.grid import GridView
from app.views.attention.head import HeadView
from app.views.attention.head_follow import HeadFollow
from app.views.attention.logit_view import LogitLensView
from app.views.attention.roles import HeadRolesView
from app.views.attention.seq2seq import Seq2SeqView
from app.views.attention.state import StateView
from app.views.attention.steps import StepThroughView
from app.views.attention.text import TokenTextView
from app.views.status import ElidedLabel as StatusLine

if TYPE_CHECKING:
    from app.views.lenses import LensRequests

LIVE_GRID_MS = 150
LIVE_HEAD_MS = 500
STREAMING_TEXT = ("A reply is being made: the heads are scored once it ends (scoring while it streams would pause "
                  "it). The overview follows it live.")


class AttentionLens(HeadFollow, QWidget):
    """BertViz-style model view and head view over records made by app.records."""

    title: ClassVar[str] = "Attention"  # the tab it shows in
    head_requested = Signal(object, object, object)  # layer, head, rows
    attention_requested = Signal(object)  # max_rows (None = all rows, exact)
    step_requested = Signal(int, int, int)  # layer, head, query token: answered with set_step(StepRecord)
    roles_requested = Signal(str)  # 'chat' | 'probe': answered with set_roles(HeadRolesRecord)
    logit_requested = Signal(int, int)  # position, width: answered with set_logit_lens(LogitLensRecord)
    hidden_keys_changed = Signal(object)  # the sink keys to leave out of the grid: answered with set_attention
    seq2seq_requested = Signal()  # an encoder-decoder model's maps: answered with set_seq2seq
    cross_step_requested = Signal(int, int, int)  # decoder layer, head, output position: answered with set_cross_step
    state_requested = Signal()  # a hybrid's recurrent state: answered with set_state(StateRecord)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.attention: AttentionRecord | None = None
        self.head: HeadRecord | None = None
        self._pending_index: int | None = None
        self._lens_pick: tuple[object, object] | None = None  # the layer/head last handed to the step-through view
        self._end_pinned = False  # the user set "to row" below the newest token: the window stays there
        self.hidden_keys: tuple[int, ...] = (0,)  # what "hide sinks" hides
        self._part_note = ""  # rows set to a reply's part that the chat does not have: said in the info line
        self.streaming = False  # a reply is being made: the views that score the whole chat wait for its end
        self._build()
        self._live_grid = qthrottled(self._redraw_grid, timeout=LIVE_GRID_MS)
        self._live_head = qthrottled(self.request_head, timeout=LIVE_HEAD_MS)

    # ---- layout

    def _build(self) -> None:
        self.bar = OverviewBar()  # the overview's controls: hidden while another view (with its own) is shown
        for name in ("layer_box", "head_box", "rows_box", "end_spin", "pool_box", "norm_check", "sink_check",
                     "cmap_box", "follow_check", "exact_button", "export_button"):
            setattr(self, name, getattr(self.bar, name))
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
        self.overview = QStackedWidget()
        self.empty = empty_state()
        self.overview.addWidget(self.empty)
        self.overview.addWidget(self.splitter)
        self.status = StatusLine("", elide=Qt.TextElideMode.ElideRight)  # plain text (names and tokens come from the
        # file), cut with … where the pane is narrow, whole in its tooltip
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.info = ElidedLabel("")  # the selection: cut with … in a narrow pane, whole in its tooltip
        self.path_label = QLabel("")
        self.path_label.setToolTip("Which attention path the last prefill took: plain (the full score matrix) or "
                                   "tiled (online softmax over key tiles, for long prompts)")
        foot = QVBoxLayout()  # the hover readout on a line of its own, the selection and the path under it
        foot.setSpacing(0)
        foot.addWidget(self.status)
        line = QHBoxLayout()
        line.addWidget(self.info, 1)
        line.addSpacing(12)
        line.addWidget(self.path_label, 0, Qt.AlignmentFlag.AlignRight)  # on the right, with or without the info
        foot.addLayout(line)
        for label in (self.status, self.info):  # long texts must never widen the lens (1280x800: ~590 px)
            label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.steps = StepThroughView()
        self.roles = HeadRolesView()
        self.logit = LogitLensView()
        self.views = QTabWidget()
        self.views.addTab(self.overview, "Overview")
        self.views.addTab(self.roles, "Head roles")
        self.views.addTab(self.logit, "Logit lens")
        self.views.addTab(self.steps, "Step through")
        self.state_view = StateView()  # a hybrid's recurrent layers: shown for one only
        self.views.addTab(self.state_view, "State")
        self.views.setTabVisible(self.views.indexOf(self.state_view), False)
        self.state_view.hovered.connect(self.status.setText)
        self.state_view.state_requested.connect(self.state_requested)
        self.seq2seq = Seq2SeqView()  # an encoder-decoder model's view: the only tab shown for one
        self.views.addTab(self.seq2seq, "Encoder-decoder")
        self.views.setTabVisible(self.views.indexOf(self.seq2seq), False)
        self.seq2seq.hovered.connect(self.status.setText)
        self.seq2seq.maps_requested.connect(self.seq2seq_requested)
        self.seq2seq.step_requested.connect(self.cross_step_requested)
        root = QVBoxLayout(self)
        root.addWidget(self.bar)
        root.addWidget(self.views, 1)
        root.addLayout(foot)
        self.steps.step_requested.connect(self.step_requested)
        self.steps.hovered.connect(self.status.setText)
        self.roles.hovered.connect(self.status.setText)
        self.roles.roles_requested.connect(self.roles_requested)
        self.roles.head_opened.connect(self.open_head)
        self.roles.hidden_keys_changed.connect(self._hidden_keys)
        self.roles.grid_scores_changed.connect(self.grid.set_role_scores)  # the chosen score frames the thumbnails
        self.logit.hovered.connect(self.status.setText)
        self.logit.logit_requested.connect(self.logit_requested)
        self.views.currentChanged.connect(lambda _i: self._views_changed())
        self.grid.head_clicked.connect(self._grid_clicked)
        self.grid.hovered.connect(self.status.setText)
        self.head_view.hovered.connect(self.status.setText)
        self.head_view.cell_clicked.connect(lambda q, k: self.show_token_attention(q))
        self.text_view.token_clicked.connect(self.show_token_attention)
        self.layer_box.activated.connect(lambda _: self._layer_picked())
        self.head_box.activated.connect(lambda _: self.request_head())
        self.rows_box.activated.connect(lambda _: self.request_head())
        self.end_spin.editingFinished.connect(self._end_edited)
        self.pool_box.currentIndexChanged.connect(self._grid_settings)
        self.norm_check.toggled.connect(self._grid_settings)
        self.sink_check.toggled.connect(self._sink_toggled)
        self.cmap_box.currentTextChanged.connect(self.set_colormap)
        self.exact_button.clicked.connect(lambda: self.attention_requested.emit(None))
        self.export_button.clicked.connect(self._export_dialog)

    # ---- public API

    def connect_requests(self, to: LensRequests) -> None:
        """Each request signal goes to what answers it (a misspelt name fails here, when the window is built)."""
        self.head_requested.connect(to.request_head)
        self.attention_requested.connect(to.request_attention)
        self.step_requested.connect(to.request_step)
        self.roles_requested.connect(to.request_roles)
        self.logit_requested.connect(to.request_logit)
        self.hidden_keys_changed.connect(to.set_hidden_keys)
        self.seq2seq_requested.connect(to.request_seq2seq)
        self.cross_step_requested.connect(to.request_cross_step)
        self.state_requested.connect(to.request_state)

    def set_model(self, model: ModelRecord) -> None:
        """A new model: rebuild the layer and head pickers; forget old records."""
        self.model = model
        self._seq2seq_mode(model.encoder_decoder)
        if model.encoder_decoder:
            self.seq2seq.set_model(model)
        self.bar.set_model(model)
        self.grid.set_model(model)
        self.steps.set_model(model)
        self.roles.set_model(model)
        self.logit.set_recurrent(model.recurrent)
        self.state_view.set_model(model)
        self.clear_chat()
        self.status.setText(model_line(model))

    def _seq2seq_mode(self, on: bool) -> None:
        """An encoder-decoder model shows its Encoder-decoder view only (the decoder-only views read a conversation
        through one stack); any other model shows every view but that one (State: a hybrid's only)."""
        hybrid = self.model is not None and self.model.hybrid
        for i in range(self.views.count()):
            widget = self.views.widget(i)
            self.views.setTabVisible(i, (widget is self.seq2seq) == on and (widget is not self.state_view or hybrid))
        self.bar.setVisible(not on)
        self.views.setCurrentWidget(self.seq2seq if on else self.overview)

    def set_seq2seq(self, rec: object) -> None:
        """An encoder-decoder model's attention record (app.records.seq2seq.Seq2SeqRecord)."""
        self.seq2seq.set_record(rec)  # type: ignore[arg-type]

    def set_cross_step(self, rec: object) -> None:
        self.seq2seq.set_step(rec)  # type: ignore[arg-type]

    def clear_chat(self) -> None:
        """Another chat (or model): every map, row and score of the previous tokens goes; the empty state shows."""
        self.attention = self.head = None
        self._pending_index = None
        self._lens_pick = None
        self._end_pinned = False
        self.hidden_keys = (0,)
        self.grid.record = None
        self.grid.redraw()
        self.head_view.clear_record()
        self.text_view.clear()
        self.text_view.index = None
        self.end_spin.setRange(0, 0)
        self.info.setText("")
        self.status.setText("")
        if self.model is not None:
            self.steps.set_model(self.model)
        self.roles.clear()
        self.logit.clear()
        self.state_view.clear()
        self.overview.setCurrentWidget(self.empty)
        self.empty.setText(EMPTY_TEXT)

    def set_attention(self, rec: AttentionRecord) -> None:
        """A new grid record; redrawn at most every 150 ms while streaming. The row window follows the newest token."""
        grew = self.attention is None or rec.n_tokens != self.attention.n_tokens
        self.attention = rec
        self.overview.setCurrentWidget(self.splitter if rec.n_tokens else self.empty)
        self.end_spin.setMaximum(max(0, rec.n_tokens - 1))
        if not self._end_pinned:
            self.end_spin.setValue(max(0, rec.n_tokens - 1))
        self._live_grid()
        self.steps.set_tokens(rec.token_texts)
        self.logit.set_tokens(rec.n_tokens)
        if not self.streaming:  # a live record: the whole-chat views wait for the reply's end (reply_ended)
            self._refresh_steps()
            self._refresh_tab()
        if self.head is None and rec.n_tokens:  # no head drawn yet: ask (again, when the last answer was dropped as
            self.request_head()  # stale: a reply started before it ran, or another model was opened)
        elif grew and self.follow_check.isChecked() and self.head is not None:
            self._live_head()

    def set_roles(self, rec: object) -> None:
        """Draw a HeadRolesRecord in the Head roles view."""
        self.roles.set_record(rec)  # type: ignore[arg-type]

    def set_logit_lens(self, rec: object) -> None:
        """Draw a LogitLensRecord in the Logit lens view."""
        self.logit.set_record(rec)  # type: ignore[arg-type]

    def set_state(self, rec: object) -> None:
        """Draw a StateRecord (a hybrid's recurrent layers) in the State view."""
        self.state_view.set_record(rec)  # type: ignore[arg-type]

    def show_state(self) -> None:
        """Bring the State view on screen (a hybrid's; it asks for its record when it has none yet)."""
        self.views.setCurrentWidget(self.state_view)

    def lens_failed(self, kind: str, message: str) -> None:
        """A Head roles or logit-lens computation failed (or had nothing to work on): its view shows why."""
        if kind == "roles":
            self.roles.clear(f"Could not score the heads: {message}")
        elif kind == "logit":
            self.logit.panel.clear(f"Could not decode the layers: {message}")
        elif kind == "attention" and self.attention is None:
            self.empty.setText(f"No attention to show: {message}")
        elif kind == "state":
            self.state_view.clear(f"Could not read the recurrent state: {message}")

    def new_reply(self) -> None:
        """A reply is being made (a new message, Regenerate, Continue): head roles, the logit lens and the step
        shown describe the context before it, so they go; the overview follows the reply live."""
        self.streaming = True
        self.roles.clear(STREAMING_TEXT)
        self.logit.clear()
        self.state_view.asked = False  # the reply's tokens make it stale; it asks again when on screen
        self._lens_pick = None
        if self.model is not None:
            self.steps.set_model(self.model)

    def reply_ended(self) -> None:
        """The reply is made: head roles, the logit lens, the State and Step through views score it when the
        overview of the whole reply arrives (they never run while it streams: each would pause the reply)."""
        self.streaming = False
        if self.roles.record is None and self.roles.asked is None:
            self.roles.clear()

    def waiting(self, text: str) -> None:
        """Nothing of this chat is drawn yet and it is being read (a reopened chat, another version): say so."""
        if self.attention is None:
            self.overview.setCurrentWidget(self.empty)
            self.empty.setText(text)

    def open_head(self, layer: int, head: int) -> None:
        """Show (layer, head) in the overview (a head clicked in Head roles)."""
        self.views.setCurrentWidget(self.overview)
        self._grid_clicked(int(layer), int(head))

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

    # ---- internals

    def _grid_clicked(self, layer: int, head: int) -> None:
        self.layer_box.setCurrentIndex(max(0, self.layer_box.findData(layer)))
        self.bar.set_heads(layer)  # a recurrent layer lists its value heads, an attention layer its query heads
        self.head_box.setCurrentIndex(max(0, self.head_box.findData(head)))
        self.request_head()

    def _layer_picked(self) -> None:
        self.bar.set_heads(self._layer())
        self.request_head()

    def _views_changed(self) -> None:
        overview = self.views.currentWidget() is self.overview
        self.bar.setVisible(overview)
        self.info.setVisible(overview)
        self.status.setText("")
        self._refresh_steps(asked=True)
        self._refresh_tab()

    def _refresh_tab(self) -> None:
        """Head roles and the logit lens ask for the chat's scores when they come on screen out of date."""
        current, rec = self.views.currentWidget(), self.attention
        if rec is None or rec.n_tokens < 2 or self.streaming:
            return
        if current is self.roles and self.roles.asked is None:  # nothing on its way already (the probe, say)
            have = self.roles.record
            if have is None or (have.source == "chat" and have.roles.n_tokens != rec.n_tokens):
                self.roles_requested.emit("chat")
        elif current is self.logit and self.logit.stale():
            self.logit.request()
        elif current is self.state_view and self.state_view.stale(rec.n_tokens):
            self.state_view.request()

    def _end_edited(self) -> None:
        """The user set "to row": the window stays there until it is set back to the newest token."""
        self._end_pinned = self.end_spin.value() < self.end_spin.maximum()
        self.request_head()

    def _hidden_keys(self, keys: object) -> None:
        """The sinks ticked in Head roles are what "hide sinks" hides; only the user ticks "hide sinks" itself."""
        self.hidden_keys = tuple(int(k) for k in keys) or (0,)  # type: ignore[union-attr]
        self.head_view.set_hidden(self.hidden_keys)
        if self.text_view.index is not None:
            self._show_row(self.text_view.index)
        self.hidden_keys_changed.emit(self.hidden_keys)

    def _refresh_steps(self, asked: bool = False) -> None:
        """Ask for the step-through view's cell when it is on screen and out of date (while a reply streams, only
        when the user `asked`: a click on a token, another view)."""
        if self.streaming and not asked:
            return
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

    def _export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export attention view", "attention.png", "PNG images (*.png)")
        if path:
            ok = self.export_png(path)
            self.status.setText(f"Saved {path}" if ok else f"Could not save {path}")

