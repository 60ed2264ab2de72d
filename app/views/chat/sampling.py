"""The sampling panel: one control per setting, bound to AppState.settings, with a reset to defaults."""
from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractSpinBox, QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QLabel, QPushButton, QSpinBox, QVBoxLayout,
    QWidget,
)

from app.data.store import OVERFLOW_POLICIES, Settings
from app.records.kv import (
    BACKEND_KEY,
    BACKENDS,
    CACHE_TYPES,
    NUMERICS,
    NUMERICS_KEY,
    SETTING_KEY,
    backend_setting,
    cache_type_setting,
    numerics_setting,
)
from app.state import AppState
from engine.chat.reasoning import EFFORTS

# (field, label, kind, minimum, maximum, step, decimals, tooltip)
CONTROLS = (
    ("temperature", "Temperature", "float", 0.0, 5.0, 0.05, 2, "0 = always the most likely token"),
    ("top_k", "Top-k", "int", 0, 1000, 1, 0, "keep the k most likely tokens (0 = off)"),
    ("top_p", "Top-p", "float", 0.01, 1.0, 0.01, 2, "keep the most likely tokens up to this total probability (1 = off)"),
    ("min_p", "Min-p", "float", 0.0, 1.0, 0.01, 2, "drop tokens below this fraction of the top token's probability"),
    ("repeat_penalty", "Repeat penalty", "float", 0.5, 3.0, 0.05, 2, "penalise tokens of the last 64 (1 = off)"),
    ("max_tokens", "Max tokens", "int", 1, 32768, 16, 0, "longest reply"),
    ("seed", "Seed", "int", -1, 2**31 - 1, 1, 0, "-1 = a new random seed for every reply"),
    ("context_limit", "Context limit", "int", 256, 131072, 256, 0,
     "the KV cache never grows past this (or the model's own context, if smaller)"),
)


POLICY_LABELS = {"refuse": "Refuse", "drop_oldest": "Drop oldest turns"}  # short: the dock stays narrow


