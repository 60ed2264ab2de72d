"""The Model lens: the architecture's numbers, tokenizer, layers (which attend, which are recurrent), KV-cache cost,
load warnings, metadata, chat template."""
from __future__ import annotations

import html
from types import SimpleNamespace
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QSortFilterProxyModel, Qt, QTimer
from PySide6.QtGui import QFontDatabase, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView, QCheckBox, QFormLayout, QGroupBox, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QPlainTextEdit,
    QScrollArea, QTableView, QTabWidget, QVBoxLayout, QWidget,
)

from app.records.kv import CACHE_TYPES, kv_bytes_for, kv_formula
from app.records.model_info import MetadataRow, ModelInfo
from app.views.common.formatting import human_bytes

Index = QModelIndex | QPersistentModelIndex
KV_REFRESH_MS = 250  # the KV rows follow a streaming reply at most this often


def _plain(text: str, style: str = "") -> QLabel:
    label = QLabel(text)
    label.setTextFormat(Qt.TextFormat.PlainText)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setWordWrap(True)
    if style:
        label.setStyleSheet(style)
    return label


class MetadataModel(QAbstractTableModel):
    """Key, type, value of each metadata entry (already escaped and elided by app.records.model_info)."""

    HEADERS = ("key", "type", "value")

    def __init__(self, rows: tuple[MetadataRow, ...] = ()):
        super().__init__()
        self.rows = rows

    def set_rows(self, rows: tuple[MetadataRow, ...]) -> None:
        self.beginResetModel()
        self.rows = rows
        self.endResetModel()

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 - Qt override
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: N802 - Qt override
        return 0 if parent.isValid() else 3

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        value = (row.key, row.type_name, row.value)[index.column()]
        if role == Qt.ItemDataRole.DisplayRole:
            return value
        if role == Qt.ItemDataRole.ToolTipRole and index.column() == 2:
            return "<qt>" + html.escape(value) + "</qt>"  # forced rich text of escaped text: never markup
        return None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole) -> object:  # noqa: N802
        if role == Qt.ItemDataRole.DisplayRole and orientation == Qt.Orientation.Horizontal:
            return self.HEADERS[section]
        return None


