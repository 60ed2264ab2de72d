"""The Experiments tab's interventions: switch heads off, steer with a control vector, add a LoRA adapter.

What is set applies to the chat's model from the next reply on (the reply's signature names it, a banner says it is
on, Clear all removes it in one click). After Apply the panel shows what it does to the chat so far: the next-token
distribution at the last position before and after, and the KL divergence at every position of the chat. The view
only shows and asks; app.controllers.experiments runs the job.
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QDoubleSpinBox, QFileDialog, QGridLayout, QGroupBox, QHBoxLayout, QLabel, QLineEdit,
                               QPushButton, QSlider, QVBoxLayout, QWidget)

from app.records.interventions import InterventionRecord, InterventionSpec
from app.views.common.tokens import token_label

HELP = ("Heads as LAYER:HEAD, comma separated (3:4, 10:1); a control vector or LoRA adapter in llama.cpp's GGUF format. "
        "Apply sets them on the chat's model for the next replies.")


class _FileRow(QWidget):
    """A path field, Browse…, and a scale (a slider for the control vector's strength, a spin box for LoRA)."""

    def __init__(self, what: str, slider: bool, parent: QWidget | None = None):
        super().__init__(parent)
        self.what = what
        self.path = QLineEdit()
        self.path.setPlaceholderText(f"{what} file (.gguf)")
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.scale = QDoubleSpinBox()
        self.scale.setRange(-8.0, 8.0)
        self.scale.setSingleStep(0.1)
        self.scale.setValue(1.0)
        self.scale.setPrefix("× ")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.path, 1)
        lay.addWidget(browse)
        self.slider: QSlider | None = None
        if slider:  # strength -4..4 in steps of 0.05, kept in step with the spin box
            self.slider = QSlider(Qt.Orientation.Horizontal)
            self.slider.setRange(-80, 80)
            self.slider.setValue(20)
            self.slider.setMinimumWidth(90)
            self.slider.valueChanged.connect(lambda v: self.scale.setValue(v / 20))
            self.scale.valueChanged.connect(lambda v: self.slider.setValue(round(v * 20)))
            lay.addWidget(self.slider)
        lay.addWidget(self.scale)

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, f"Open a {self.what}", "", "GGUF files (*.gguf);;All files (*)")
        if path:
            self.path.setText(path)


class InterventionsPanel(QGroupBox):
    """Heads to ablate, a control vector, a LoRA adapter; Apply, Clear all; the effect on the chat."""

    apply_requested = Signal(object)  # InterventionSpec (empty: clear all)

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Interventions on the chat's model", parent)
        self.heads = QLineEdit()
        self.heads.setPlaceholderText("e.g. 3:4, 10:1")
        self.cvec = _FileRow("control vector", slider=True)
        self.lora = _FileRow("LoRA adapter", slider=False)
        self.apply_button, self.clear_button = QPushButton("Apply"), QPushButton("Clear all")
        self.apply_button.setEnabled(False)
        self.clear_button.setEnabled(False)
        self.active = QLabel("Nothing is set: the model runs as its file says.")
        self.active.setWordWrap(True)
        self.effect = QLabel(HELP)
        self.effect.setWordWrap(True)
        self.effect.setTextFormat(Qt.TextFormat.RichText)
        self.kld_plot = pg.PlotWidget(background="w")
        self.kld_plot.setLabel("left", "KLD")
        self.kld_plot.setLabel("bottom", "chat position")
        self.kld_plot.setMaximumHeight(120)
        self.kld_plot.setMenuEnabled(False)
        self.kld_plot.hideButtons()
        self.kld_curve = self.kld_plot.plot(pen=pg.mkPen((40, 80, 200), width=1.5))
        self.kld_plot.setVisible(False)  # shown with a measured effect
        grid = QGridLayout()
        for row, (label, widget) in enumerate((("Ablate heads", self.heads), ("Control vector", self.cvec),
                                               ("LoRA adapter", self.lora))):
            grid.addWidget(QLabel(label), row, 0)
            grid.addWidget(widget, row, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.clear_button)
        buttons.addWidget(self.active, 1)
        lay = QVBoxLayout(self)
        lay.addLayout(grid)
        lay.addLayout(buttons)
        lay.addWidget(self.effect)
        lay.addWidget(self.kld_plot)
        self.apply_button.clicked.connect(lambda: self._ask(self.spec()))
        self.clear_button.clicked.connect(lambda: self._ask(InterventionSpec()))

    def spec(self) -> InterventionSpec:
        return InterventionSpec(self.heads.text(), self.cvec.path.text().strip(), self.cvec.scale.value(),
                                self.lora.path.text().strip(), self.lora.scale.value())

    def set_model(self, loaded: bool) -> None:
        """A new model (or none): nothing is set on it."""
        self.apply_button.setEnabled(loaded)
        self.clear_button.setEnabled(False)
        self.active.setText("Nothing is set: the model runs as its file says.")
        self.effect.setText(HELP)
        self.kld_curve.setData([], [])
        self.kld_plot.setVisible(False)

    def set_record(self, rec: InterventionRecord) -> None:
        self.apply_button.setEnabled(True)
        self.clear_button.setEnabled(bool(rec.description))
        self.active.setText(f"On: {rec.description}" if rec.description else "Nothing is set: the model runs as its "
                            "file says.")
        if not rec.description or not rec.token_texts:
            self.effect.setText(HELP if not rec.description else "Set. Send a message: the chat's tokens show the effect.")
            self.kld_curve.setData([], [])
            self.kld_plot.setVisible(False)
            return
        pairs = lambda top: ", ".join(f"{html.escape(token_label(t, 12))} {p:.2f}" for t, p in top)  # noqa: E731
        worst = int(np.argmax(rec.kld))
        self.effect.setText(
            f"Next token after the chat, before: {pairs(rec.top_before)}<br>after: {pairs(rec.top_after)}<br>"
            f"KLD over the chat's {len(rec.token_texts)} positions: mean {rec.mean_kld:.4f}, most at "
            f"“{html.escape(token_label(rec.token_texts[worst], 16))}” ({rec.kld[worst]:.3f}) · {rec.elapsed_s:.1f} s")
        self.kld_curve.setData(np.arange(len(rec.kld)), rec.kld)
        self.kld_plot.setVisible(True)

    def failed(self, message: str) -> None:
        self.apply_button.setEnabled(True)
        self.effect.setText(f"<span style='color:#b00'>{html.escape(message)}</span> Nothing was changed.")

    def _ask(self, spec: InterventionSpec) -> None:
        self.apply_button.setEnabled(False)
        self.effect.setText("Applying…")
        self.apply_requested.emit(spec)