class SamplingPanel(QWidget):
    """Edits the sampling settings; every change replaces AppState.settings with a new record."""

    def __init__(self, state: AppState, parent: QWidget | None = None):
        super().__init__(parent)
        self.state = state
        self.controls: dict[str, QSpinBox | QDoubleSpinBox] = {}
        lay = QVBoxLayout(self)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        for name, label, kind, lo, hi, step, decimals, tip in CONTROLS:
            box: QSpinBox | QDoubleSpinBox
            if kind == "float":
                box = QDoubleSpinBox()
                box.setDecimals(decimals)
            else:
                box = QSpinBox()
            box.setRange(lo, hi)
            box.setSingleStep(step)
            box.setToolTip(tip)
            box.setKeyboardTracking(False)
            box.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
            if name == "seed":
                box.setSpecialValueText("random")
            box.valueChanged.connect(lambda value, n=name: self._set(n, value))
            self.controls[name] = box
            form.addRow(label, box)
        self.policy = QComboBox()
        for key, text in OVERFLOW_POLICIES.items():
            self.policy.addItem(POLICY_LABELS.get(key, text), key)
            self.policy.setItemData(self.policy.count() - 1, text, Qt.ItemDataRole.ToolTipRole)
        self.policy.setToolTip("What happens when the conversation no longer fits the context: "
                               + "; ".join(OVERFLOW_POLICIES.values()))
        self.policy.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)  # never cut ("Refuse with a messag")
        self.policy.currentIndexChanged.connect(lambda _i: self._set("overflow_policy", self.policy.currentData()))
        form.addRow("Context full", self.policy)
        self.cache_type = QComboBox()
        for name in CACHE_TYPES:
            self.cache_type.addItem(name, name)
        self.cache_type.setToolTip("How the KV cache holds keys and values, as llama.cpp's --cache-type-k/v: F32, F16, "
                                   "or Q8_0 / Q4_0 blocks (quantized when written). The next reply starts a fresh "
                                   "cache of this type.")
        self.cache_type.currentIndexChanged.connect(lambda _i: self._set_cache_type(self.cache_type.currentData()))
        form.addRow("KV cache type", self.cache_type)
        self.backend = QComboBox()
        for name in BACKENDS:
            self.backend.addItem(name, name)
        self.backend.setToolTip("Where the model runs, used when a model is loaded next: auto takes the GPU (CuPy) "
                                "when one answers, else NumPy on the CPU and says why in the Model lens.")
        self.backend.currentIndexChanged.connect(lambda _i: self._set_extra(BACKEND_KEY, self.backend.currentData()))
        form.addRow("Backend (next load)", self.backend)
        self.numerics = QComboBox()
        for name in NUMERICS:
            self.numerics.addItem(name, name)
        self.numerics.setToolTip("How the next loaded model computes. ggml: on the GGUF blocks with 8-bit activations, "
                                 "as llama.cpp does (the default, and no float32 copy of the weights); float32: "
                                 "dequantized weights and float32 activations, the textbook reference.")
        self.numerics.currentIndexChanged.connect(lambda _i: self._set_extra(NUMERICS_KEY, self.numerics.currentData()))
        form.addRow("Numerics (next load)", self.numerics)
        self.thinking = QCheckBox("think before answering")
        self.thinking.setToolTip("The chat template's enable_thinking (Qwen3, Gemma 4 and kin): on, the model thinks "
                                 "first (templates that do not by default are asked to); off, it answers without "
                                 "thinking")
        self.thinking.toggled.connect(lambda on: self._set("enable_thinking", bool(on)))
        form.addRow("Thinking", self.thinking)
        self.effort = QComboBox()
        for name in EFFORTS:
            self.effort.addItem(name, name)
        self.effort.setToolTip("The chat template's reasoning_effort (gpt-oss): how long the model reasons")
        self.effort.currentIndexChanged.connect(lambda _i: self._set("reasoning_effort", self.effort.currentData()))
        form.addRow("Reasoning effort", self.effort)
        self.form = form
        self.set_switches(())
        lay.addLayout(form)
        self.model_ctx = QLabel("")
        self.model_ctx.setTextFormat(Qt.TextFormat.PlainText)
        self.model_ctx.setStyleSheet("color: #777;")
        self.model_ctx.setWordWrap(True)
        lay.addWidget(self.model_ctx)
        reset = QPushButton("Reset to defaults")
        reset.clicked.connect(self.reset)
        lay.addWidget(reset, 0, Qt.AlignmentFlag.AlignLeft)
        lay.addStretch(1)
        state.settings_changed.connect(self.show_settings)
        state.ctx_size_changed.connect(lambda _n: self._show_ctx())
        if state.settings is not None:
            self.show_settings(state.settings)

    def _show_ctx(self) -> None:
        """What the cache holds, and why that is less than the limit above when the model's own context is."""
        n = int(self.state.ctx_size or 0)
        limit = self.controls["context_limit"].value()
        if not n:
            self.model_ctx.setText("")
        elif n < limit:
            self.model_ctx.setText(f"This model's own context is {n:,} tokens: the KV cache holds up to {n:,}, "
                                   f"less than the limit above.")
        else:
            self.model_ctx.setText(f"The KV cache now holds up to {n:,} tokens.")

    def set_switches(self, names: tuple[str, ...]) -> None:
        """Show the reasoning switches the loaded model's chat template reads, and only those."""
        self.form.setRowVisible(self.thinking, "enable_thinking" in names)
        self.form.setRowVisible(self.effort, "reasoning_effort" in names)

    def show_settings(self, s: Settings) -> None:
        """Put a Settings record into the controls without echoing changes back."""
        self.thinking.blockSignals(True)
        self.thinking.setChecked(s.enable_thinking)
        self.thinking.blockSignals(False)
        self.effort.blockSignals(True)
        self.effort.setCurrentIndex(max(0, self.effort.findData(s.reasoning_effort)))
        self.effort.blockSignals(False)
        for name, box in self.controls.items():
            box.blockSignals(True)
            box.setValue(getattr(s, name))
            box.blockSignals(False)
        self.policy.blockSignals(True)
        self.policy.setCurrentIndex(max(0, self.policy.findData(s.overflow_policy)))
        self.policy.blockSignals(False)
        self.cache_type.blockSignals(True)
        self.cache_type.setCurrentIndex(max(0, self.cache_type.findData(cache_type_setting(s))))
        self.cache_type.blockSignals(False)
        self.backend.blockSignals(True)
        self.backend.setCurrentIndex(max(0, self.backend.findData(backend_setting(s))))
        self.backend.blockSignals(False)
        self.numerics.blockSignals(True)
        self.numerics.setCurrentIndex(max(0, self.numerics.findData(numerics_setting(s))))
        self.numerics.blockSignals(False)
        self._show_ctx()

    def _set(self, name: str, value: object) -> None:
        current = self.state.settings or Settings()
        if isinstance(getattr(current, name), int) and not isinstance(value, (str, bool)):
            value = int(value) if not isinstance(getattr(current, name), float) else float(value)
        if isinstance(getattr(current, name), float):
            value = float(value)
        self.state.settings = dataclasses.replace(current, **{name: value})

    def _set_cache_type(self, name: object) -> None:
        self._set_extra(SETTING_KEY, name)

    def _set_extra(self, key: str, value: object) -> None:
        current = self.state.settings or Settings()
        self.state.settings = dataclasses.replace(current, extra={**current.extra, key: str(value)})

    def reset(self) -> None:
        """Sampling back to defaults; what is not sampling (last model, window) is kept."""
        current = self.state.settings or Settings()
        defaults = Settings()
        keep = {f: getattr(current, f) for f in ("last_model", "current_chat", "geometry", "window_state", "extra")}
        keep["extra"] = {k: v for k, v in current.extra.items() if k != SETTING_KEY}  # the cache type goes back to F32
        self.state.settings = dataclasses.replace(defaults, **keep)
