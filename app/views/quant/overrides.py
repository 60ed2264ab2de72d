"""The Quantization lens's override editor: a preset, REGEX=TYPE rules, a live preview, and Apply/Cancel/Reset/Save."""
from __future__ import annotations

import html
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from app.data.overrides import (
    RULE_TYPE_NAMES,
    OverrideSpec,
    global_rule,
    layer_rule,
    plan_summary,
    preview_plan,
    role_choices,
    rule_counts,
)
from app.records.model import ModelRecord, split_tensor_name
from app.views.quant.preview import PlanPreview
from engine.errors import SettingError
from engine.quant.presets import PRESETS
from engine.quant.rules import parse_rule

FILE_TYPES = "the file's types"
ALL = "every"
ROLE_ORDER = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
ERROR_STYLE = "color:#b00020"


def fallback_list(fell: list, limit: int = 12) -> str:
    """The tensors that fell back, with the reason, for a tooltip ("" when none did)."""
    if not fell:
        return ""
    lines = [f"{len(fell)} tensor{'s' if len(fell) > 1 else ''} fall back to a type that fits their rows:"]
    lines += [f"  {tp.name} → {tp.new.name}: {tp.reason.rsplit('; ', 1)[-1]}" for tp in fell[:limit]]
    if len(fell) > limit:
        lines.append(f"  … and {len(fell) - limit} more")
    return "\n".join(lines)