class ModelLens(QWidget):
    """Everything the file says about the model, as plain text."""

    def __init__(self, state: Any = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.info: ModelInfo | None = None
        self.state: Any = None
        lay = QVBoxLayout(self)
        self.title = _plain("No model loaded", "font-size: 15px; font-weight: bold;")
        self.subtitle = _plain("", "color: #666;")
        lay.addWidget(self.title)
        lay.addWidget(self.subtitle)
        self.tabs = QTabWidget()
        lay.addWidget(self.tabs, 1)
        self.tabs.addTab(self._overview(), "Overview")
        self.tabs.addTab(self._metadata(), "Metadata")
        self.tabs.addTab(self._template(), "Chat template")
        if state is not None:
            self.bind(state)

    def bind(self, state: Any) -> None:
        """Follow an AppState's KV cache (type, bytes now and at full context) and attention path."""
        self.state = state
        self._kv_stale = False
        self._kv_timer = QTimer(self, singleShot=True, interval=KV_REFRESH_MS)  # a reply changes these every token:
        self._kv_timer.timeout.connect(self._show_kv)  # the rows are rebuilt at most this often, and only on screen
        for name in ("kv_bytes", "kv_type", "kv_full_bytes", "ctx_size", "ctx_used", "attention_path"):
            getattr(state, f"{name}_changed").connect(lambda _v: self._kv_soon())
        self._show_kv()

    def _kv_soon(self) -> None:
        if not self.isVisible():
            self._kv_stale = True
        elif not self._kv_timer.isActive():
            self._kv_timer.start()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if getattr(self, "_kv_stale", False):
            self._kv_stale = False
            self._show_kv()

    def _overview(self) -> QWidget:
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        host = QWidget()
        v = QVBoxLayout(host)
        self.layers_box = QGroupBox("Layers")
        self.layers_box.setToolTip("How each layer mixes tokens: softmax attention (KV rows per token) or a recurrent "
                                   "gated DeltaNet layer (a constant-size state per value head)")
        self.layers_form = QFormLayout(self.layers_box)
        v.addWidget(self.layers_box)  # first: which layers attend and which are recurrent
        row = QHBoxLayout()
        self.arch_box = QGroupBox("Architecture")
        self.arch_form = QFormLayout(self.arch_box)
        self.tok_box = QGroupBox("Tokenizer")
        self.tok_form = QFormLayout(self.tok_box)
        row.addWidget(self.arch_box, 1)
        row.addWidget(self.tok_box, 1)
        v.addLayout(row)
        self.kv_box = QGroupBox("KV cache")
        self.kv_form = QFormLayout(self.kv_box)
        v.addWidget(self.kv_box)
        self.warn_box = QGroupBox("Load warnings")
        self.warn_layout = QVBoxLayout(self.warn_box)
        v.addWidget(self.warn_box)
        v.addStretch(1)
        scroll.setWidget(host)
        return scroll

    def _metadata(self) -> QWidget:
        w = QWidget()
        v = QVBoxLayout(w)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search keys and values…")
        self.search.setClearButtonEnabled(True)
        v.addWidget(self.search)
        self.meta_model = MetadataModel()
        self.proxy = QSortFilterProxyModel()
        self.proxy.setSourceModel(self.meta_model)
        self.proxy.setFilterKeyColumn(-1)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.search.textChanged.connect(self.proxy.setFilterFixedString)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.table.setColumnWidth(0, 280)
        v.addWidget(self.table, 1)
        self.meta_count = _plain("", "color: #777;")
        v.addWidget(self.meta_count)
        self.proxy.rowsInserted.connect(self._count)
        self.proxy.modelReset.connect(self._count)
        self.proxy.layoutChanged.connect(self._count)
        self.search.textChanged.connect(lambda _t: self._count())
        return w

    def _template(self) -> QWidget:
        w = QWidget()
        v = QVBoxLayout(w)
        self.template_origin = _plain("", "color: #666;")
        v.addWidget(self.template_origin)
        self.template = QPlainTextEdit()
        self.template.setReadOnly(True)
        self.template.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.template_wrap = QCheckBox("Wrap long lines")  # on: nothing runs past the pane; off: the lines as written
        self.template_wrap.setToolTip("Off: each line of the template as written, scrolled sideways")
        self.template_wrap.toggled.connect(lambda on: self.template.setLineWrapMode(
            QPlainTextEdit.LineWrapMode.WidgetWidth if on else QPlainTextEdit.LineWrapMode.NoWrap))
        self.template_wrap.setChecked(True)
        v.addWidget(self.template_wrap)
        v.addWidget(self.template, 1)
        return w

    def _show_kv(self) -> None:
        """Bytes the KV cache holds now and at the full context, in its type and in every type the engine offers."""
        while self.kv_form.rowCount():
            self.kv_form.removeRow(0)
        shape = _kv_shape(self.info)
        if shape is None:
            return
        st = self.state
        cache_type = getattr(st, "kv_type", None) or "F16"
        n_ctx = int(getattr(st, "ctx_size", 0) or shape.n_ctx)
        rows: list[tuple[str, str]] = []
        if st is not None:
            rows.append(("now", f"{human_bytes(st.kv_bytes)} for {st.ctx_used:,} tokens, {cache_type}"))
        full = kv_bytes_for(shape, n_ctx, cache_type)
        rows.append((f"at {n_ctx:,} tokens", f"{human_bytes(full or 0)} = {kv_formula(shape, n_ctx, cache_type)}"))
        trained = int(dict(self.info.args).get("n_ctx", 0) or 0) if self.info else 0
        if trained > n_ctx:
            rows.append((f"at {trained:,} tokens", f"{human_bytes(kv_bytes_for(shape, trained, cache_type) or 0)}: the "
                                                   "model's own context (the Context limit setting caps the cache)"))
        other = (f"{name} {human_bytes(kv_bytes_for(shape, n_ctx, name) or 0)}" for name in CACHE_TYPES)
        rows.append(("by cache type", "  ·  ".join(other) + "  (Sampling panel: KV cache type)"))
        path = getattr(st, "attention_path", "")
        if path:
            rows.append(("last prefill", f"{path} attention"))
        for key, value in rows:
            self.kv_form.addRow(_plain(key, "color: #555;"), _plain(value))

    def _count(self, *args: object) -> None:
        total = len(self.meta_model.rows)
        shown = self.proxy.rowCount()
        self.meta_count.setText(f"{shown} of {total} entries" if shown != total else f"{total} entries")

    def show_info(self, info: ModelInfo | None) -> None:
        """Fill every section from a ModelInfo (None clears them)."""
        self.info = info
        self._show_kv()
        for form in (self.arch_form, self.tok_form, self.layers_form):
            while form.rowCount():
                form.removeRow(0)
        while self.warn_layout.count():
            item = self.warn_layout.takeAt(0)
            if item.widget():
                item.widget().deleteLater()
        if info is None:
            self.title.setText("No model loaded")
            self.subtitle.setText("")
            self.meta_model.set_rows(())
            self.template.setPlainText("")
            return
        named = f"; general.name “{info.model_name}”" if info.model_name else ""  # a copy's own file name above
        self.title.setText(f"{info.name}  ({info.arch}{named})")
        self.subtitle.setText(f"{info.path}  ·  {human_bytes(info.file_bytes)}  ·  {info.n_tensors} tensors  ·  "
                              f"backend {info.backend}  ·  KV cache context {info.n_ctx:,}")
        for key, value in info.args:
            self.arch_form.addRow(_plain(key, "color: #555;"), _plain(value))
        for key, value in info.tokenizer:
            self.tok_form.addRow(_plain(key, "color: #555;"), _plain(value))
        for key, value in info.layer_kinds:
            self.layers_form.addRow(_plain(key, "color: #555;"), _plain(value))
        if info.warnings:
            for w in info.warnings:
                self.warn_layout.addWidget(_plain("• " + w, "color: #a05a00;"))
        else:
            self.warn_layout.addWidget(_plain("none", "color: #777;"))
        self.meta_model.set_rows(info.metadata)
        self.template_origin.setText(f"Source: {info.template_origin}. Shown as plain text; rendered only in a sandbox.")
        self.template.setPlainText(info.template_source or "(this model has no chat template)")


def _kv_shape(info: ModelInfo | None) -> SimpleNamespace | None:
    """n_layers, n_kv_heads, head_dim and n_ctx of a ModelInfo (None when its numbers don't say)."""
    if info is None:
        return None
    args = dict(info.args)
    try:
        return SimpleNamespace(n_layers=int(args["n_layers"]), n_kv_heads=int(args["n_kv_heads"]),
                               head_dim=int(args["head_dim"]), n_ctx=int(info.n_ctx), recurrent=info.recurrent,
                               state_bytes=info.state_bytes)
    except (KeyError, ValueError):
        return None
