"""Head roles: every head scored by pattern, as a sortable table and a layers x heads map coloured by one score.

Scores come from a HeadRolesRecord (engine.observe.head_roles): on the chat's attention, or on the induction
probe (random tokens repeated twice, run apart from the chat). Clicking a head (a cell of the map or a table
row) emits `head_opened(layer, head)`; the sinks found are listed with a tick box each, and the ticked keys are
what "hide sinks" hides (`hidden_keys_changed`). The chosen score also frames the overview's thumbnails
(`grid_scores_changed(role, scores by model layer)`, or (None, None) when there is none to show or framing is off).

A hybrid's recurrent (gated DeltaNet) layers are scored too, on their read maps (the share of |W| each token's
output takes from each earlier value: engine.observe.recurrent_roles); their rows say "R", and the line above the
map says how they were scored. Sinks come from the attention layers only.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSplitter,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.records.head_roles import PROBE_LENGTH, HeadRolesRecord
from app.records.model import ModelRecord
from app.views.attention.controls import FlowLayout, NoHfwLabel
from app.views.common.colours import colormap
from app.views.common.tokens import token_label
from engine.observe.head_roles import ROLE_TEXT, ROLES

COLUMNS = ("layer", "head", *ROLES, "strongest role")
HEADERS = {"previous": "prev", "induction": "induct"}  # short headers fit 590 px; each header's tooltip says it all


class _Num(QTableWidgetItem):
    """A table cell that sorts by its number, not its text."""

    def __init__(self, value: float, text: str):
        super().__init__(text)
        self.value = value
        self.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)

    def __lt__(self, other: QTableWidgetItem) -> bool:
        b = getattr(other, "value", 0.0)
        a = self.value if np.isfinite(self.value) else -1.0
        return a < (b if np.isfinite(b) else -1.0)


class HeadRolesView(QWidget):
    """Scores of every head; pick the score that colours the map; click a head to open it."""

    roles_requested = Signal(str)  # 'chat' | 'probe'
    head_opened = Signal(int, int)  # (layer, head)
    hidden_keys_changed = Signal(object)  # tuple of key positions ticked in the sink list
    grid_scores_changed = Signal(object, object)  # (role, (model layers x heads) scores) or (None, None)
    hovered = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.record: HeadRolesRecord | None = None
        self.chat_button = QPushButton("Score this chat")
        self.chat_button.setToolTip("Score every head on the attention the chat's tokens produced")
        self.probe_button = QPushButton("Run induction probe")
        self.probe_button.setToolTip(f"Run {PROBE_LENGTH} random tokens, then the same {PROBE_LENGTH} again, apart from "
                                     "the chat: induction heads attend to what followed each token the first time")
        self.score_box = QComboBox()
        for role in ROLES:
            self.score_box.addItem(role, role)
        self.score_box.setCurrentIndex(ROLES.index("previous"))
        self.frame_check = QCheckBox("frame the overview's thumbnails")
        self.frame_check.setToolTip("Give every thumbnail of the Overview grid a frame coloured by this score")
        self.frame_check.setChecked(True)
        self.about = NoHfwLabel("")
        self.about.setMinimumHeight(44)
        self.about.setWordWrap(True)
        self.about.setTextFormat(Qt.TextFormat.PlainText)
        bar = QWidget()
        flow = FlowLayout(bar)
        for w in (self.chat_button, self.probe_button, QLabel("Colour by"), self.score_box, self.frame_check):
            flow.addWidget(w)
        self.map = pg.PlotWidget()
        self.map.setBackground("w")
        self.map.setMenuEnabled(False)
        self.map.hideButtons()
        self.map.setMouseEnabled(False, False)
        self.map.invertY(True)
        self.map.setLabel("left", "layer")
        self.map.setLabel("bottom", "head")
        self.image = pg.ImageItem(axisOrder="row-major")
        self.map.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(0, 1), colorMap=colormap("viridis"), interactive=False, width=12)
        self.colorbar.setImageItem(self.image, insert_in=self.map.getPlotItem())
        self.map.getPlotItem().layout.setContentsMargins(2, 10, 2, 2)  # the colour bar's top label is drawn whole
        # the empty state: a word-wrapped label in place of the map (text drawn inside the plot was cut mid-word)
        self.empty = NoHfwLabel("")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.empty.setTextFormat(Qt.TextFormat.PlainText)
        self.empty.setStyleSheet("color: #555; background: white; padding: 12px;")
        self.map_stack = QStackedWidget()
        self.map_stack.addWidget(self.empty)
        self.map_stack.addWidget(self.map)
        self.image.hoverEvent = self._hover
        self.image.mouseClickEvent = self._click
        self.table = QTableWidget(0, len(COLUMNS))
        for c, name in enumerate(COLUMNS):
            head = QTableWidgetItem(HEADERS.get(name, "strongest" if c == len(COLUMNS) - 1 else name))
            head.setToolTip(f"{name}: {ROLE_TEXT[name]}" if name in ROLE_TEXT else
                            "the strongest of previous, sink, self and induction" if c == len(COLUMNS) - 1 else name)
            self.table.setHorizontalHeaderItem(c, head)
        self.table.setSortingEnabled(True)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()  # never sideways: the score columns share the width left
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        for c in range(2, 2 + len(ROLES)):
            header.setSectionResizeMode(c, QHeaderView.ResizeMode.Stretch)
        header.setMinimumSectionSize(36)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.table.setWordWrap(False)
        self.table.verticalHeader().setDefaultSectionSize(self.table.fontMetrics().height() + 6)
        self.table.cellClicked.connect(self._row_clicked)
        self.sinks = QListWidget()
        self.sinks.setToolTip("Keys whose mean received attention is far above uniform in some head; "
                              "ticked keys are what “hide sinks” hides in the overview")
        self.sinks.setWordWrap(True)
        self.sinks.itemChanged.connect(lambda _i: self.hidden_keys_changed.emit(self.hidden_keys()))
        self.sink_title = NoHfwLabel("Sinks")
        self.sink_title.setMinimumHeight(30)
        self.sink_title.setWordWrap(True)
        sinks = QWidget()
        lay = QVBoxLayout(sinks)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.sink_title)
        lay.addWidget(self.sinks, 1)
        top = QSplitter(Qt.Orientation.Horizontal)
        top.addWidget(self.map_stack)
        top.addWidget(sinks)
        top.setSizes([300, 300])
        top.setChildrenCollapsible(False)
        split = QSplitter(Qt.Orientation.Vertical)  # the table gets the pane's whole width for its columns
        split.addWidget(top)
        split.addWidget(self.table)
        split.setSizes([420, 300])
        split.setChildrenCollapsible(False)
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addWidget(bar)
        root.addWidget(self.about)
        root.addWidget(split, 1)
        self.asked: str | None = None  # the source asked for and not answered yet
        self.roles_requested.connect(self._asked)
        self.chat_button.clicked.connect(lambda: self.roles_requested.emit("chat"))
        self.probe_button.clicked.connect(lambda: self.roles_requested.emit("probe"))
        self.score_box.currentIndexChanged.connect(lambda _i: self._role_changed())
        self.frame_check.toggled.connect(lambda _on: self._emit_grid_scores())
        self.clear()

    # ---- public API

    def set_model(self, model: ModelRecord) -> None:
        self.model = model
        self.clear()

    def clear(self, message: str = "Press Score this chat (after a message) or Run induction probe to score every "
                                   "head.") -> None:
        """Forget the scores (a new model or another chat)."""
        self.record = None
        self.asked = None
        self.table.setRowCount(0)
        self.sinks.blockSignals(True)
        self.sinks.clear()
        self.sinks.blockSignals(False)
        self.sink_title.setText("Sinks")
        self.image.clear()
        self.empty.setText(message)
        self.map_stack.setCurrentWidget(self.empty)
        self.map.setRange(QRectF(0, 0, 1, 1), padding=0)
        self.about.setText("Every head scored by the pattern it follows. " + ROLE_TEXT[self.role()] + ".")
        self._emit_grid_scores()

    def grid_scores(self) -> tuple[str | None, np.ndarray | None]:
        """(role, scores with one row per model layer, NaN where unscored) the grid is framed by, or (None, None)."""
        rec = self.record
        if rec is None or not self.frame_check.isChecked():
            return None, None
        s = rec.roles.scores[self.role()]
        layers = [int(v) for v in rec.roles.layers]
        n_layers = max([*layers, -1]) + 1
        if self.model is not None:
            n_layers = max(n_layers, self.model.n_layers)
        full = np.full((n_layers, s.shape[1]), np.nan, np.float32)
        full[layers] = s
        return self.role(), full

    def _emit_grid_scores(self) -> None:
        self.grid_scores_changed.emit(*self.grid_scores())

    def _asked(self, source: str) -> None:
        """Say what runs: in the line above the map when scores are drawn, else in the empty state (never over
        the map)."""
        self.asked = source
        text = "Running the induction probe…" if source == "probe" else "Scoring every head on this chat…"
        if self.record is None:
            self.empty.setText(text)
            self.map_stack.setCurrentWidget(self.empty)
        else:
            self.about.setText(text)

    def role(self) -> str:
        return str(self.score_box.currentData() or "previous")

    def set_role(self, role: str) -> None:
        i = self.score_box.findData(role)
        if i >= 0:
            self.score_box.setCurrentIndex(i)

    def set_record(self, rec: HeadRolesRecord) -> None:
        """Show a new set of scores."""
        self.record = rec
        self.asked = None
        self._fill_table(rec)
        self._fill_sinks(rec)
        self._draw_map()
        self._emit_grid_scores()

    def hidden_keys(self) -> tuple[int, ...]:
        """Keys ticked in the sink list (key 0 when no scores are known yet)."""
        if self.sinks.count() == 0:
            return (0,)
        keys = []
        for i in range(self.sinks.count()):
            item = self.sinks.item(i)
            if item.checkState() == Qt.CheckState.Checked:
                keys.append(int(item.data(Qt.ItemDataRole.UserRole)))
        return tuple(sorted(keys))

    # ---- drawing

    def _fill_table(self, rec: HeadRolesRecord) -> None:
        """Every head's row; the columns sized to their contents once, after the rows are in (sized per cell, a
        576-head model's 7,000 cells took 17 s of the GUI thread)."""
        header = self.table.horizontalHeader()
        modes = [header.sectionResizeMode(c) for c in range(header.count())]
        for c in range(header.count()):
            header.setSectionResizeMode(c, QHeaderView.ResizeMode.Fixed)
        try:
            self._fill_rows(rec)
        finally:
            for c, mode in enumerate(modes):
                header.setSectionResizeMode(c, mode)

    def _fill_rows(self, rec: HeadRolesRecord) -> None:
        r = rec.roles
        self.table.setSortingEnabled(False)
        n_l, n_h = r.scores[ROLES[0]].shape
        hybrid = bool(rec.recurrent)  # rows as wide as the widest layer: a layer's own heads only
        cells = [(li, h) for li in range(n_l)
                 for h in range(_heads_of(rec, int(r.layers[li]), n_h) if hybrid else n_h)]
        self.table.setRowCount(len(cells))
        stack = np.stack([r.scores[role] for role in ROLES], axis=-1)  # (L, H, roles)
        for row, (li, h) in enumerate(cells):
            layer = int(r.layers[li])
            recurrent = layer in rec.recurrent
            self.table.setItem(row, 0, _Num(layer, f"{layer} R" if recurrent else str(layer)))
            self.table.setItem(row, 1, _Num(h, f"v{h}" if recurrent else f"h{h}"))
            for c, role in enumerate(ROLES):
                v = float(stack[li, h, c])
                self.table.setItem(row, 2 + c, _Num(v, f"{v:.3f}" if np.isfinite(v) else "–"))
            # "strongest" ignores broad and local, which overlap the others (a previous-token head is local too)
            pick = [ROLES.index(x) for x in ("previous", "sink", "self", "induction")]
            vals = np.where(np.isfinite(stack[li, h, pick]), stack[li, h, pick], -1.0)
            best = ROLES[pick[int(np.argmax(vals))]]
            item = QTableWidgetItem(f"{best} {float(vals.max()):.2f}")
            self.table.setItem(row, 2 + len(ROLES), item)
        self.table.setSortingEnabled(True)
        self.table.sortItems(2 + ROLES.index(self.role()), Qt.SortOrder.DescendingOrder)

    def _fill_sinks(self, rec: HeadRolesRecord) -> None:
        self.sinks.blockSignals(True)
        self.sinks.clear()
        for s in rec.roles.sinks:
            text = (f"key {s.key} “{token_label(rec.sink_text(s.key), 12)}”: {s.n_heads} heads, "
                    f"≤ {s.weight:.2f} (L{s.layer} h{s.head}, {s.ratio:.0f}× uniform)")
            item = QListWidgetItem(text)
            item.setData(Qt.ItemDataRole.UserRole, s.key)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked)
            self.sinks.addItem(item)
        self.sinks.blockSignals(False)
        where = "the chat" if rec.source == "chat" else "the probe"
        self.sink_title.setText(f"Sinks in {where} ({len(rec.roles.sinks)}): tick the keys “hide sinks” hides")
        if rec.source == "chat":
            self.hidden_keys_changed.emit(self.hidden_keys())

    def _role_changed(self) -> None:
        """Another score: the map is coloured by it and the table sorted by it, highest first."""
        if self.record is not None:
            self.table.sortItems(2 + ROLES.index(self.role()), Qt.SortOrder.DescendingOrder)
        self._draw_map()
        self._emit_grid_scores()

    def _draw_map(self) -> None:
        role = self.role()
        rec = self.record
        if rec is None:
            self.about.setText("Every head scored by the pattern it follows. " + ROLE_TEXT[role] + ".")
            return
        s = rec.roles.scores[role]
        n_l, n_h = s.shape
        self.map_stack.setCurrentWidget(self.map)
        self.image.setImage(np.nan_to_num(s, nan=0.0), autoLevels=False, levels=(0.0, 1.0),
                            rect=QRectF(0, 0, n_h, n_l))
        self.map.getAxis("bottom").setTicks([[(h + 0.5, f"h{h}") for h in range(n_h)]])
        step = max(1, n_l // 15)
        self.map.getAxis("left").setTicks([[(li + 0.5, f"{rec.roles.layers[li]}" + (" R" if rec.roles.layers[li] in
                                                                                     rec.recurrent else ""))
                                            for li in range(0, n_l, step)]])
        self.map.setRange(QRectF(0, 0, n_h, n_l), padding=0)
        top = rec.roles.top(role, 3)
        best = ", ".join(f"L{layer} {'v' if layer in rec.recurrent else 'h'}{h} ({v:.2f})" for layer, h, v in top)
        src = (f"the induction probe ({rec.roles.n_tokens} tokens: random, then the same again)"
               if rec.source == "probe" else f"the chat ({rec.roles.n_tokens} tokens)")
        self.about.setText(f"{role}: {ROLE_TEXT[role]}. On {src}, strongest: {best or '–'}. "
                           "Click a head to open it in the overview." + recurrent_text(rec))

    # ---- interaction

    def head_at(self, x: float, y: float) -> tuple[int, int] | None:
        rec = self.record
        if rec is None:
            return None
        n_l, n_h = rec.roles.scores[ROLES[0]].shape
        li, h = int(np.floor(y)), int(np.floor(x))
        return (li, h) if 0 <= li < n_l and 0 <= h < n_h else None

    def describe(self, li: int, h: int) -> str:
        rec = self.record
        assert rec is not None
        parts = [f"{role} {float(rec.roles.scores[role][li, h]):.3f}" for role in ROLES]
        layer = rec.roles.layers[li]
        if layer in rec.recurrent:
            return f"layer {layer} (recurrent), value head {h}, on its read map: " + " · ".join(parts)
        return f"layer {layer}, head {h}: " + " · ".join(parts)

    def _hover(self, ev) -> None:
        if ev.isExit():
            return
        hit = self.head_at(ev.pos().x(), ev.pos().y())
        if hit is not None:
            self.hovered.emit(self.describe(*hit))

    def _click(self, ev) -> None:
        hit = self.head_at(ev.pos().x(), ev.pos().y())
        if hit is not None and ev.button() == Qt.MouseButton.LeftButton and self.record is not None:
            ev.accept()
            self.head_opened.emit(self.record.roles.layers[hit[0]], hit[1])

    def _row_clicked(self, row: int, _col: int) -> None:
        layer, head = self.table.item(row, 0), self.table.item(row, 1)
        if layer is not None and head is not None:
            self.head_opened.emit(int(layer.value), int(head.value))


def _heads_of(rec: HeadRolesRecord, layer: int, width: int) -> int:
    """A layer's scored heads: those with any finite score (rows are as wide as the widest layer)."""
    li = list(rec.roles.layers).index(layer)
    finite = np.zeros(width, bool)
    for role in ROLES:
        finite |= np.isfinite(rec.roles.scores[role][li])
    return int(np.flatnonzero(finite).max() + 1) if finite.any() else width


def recurrent_text(rec: HeadRolesRecord) -> str:
    """How a hybrid's recurrent layers were scored ('' without them)."""
    if not rec.recurrent:
        return ""
    from app.records.logit_lens import layer_runs  # noqa: PLC0415 - plain Python

    window = (f" over tokens {rec.read_start}–{rec.roles.n_tokens - 1} (their reads are decomposed for the last "
              "positions; 'sink' is the first of those)") if rec.read_start else ""
    return (f" Layers marked R ({layer_runs(rec.recurrent)}) are recurrent (gated DeltaNet): no softmax, so each value "
            f"head is scored on its read map, the share of |W| its output takes from each earlier token{window}. "
            "Sinks come from the attention layers.")
