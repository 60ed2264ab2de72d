"""The Quantization lens: every tensor's type by layer, bytes per layer by type, and one tensor up close."""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, ClassVar

import html
import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor, QFontMetrics, QResizeEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.data.type_reasons import TypeReasons, explain_file_types, plan_reasons
from app.records.model import ModelRecord, TensorRow
from app.records.tensor import TensorRecord
from app.views.common.colours import type_colour
from app.views.common.flow import FillLayout
from app.views.quant.grid import TypeGrid
from app.views.quant.imatrix import ImatrixPanel
from app.views.quant.overrides import OverrideEditor
from app.views.quant.tensor import TensorDetail

if TYPE_CHECKING:
    from app.views.lenses import LensRequests

ROLE_ORDER = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")
GLOBAL_ROW = "model"  # the row for tensors outside blk.N (token_embd, output, output_norm)
NARROW_WIDTH = 1000  # below this the lens shows its three parts as tabs
RIGHT_MIN = 380  # side by side, the tensor and the overrides keep at least this width; the table gets the rest
LEFT_SHARE = 0.44  # ...but never less than this share of the width (the bar chart under the table needs it)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class QuantLens(QWidget):
    """Types of every tensor, bytes per layer, and the selected tensor's distributions and block layout."""

    title: ClassVar[str] = "Quantization"  # the tab it shows in
    tensor_requested = Signal(str)
    block_requested = Signal(str, int)  # (tensor name, block index): answered with set_tensor

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.tensor: TensorRecord | None = None
        self.file_reasons: TypeReasons | None = None  # why each tensor of the file has its type
        self.reasons: dict[str, str] = {}  # the same, with overrides applied in memory taken into account
        self._cells: dict[tuple[int, int], str] = {}
        self.summary = QLabel("Load a model to see how it is quantized.")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.grid = TypeGrid()  # its columns fit the pane whole, on pages by family where they do not all fit
        self.flat = QTableWidget(0, 7)
        self.flat.setHorizontalHeaderLabels(["tensor", "layer", "role", "type", "shape (ne)", "bytes", "bits/weight"])
        self.flat.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.flat.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.flat.verticalHeader().setVisible(False)
        self.flat.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.flat.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)  # the rest of the width:
        self.flat.setTextElideMode(Qt.TextElideMode.ElideMiddle)  # a long name cut in the middle, whole in its tooltip
        tabs = QTabWidget()
        grid_page = QWidget()  # the table's family pages (shown when its columns do not fit whole) above it
        gl = QVBoxLayout(grid_page)
        gl.setContentsMargins(0, 0, 0, 0)
        gl.setSpacing(0)
        gl.addWidget(self.grid.pages)
        gl.addWidget(self.grid, 1)
        tabs.addTab(grid_page, "Layers × tensors")
        tabs.addTab(self.flat, "All tensors")
        self.bars = pg.PlotWidget(background="w", title="Bytes per layer by type")
        self.bars.setLabel("bottom", "layer")
        self.bars.setLabel("left", "size", units="B")
        self.bars.setMinimumHeight(160)
        self.bars.getPlotItem().vb.sigResized.connect(lambda _vb: self._layer_ticks())  # labels as far apart as fit
        self.bars_key = QLabel("")  # the colour key under the chart: a legend inside it would hide the last layers
        self.bars_key.setWordWrap(True)
        bars_box = QWidget()
        bl = QVBoxLayout(bars_box)
        bl.setContentsMargins(0, 0, 0, 0)
        bl.addWidget(self.bars, 1)
        bl.addWidget(self.bars_key)
        left = QSplitter(Qt.Orientation.Vertical)
        left.addWidget(tabs)
        left.addWidget(bars_box)
        left.setSizes([600, 300])
        self.detail = TensorDetail()
        self.overrides = OverrideEditor()
        self.imatrix_panel = ImatrixPanel()
        self.importance: dict[str, np.ndarray] = {}  # the loaded imatrix's column importance per tensor
        editing = QWidget()
        el = QVBoxLayout(editing)
        el.setContentsMargins(0, 0, 0, 0)
        el.addWidget(self.imatrix_panel)
        el.addWidget(self.overrides, 1)
        right = QSplitter(Qt.Orientation.Vertical)
        right.addWidget(self.detail)
        right.addWidget(editing)
        right.setSizes([380, 620])  # the override editor needs room for its preview table
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(right)
        split.setSizes([700, 900])
        self.layer_step = 1  # the bar chart labels every layer_step-th layer
        self._split_dragged = False  # the user moved the handle: the widths are theirs
        split.splitterMoved.connect(lambda _pos, _i: setattr(self, "_split_dragged", True))
        # a narrow pane (1280x800 beside the chat) shows the three parts as tabs instead of side by side
        self.left, self.right, self.editing, self.split = left, right, editing, split
        self.narrow = QTabWidget()
        self.narrow.hide()
        self.narrow_mode = False
        root = FillLayout(self)  # the lens takes the pane's height; its wrapped summary does not stretch it
        root.addWidget(self.summary)
        root.addWidget(split, 1)
        root.addWidget(self.narrow, 1)
        self.grid.cellClicked.connect(self._grid_clicked)
        self.flat.cellClicked.connect(lambda r, _c: self.open_tensor(self.flat.item(r, 0).text()))
        self.detail.block_requested.connect(self.block_requested)
        self.overrides.spec_changed.connect(lambda _spec: self._mark_plan())
        self.overrides.applied_changed.connect(lambda _spec: self._explain())

    # ---- layout

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt override
        self.set_narrow(event.size().width() < NARROW_WIDTH)
        super().resizeEvent(event)
        self.fit_table()

    def table_width(self) -> int:
        """The width the Layers × tensors table needs to show every column without scrolling sideways."""
        g = self.grid
        bar = g.verticalScrollBar().sizeHint().width() if g.rowCount() * g.verticalHeader().defaultSectionSize() \
            > g.viewport().height() else 0
        return g.verticalHeader().width() + g.natural_width() + 2 * g.frameWidth() + bar + 10  # + its tabs

    def fit_table(self) -> None:
        """Side by side, the table gets the width its columns need (token_embd, output and the norms included),
        at least LEFT_SHARE of the width, and the tensor and overrides the rest, never less than RIGHT_MIN; the
        user's own widths stay."""
        if self.narrow_mode or self._split_dragged or self.model is None or self.split.width() <= 0:
            return
        total = self.split.width() - self.split.handleWidth()
        left = min(max(self.table_width(), int(LEFT_SHARE * total)), total - RIGHT_MIN)  # the chart keeps its share
        if left > 0 and abs(self.split.sizes()[0] - left) > 2:
            self.split.setSizes([left, total - left])

    def _layer_ticks(self) -> None:
        """A label under every layer where the labels fit, else under every 2nd, 5th, 10th… (never run together)."""
        n = self.model.n_layers if self.model is not None else 0
        if n <= 0:
            return
        axis = self.bars.getAxis("bottom")
        font = axis.style.get("tickFont") or axis.font()
        need = QFontMetrics(font).horizontalAdvance(str(n - 1)) + 8
        px = self.bars.getPlotItem().vb.width() / n  # screen pixels per layer
        step = next((s for s in (1, 2, 5, 10, 20, 50, 100) if s * px >= need), 200)
        axis.setTicks([[(i, str(i)) for i in range(0, n, step)], []])
        self.layer_step = step

    def set_narrow(self, on: bool) -> None:
        """Tables, the tensor and the overrides as three tabs (a narrow pane), or side by side."""
        if on == self.narrow_mode:
            return
        self.narrow_mode = on
        if on:
            for w, title in ((self.left, "Tensors"), (self.detail, "Tensor"), (self.editing, "Overrides")):
                self.narrow.addTab(w, title)
            self.split.hide()
            self.narrow.show()
        else:
            self.right.insertWidget(0, self.detail)
            self.right.insertWidget(1, self.editing)
            self.split.insertWidget(0, self.left)
            self.split.insertWidget(1, self.right)
            for w in (self.detail, self.editing, self.left, self.right):
                w.show()  # a tab page that was not the current one comes back hidden
            self.right.setSizes([380, 620])
            self.split.setSizes([700, 900])
            self.narrow.hide()
            self.split.show()
            self._split_dragged = False
        self.updateGeometry()  # the minimum size changed: the scroll area around the lens re-checks its scroll bars

    # ---- public API

    def connect_requests(self, to: LensRequests) -> None:
        """Each request signal goes to what answers it (a misspelt name fails here, when the window is built)."""
        self.tensor_requested.connect(to.request_tensor)
        self.block_requested.connect(to.request_block)

    def set_model(self, model: ModelRecord) -> None:
        """Fill the tables, the totals and the per-layer bar chart; another file empties the detail pane."""
        if self.model is None or self.model.path != model.path:
            self.file_reasons = explain_file_types(model)  # the file's own types: the record loaded first
            self.detail.clear()
        self.model = model
        self.tensor = None
        by_type = Counter()
        for t in model.tensors:
            by_type[t.type_name] += t.nbytes
        mix = ", ".join(f"{name} {human_bytes(b)} ({100 * b / max(1, model.total_bytes):.0f}%)" for name, b in by_type.most_common())
        self.summary.setText(
            f"<b>{html.escape(model.name)}</b> ({html.escape(model.arch)}) · {len(model.tensors)} tensors · {model.total_weights:,} weights · "
            f"{human_bytes(model.total_bytes)} of tensors in a {human_bytes(model.file_bytes)} file · "
            f"<b>{model.average_bpw:.3f} bits/weight</b> on average · {mix}"
            + ("" if model.runnable else " · <i>(file only: no forward pass for this architecture yet)</i>")
            + (f" · {html.escape(self.file_reasons.summary())}" if self.file_reasons else "")
        )
        self.reasons = self._reasons()
        self._fill_grid(model)
        self._fill_flat(model.tensors)
        self._fill_bars(model)
        self.fit_table()
        QTimer.singleShot(0, self.fit_table)  # once the new columns are measured
        if self.overrides.record is None or self.overrides.record.path != model.path:
            self.overrides.set_model(model)  # the bridge gives the file's record on load; this covers use without it
        self._mark_plan()

    def set_tensor(self, rec: TensorRecord) -> None:
        """Show one tensor: why it has its type, its distributions and decoded block."""
        self.tensor = rec
        self.detail.set_record(rec, self.reasons.get(rec.name, ""))
        self.detail.set_importance(rec.name, self.importance.get(rec.name))

    def set_imatrix(self, record) -> None:
        """An ImatrixRecord is in use (None: none): the panel says so, the detail draws its heat strip."""
        self.importance = dict(record.importance) if record is not None else {}
        self.imatrix_panel.set_record(record)
        self.overrides.has_imatrix = record is not None  # the preview plans as Apply will (a few presets differ)
        if self.overrides.record is not None:
            self.overrides._changed()
        if self.tensor is not None:
            self.detail.set_importance(self.tensor.name, self.importance.get(self.tensor.name))

    def why(self, name: str) -> str:
        """Why tensor `name` has the type shown now (the file's preset, a fallback, an applied rule)."""
        return self.reasons.get(name, "")

    def _reasons(self) -> dict[str, str]:
        out = dict(self.file_reasons.reasons) if self.file_reasons is not None else {}
        ed = self.overrides
        if ed.record is not None and not ed.applied.empty:
            out.update(plan_reasons(ed.record, ed.applied))
        return out

    def _explain(self) -> None:
        """Overrides were applied or reset: the reasons (cell tooltips, the detail's header) follow."""
        self.reasons = self._reasons()
        if self.model is not None:
            self._mark_plan()
        if self.tensor is not None:
            self.detail.set_reason(self.reasons.get(self.tensor.name, ""))

    # ---- tables

    def _roles(self, model: ModelRecord) -> list[str]:
        roles = {t.role for t in model.tensors if t.layer is not None}
        return [r for r in ROLE_ORDER if r in roles] + sorted(roles - set(ROLE_ORDER))

    def _fill_grid(self, model: ModelRecord) -> None:
        """Rows: the model-wide tensors, then blk.0..; columns: per-layer roles, then model-wide roles."""
        roles = self._roles(model)
        globals_ = [t for t in model.tensors if t.layer is None]
        columns = roles + [t.role for t in globals_]
        self.grid.clear()
        self.grid.setRowCount(model.n_layers + 1)
        self.grid.set_roles(columns, model_wide=len(globals_))  # a word a line keeps columns narrow
        self.grid.setVerticalHeaderLabels([GLOBAL_ROW] + [f"blk.{i} R" if model.is_recurrent(i) else f"blk.{i}"
                                                          for i in range(model.n_layers)])
        if model.hybrid:  # a hybrid's recurrent blocks have other tensors (attn_qkv, ssm_*) than its attention blocks
            self.grid.verticalHeader().setToolTip("R: a recurrent (gated DeltaNet) block: attn_qkv, attn_gate and ssm_* "
                                                  "in place of attn_q/k/v/output")
        self._cells = {}
        for j, t in enumerate(globals_):
            self._set_cell(0, len(roles) + j, t)
        col = {r: j for j, r in enumerate(roles)}
        for t in model.tensors:
            if t.layer is not None and t.layer < model.n_layers:
                self._set_cell(t.layer + 1, col[t.role], t)

    def _set_cell(self, r: int, c: int, t: TensorRow) -> None:
        item = QTableWidgetItem(t.type_name)
        rgb = type_colour(t.type_name)
        item.setBackground(QBrush(QColor(*rgb)))
        item.setForeground(QBrush(QColor("#000")))
        item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
        item.setToolTip(self._tip(t))
        self.grid.setItem(r, c, item)
        self._cells[(r, c)] = t.name

    def _tip(self, t: TensorRow, after: str = "") -> str:
        shape = " × ".join(map(str, t.shape))
        why = self.reasons.get(t.name, "")
        return (f"{t.name}\n{t.type_name} · [{shape}] · {t.nbytes:,} bytes · {t.bpw:.4g} bits/weight"
                + (f"\nwhy {t.type_name}: {why}" if why else "") + (f"\nafter Apply: {after}" if after else ""))

    def _fill_flat(self, rows: tuple[TensorRow, ...]) -> None:
        self.flat.setSortingEnabled(False)
        self.flat.setRowCount(len(rows))
        for i, t in enumerate(rows):
            values = [t.name, "" if t.layer is None else t.layer, t.role, t.type_name, " × ".join(map(str, t.shape)), t.nbytes, round(t.bpw, 4)]
            for j, v in enumerate(values):
                item = QTableWidgetItem()
                item.setData(Qt.ItemDataRole.DisplayRole, v)
                if j == 0:
                    item.setToolTip(t.name)
                if j == 3:
                    item.setBackground(QBrush(QColor(*type_colour(t.type_name))))
                    item.setToolTip(self._tip(t))
                self.flat.setItem(i, j, item)
        self.flat.setSortingEnabled(True)

    def _fill_bars(self, model: ModelRecord) -> None:
        self.bars.clear()
        keys = []
        per_layer: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(model.n_layers))
        for t in model.tensors:
            if t.layer is not None and t.layer < model.n_layers:
                per_layer[t.type_name][t.layer] += t.nbytes
        bottom = np.zeros(model.n_layers)
        x = np.arange(model.n_layers)
        for name in sorted(per_layer, key=lambda n: -per_layer[n].sum()):
            h = per_layer[name]
            bar = pg.BarGraphItem(x=x, height=h, y0=bottom, width=0.8, brush=pg.mkBrush(*type_colour(name)), pen=pg.mkPen("w", width=0.5))
            self.bars.addItem(bar)
            r, g, b = type_colour(name)
            size = human_bytes(h.sum()).replace(" ", "&nbsp;")  # a type's key never breaks between its lines
            keys.append(f"<span style='color:rgb({r},{g},{b})'>■</span>&nbsp;{name}&nbsp;{size}")
            bottom = bottom + h
        outside = sum(t.nbytes for t in model.tensors if t.layer is None)
        keys.append(f"outside the layers (token_embd, output, norms): {human_bytes(outside)}")
        self.bars_key.setText("&nbsp;&nbsp; ".join(keys))
        n = model.n_layers
        self.bars.setXRange(-0.6, n - 0.4, padding=0)  # every layer, the last one included
        self.bars.setYRange(0, float(bottom.max()) * 1.05 if n else 1.0, padding=0)
        self._layer_ticks()
        self.bars.setTitle("Bytes per layer by type")  # short: a long title would widen the plot past its pane

    def _grid_clicked(self, r: int, c: int) -> None:
        name = self._cells.get((r, c))
        if name:
            self.open_tensor(name)

    def _mark_plan(self) -> None:
        """Cells the override preview changes show the new type (in its colour, italic); the others their own."""
        plan = self.overrides.plan
        rows = {t.name: t for t in self.model.tensors} if self.model is not None else {}
        for (r, c), name in self._cells.items():
            item, row = self.grid.item(r, c), rows.get(name)
            tp = plan.tensors.get(name) if plan is not None else None
            if item is None or row is None:
                continue
            new = tp.new.name if tp is not None and tp.new.name != row.type_name else None
            item.setText(f"→{new}" if new else row.type_name)
            item.setToolTip(self._tip(row, f"{new}: {tp.reason}" if new else ""))
            item.setBackground(QBrush(QColor(*type_colour(new or row.type_name))))
            font = item.font()
            font.setItalic(new is not None)
            item.setFont(font)
        self.grid.fit_columns()  # "→Q2_K" is wider than "Q4_K"

    def open_tensor(self, name: str) -> None:
        """Show tensor `name` up close: the editor picks it, the detail says it is loading, the lens asks for it."""
        self.overrides.pick_tensor(name)
        self.detail.loading(name)
        if self.narrow_mode:
            self.narrow.setCurrentWidget(self.detail)  # the table and the tensor share the pane: show what was asked
        self.tensor_requested.emit(name)