class OverrideEditor(QGroupBox):
    """Choose types per layer or tensor by rules, see what changes and the resulting size, then apply or save."""

    spec_changed = Signal(object)  # OverrideSpec, on every edit
    apply_requested = Signal(object)  # OverrideSpec
    cancel_requested = Signal()
    reset_requested = Signal()
    save_requested = Signal(object, str)  # (OverrideSpec, output path)
    applied_changed = Signal(object)  # OverrideSpec now in memory (empty: the file)

    def __init__(self, parent=None):
        super().__init__("Type overrides: requantize the loaded model", parent)
        self.record: ModelRecord | None = None
        self.plan = None
        self.applied = OverrideSpec()
        self.busy: str | None = None
        self._rules: list[tuple[str, str]] = []
        self._filling = False
        self.preset = QComboBox()
        self.preset.addItems([FILE_TYPES, *PRESETS])
        self.preset.setToolTip("The starting point: every tensor's type in the file, or a llama-quantize preset")
        self.in_memory = QLabel("In memory: the file")
        self.rules = QTableWidget(0, 3)
        self.rules.setHorizontalHeaderLabels(["rule: tensor name regex (first match wins)", "type", "tensors"])
        self.rules.verticalHeader().setDefaultSectionSize(22)
        self.rules.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.rules.horizontalHeader().setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        self.rules.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.rules.setMaximumHeight(110)
        self.layer = QComboBox()
        self.role = QComboBox()
        self.qtype = QComboBox()
        self.qtype.addItems(list(RULE_TYPE_NAMES))
        self.qtype.setCurrentText("Q8_0")
        for box in (self.preset, self.layer, self.role, self.qtype):  # never "every lay": as wide as the longest item
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
            box.setSizePolicy(QSizePolicy.Policy.Minimum, QSizePolicy.Policy.Fixed)
        self.add = QPushButton("Add rule")
        self.text = QLineEdit()
        self.text.setPlaceholderText("or type REGEX=TYPE, e.g. attn_v=Q8_0, and press Enter")
        self.remove = QPushButton("Remove")
        self.up = QPushButton("↑")
        self.down = QPushButton("↓")
        self.summary = QLabel("Load a model to set overrides.")
        self.summary.setWordWrap(True)
        self.show_all = QCheckBox("every tensor")
        self.preview = PlanPreview()
        self.apply = QPushButton("Apply")
        self.apply.setToolTip("Requantize the chat's model in memory (the chat, attention and this lens use it)")
        self.cancel = QPushButton("Cancel")
        self.reset = QPushButton("Reset to file")
        self.save = QPushButton("Save GGUF…")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(True)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setTextFormat(Qt.TextFormat.PlainText)  # errors quote the user's rules
        self._layout()
        self.preset.currentTextChanged.connect(lambda _t: self._changed())
        self.add.clicked.connect(self._add_picked)
        self.text.returnPressed.connect(self._add_typed)
        self.remove.clicked.connect(self._remove)
        self.up.clicked.connect(lambda: self._move(-1))
        self.down.clicked.connect(lambda: self._move(1))
        self.rules.itemChanged.connect(self._rule_edited)
        self.show_all.toggled.connect(lambda on: self.preview.set_plan(self.plan, on))
        self.apply.clicked.connect(lambda: self.apply_requested.emit(self.spec()))
        self.cancel.clicked.connect(self.cancel_requested)
        self.reset.clicked.connect(self.reset_requested)
        self.save.clicked.connect(self._choose_save)
        self.set_busy(None)

    def _layout(self) -> None:
        top = QHBoxLayout()
        top.addWidget(QLabel("Start from"))
        top.addWidget(self.preset)
        top.addStretch(1)
        top.addWidget(self.in_memory)
        pick = QHBoxLayout()  # two rows: the menus hold long names (token_embd.weight) and must not be cut
        for label, w in (("Layer", self.layer), ("tensor", self.role)):
            pick.addWidget(QLabel(label))
            pick.addWidget(w)
        pick.addStretch(1)
        typed = QHBoxLayout()
        typed.addWidget(QLabel("→"))
        typed.addWidget(self.qtype)
        typed.addWidget(self.add)
        typed.addWidget(self.text, 1)
        edit = QHBoxLayout()
        edit.addWidget(self.remove)
        edit.addWidget(self.up)
        edit.addWidget(self.down)
        edit.addStretch(1)
        edit.addWidget(self.show_all)
        buttons = QHBoxLayout()  # at the top: Apply is always in sight, however short the pane
        for b in (self.apply, self.cancel, self.reset, self.save):
            buttons.addWidget(b)
        buttons.addWidget(self.progress, 1)
        box = QVBoxLayout(self)
        box.addLayout(top)
        box.addLayout(buttons)
        box.addWidget(self.message)
        box.addWidget(self.rules)
        box.addLayout(pick)
        box.addLayout(typed)
        box.addLayout(edit)
        box.addWidget(self.summary)
        box.addWidget(self.preview, 1)

    # ---- public API

    def set_model(self, record: ModelRecord) -> None:
        """The file's tensors: fill the layer and tensor menus; rules are kept for the same file."""
        same = self.record is not None and self.record.path == record.path
        self.record = record
        self.applied = self.applied if same else OverrideSpec()
        if not same:
            self._rules = []
            self.show_message("")  # "Done: applied ..." spoke of the previous model
            self.preset.blockSignals(True)
            self.preset.setCurrentText(FILE_TYPES)
            self.preset.blockSignals(False)
        roles, globals_ = role_choices(record)
        roles = [r for r in ROLE_ORDER if r in roles] + sorted(set(roles) - set(ROLE_ORDER))
        self.layer.clear()
        self.layer.addItem(f"{ALL} layer", None)
        for i in range(record.n_layers):
            self.layer.addItem(f"blk.{i}", i)
        self.role.clear()
        self.role.addItem(f"{ALL} tensor", None)
        for r in roles:
            self.role.addItem(r, r)
        for t in globals_:
            self.role.addItem(t.name, t.name)
        self._fill_rules()
        self._changed()
        self.set_applied(self.applied)

    def spec(self) -> OverrideSpec:
        """The overrides as edited now."""
        preset = self.preset.currentText()
        return OverrideSpec(None if preset == FILE_TYPES else preset, tuple(f"{p}={t}" for p, t in self._rules))

    def set_spec(self, spec: OverrideSpec) -> None:
        """Show these overrides (e.g. restored); invalid rules show up as errors in the table."""
        self._rules = [tuple(r.rsplit("=", 1)) if "=" in r else (r, "Q8_0") for r in spec.rules]  # type: ignore[misc]
        self.preset.blockSignals(True)
        self.preset.setCurrentText(spec.preset or FILE_TYPES)
        self.preset.blockSignals(False)
        self._fill_rules()
        self._changed()

    def add_rule(self, text: str) -> bool:
        """Append a REGEX=TYPE rule; False (with the reason shown) when it does not parse."""
        try:
            rule = parse_rule(text)
        except SettingError as exc:
            self.show_message(str(exc), error=True)
            return False
        self._rules.append((text.rpartition("=")[0], rule.qtype.name))
        self._fill_rules()
        self._changed()
        return True

    def pick_tensor(self, name: str) -> None:
        """Set the quick-add menus to this tensor's layer and role (a click in the lens's table)."""
        layer, role = split_tensor_name(name)
        i = self.layer.findData(layer) if layer is not None else 0
        self.layer.setCurrentIndex(max(0, i))
        j = self.role.findData(role if layer is not None else name)
        self.role.setCurrentIndex(max(0, j))

    def set_busy(self, task: str | None, what: str = "", fraction: float = 0.0) -> None:
        """Show a running task's progress ('apply', 'reset', 'save'), or None when nothing runs."""
        self.busy = task
        self.progress.setVisible(task is not None)
        self.cancel.setEnabled(task is not None)
        if task is not None:
            self.progress.setValue(int(1000 * max(0.0, min(1.0, fraction))))
            self.progress.setFormat(f"{task}: {what} %p%")
        self._enable()

    def set_applied(self, spec: OverrideSpec, summary: str = "") -> None:
        """What the model in memory holds now (an empty spec: the file)."""
        self.applied = spec
        self.in_memory.setText(f"In memory: <b>{'the file' if spec.empty else html.escape(spec.label())}</b>")
        self.in_memory.setToolTip(summary)
        self._enable()
        self.applied_changed.emit(spec)

    def show_message(self, text: str, error: bool = False) -> None:
        self.message.setStyleSheet(ERROR_STYLE if error else "color:#555")
        self.message.setText(text)

    # ---- rules table

    def _fill_rules(self) -> None:
        self._filling = True
        self.rules.setRowCount(len(self._rules))
        for i, (pattern, qtype) in enumerate(self._rules):
            self.rules.setItem(i, 0, QTableWidgetItem(pattern))
            box = QComboBox()
            box.addItems(list(RULE_TYPE_NAMES))
            box.setCurrentText(qtype)
            box.currentTextChanged.connect(lambda t, row=i: self._type_edited(row, t))
            self.rules.setCellWidget(i, 1, box)
            count = QTableWidgetItem("")
            count.setFlags(count.flags() & ~Qt.ItemFlag.ItemIsEditable)
            self.rules.setItem(i, 2, count)
        self._filling = False

    def _rule_edited(self, item: QTableWidgetItem) -> None:
        if self._filling or item.column() != 0 or item.row() >= len(self._rules):
            return
        self._rules[item.row()] = (item.text().strip(), self._rules[item.row()][1])
        self._changed()

    def _type_edited(self, row: int, qtype: str) -> None:
        if row < len(self._rules):
            self._rules[row] = (self._rules[row][0], qtype)
            self._changed()

    def _add_picked(self) -> None:
        layer, role, qtype = self.layer.currentData(), self.role.currentData(), self.qtype.currentText()
        if role is not None and "." in role:  # a model-wide tensor (token_embd.weight, output.weight)
            self.add_rule(global_rule(role, qtype))
        else:
            self.add_rule(layer_rule(layer, role, qtype))

    def _add_typed(self) -> None:
        if self.add_rule(self.text.text().strip()):
            self.text.clear()

    def _remove(self) -> None:
        rows = sorted({i.row() for i in self.rules.selectedIndexes()}, reverse=True) or [len(self._rules) - 1]
        for r in rows:
            if 0 <= r < len(self._rules):
                del self._rules[r]
        self._fill_rules()
        self._changed()

    def _move(self, delta: int) -> None:
        r = self.rules.currentRow()
        if 0 <= r < len(self._rules) and 0 <= r + delta < len(self._rules):
            self._rules[r], self._rules[r + delta] = self._rules[r + delta], self._rules[r]
            self._fill_rules()
            self.rules.selectRow(r + delta)
            self._changed()

    # ---- preview

    def _changed(self) -> None:
        """Plan again from the record and show what changes; errors name the rule."""
        spec = self.spec()
        self.plan = None
        if self.record is not None:
            try:
                self.plan = preview_plan(self.record, spec, getattr(self, "has_imatrix", False))
            except SettingError as exc:
                self.summary.setStyleSheet(ERROR_STYLE)
                self.summary.setText(html.escape(str(exc)))
            else:
                self.summary.setStyleSheet("")
                self.summary.setText(f"<b>Preview</b>: {plan_summary(self.plan)}")
                self.summary.setToolTip(fallback_list(self.plan.fallbacks))
            self._show_counts()
        self.preview.set_plan(self.plan, self.show_all.isChecked())
        self._enable()
        self.spec_changed.emit(spec)

    def _show_counts(self) -> None:
        """Each rule's tensor count; a rule that does not parse says why in its row."""
        parsed: list[object] = []
        for pattern, qtype in self._rules:
            try:
                parsed.append(parse_rule(f"{pattern}={qtype}"))
            except SettingError as exc:
                parsed.append(exc)
        counts = iter(rule_counts(self.record, tuple(r for r in parsed if not isinstance(r, SettingError))))
        self._filling = True
        for i, rule in enumerate(parsed):
            item = self.rules.item(i, 2)
            if item is None:
                continue
            if isinstance(rule, SettingError):
                item.setText("error")
                item.setToolTip(str(rule))
                item.setForeground(QColor("#b00020"))
                continue
            matched, decided = next(counts)
            fell = [tp for tp in (self.plan.fallbacks if self.plan is not None else ()) if tp.reason.startswith(f"rule {rule};")]
            item.setText(f"{decided}" + (f" of {matched}" if matched != decided else "")
                         + (f" · {len(fell)} fall back" if fell else ""))
            item.setForeground(QColor("#a05a00" if fell else "#000"))
            item.setToolTip(f"matches {matched} tensors; decides {decided} (the others are matched by an earlier "
                            "rule or are never quantized, e.g. norms)" + ("\n" + fallback_list(fell) if fell else ""))
        self._filling = False

    def _enable(self) -> None:
        idle = self.busy is None
        ok = self.plan is not None and self.record is not None and self.record.runnable
        self.apply.setEnabled(idle and ok and self.spec() != self.applied)
        self.save.setEnabled(idle and ok)
        self.reset.setEnabled(idle and not self.applied.empty)

    def _choose_save(self) -> None:
        if self.record is None:
            return
        src = Path(self.record.path)
        suggested = src.with_name(f"{src.stem}.{self.spec().label().replace(' + ', '+')[:60]}.gguf")
        suggested = suggested.with_name("".join(c if c.isalnum() or c in "._+-" else "_" for c in suggested.name))
        path, _ = QFileDialog.getSaveFileName(self, "Save the requantized model", str(suggested), "GGUF models (*.gguf)")
        if path:
            self.save_requested.emit(self.spec(), path if path.endswith(".gguf") else path + ".gguf")
