"""The Experiments tab's interventions: switch heads, layers or experts off, steer with a control vector, add a LoRA
adapter.

What is set applies to the chat's model from the next reply on (the reply's signature names it, a banner says it is
on, Clear all removes it in one click). After Apply (or Clear all) the panel shows what the change did to the chat
(app.views.intervention_effect): the next token after the chat before and after, their KLD, whether the top token
changed, the KLD at every position. Regenerate last reply makes the chat's last reply again with what is set, a new
version beside the earlier ones. The view only shows and asks; app.controllers.experiments runs the job.
"""
from __future__ import annotations

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtWidgets import (QComboBox, QDoubleSpinBox, QGridLayout, QGroupBox, QHBoxLayout, QLabel,
                               QLineEdit, QPushButton, QSlider, QVBoxLayout, QWidget)

from app.records.interventions import InterventionRecord, InterventionSpec
from app.views.common.dialogs import open_file
from app.views.intervention_effect import EffectView

HELP = ("Heads as LAYER:HEAD, comma separated (3:4, 10:1), zeroed or replaced by their mean over the chat; layers "
        "whose attention or FFN output is left out (2, 5); experts the router may not choose (LAYER:EXPERT); a control "
        "vector or LoRA adapter in llama.cpp's GGUF format. Apply sets them on the chat's model for the next replies.")


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
        self.scale.setKeyboardTracking(False)  # a value when typing ends (Enter, focus out), not per keystroke
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
            self.slider.valueChanged.connect(self._from_slider)
            self.scale.valueChanged.connect(self._from_box)
            lay.addWidget(self.slider)
        lay.addWidget(self.scale)

    def _from_slider(self, v: int) -> None:
        """The box follows the slider (without echoing back: the box keeps a finer value than the slider's steps)."""
        if round(self.scale.value() * 20) != v:
            blocker = QSignalBlocker(self.scale)
            self.scale.setValue(v / 20)
            del blocker

    def _from_box(self, v: float) -> None:
        """The slider follows the box, to its nearest step, and sends nothing back."""
        if self.slider is not None:
            blocker = QSignalBlocker(self.slider)
            self.slider.setValue(round(v * 20))
            del blocker

    def _browse(self) -> None:
        path = open_file(self, f"Open a {self.what}", "GGUF files (*.gguf);;All files (*)")
        if path:
            self.path.setText(path)


def _field(placeholder: str, tip: str) -> QLineEdit:
    edit = QLineEdit()
    edit.setPlaceholderText(placeholder)
    edit.setToolTip(tip)
    return edit


class _Row(QWidget):
    """Widgets side by side, the first ones stretching."""

    def __init__(self, *widgets: QWidget, stretch: int = 1):
        super().__init__()
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        for i, w in enumerate(widgets):
            lay.addWidget(w, 1 if i < stretch else 0)


class InterventionsPanel(QGroupBox):
    """Heads, layers' attention or FFN and experts to ablate, a control vector, a LoRA adapter; Apply, Clear all,
    Regenerate the last reply with them; the effect on the chat."""

    apply_requested = Signal(object)  # InterventionSpec (empty: clear all)
    regenerate_requested = Signal()  # the chat's last reply again, made with what is set
    stop_requested = Signal()  # stop measuring the effect (what was asked is set all the same)

    def __init__(self, parent: QWidget | None = None):
        super().__init__("Interventions on the chat's model", parent)
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)  # holds the focus while Apply or Clear all is disabled
        self._refocus: QPushButton | None = None  # the button that had the focus when it was pressed
        self.record: InterventionRecord | None = None  # the last Apply's (or Clear's) record shown
        self.heads = _field("e.g. 3:4, 10:1", "Heads to switch off, LAYER:HEAD")
        self.head_mode = QComboBox()
        self.head_mode.addItems(["zeroed", "mean over the chat"])
        self.head_mode.setToolTip("Zeroed: the head outputs nothing. Mean: the head outputs, at every position, its "
                                  "average output over the chat so far (taken on the model without the ablation)")
        self.attn_layers = _field("attention of layers, e.g. 2, 5", "Layers whose attention output is left out")
        self.ffn_layers = _field("FFN of layers, e.g. 7", "Layers whose FFN output is left out")
        self.experts = _field("e.g. 9:12", "Experts the router may not choose, LAYER:EXPERT (Mixture-of-Experts models)")
        self.set_experts(0)
        self.cvec = _FileRow("control vector", slider=True)
        self.lora = _FileRow("LoRA adapter", slider=False)
        self.apply_button, self.clear_button = QPushButton("Apply"), QPushButton("Clear all")
        self.regen_button = QPushButton("Regenerate last reply")
        self.regen_button.setToolTip("A new version of the chat's last reply, made with what is set (Ctrl+R)")
        for b in (self.apply_button, self.clear_button, self.regen_button):
            b.setEnabled(False)
        self.active = QLabel("Nothing is set: the model runs as its file says.")
        self.active.setWordWrap(True)
        self.effect_view = EffectView(HELP)
        self.effect_view.stop_requested.connect(self.stop_requested)
        self.effect, self.kld_plot = self.effect_view.text, self.effect_view.plot
        grid = QGridLayout()
        rows = (("Ablate heads", _Row(self.heads, self.head_mode)),
                ("Ablate layers", _Row(self.attn_layers, self.ffn_layers, stretch=2)),
                ("Ablate experts", self.experts), ("Control vector", self.cvec), ("LoRA adapter", self.lora))
        for row, (label, widget) in enumerate(rows):
            grid.addWidget(QLabel(label), row, 0)
            grid.addWidget(widget, row, 1)
        buttons = QHBoxLayout()
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.clear_button)
        buttons.addWidget(self.regen_button)
        buttons.addWidget(self.active, 1)
        lay = QVBoxLayout(self)
        lay.addLayout(grid)
        lay.addLayout(buttons)
        lay.addWidget(self.effect_view)
        lay.addStretch(1)  # the rows stay together at the top while no effect is shown
        self.apply_button.clicked.connect(lambda: self._ask(self.spec()))
        self.clear_button.clicked.connect(self._clear_all)
        self.regen_button.clicked.connect(self.regenerate_requested)

    def spec(self) -> InterventionSpec:
        return InterventionSpec(self.heads.text(), self.cvec.path.text().strip(), self.cvec.scale.value(),
                                self.lora.path.text().strip(), self.lora.scale.value(),
                                self.head_mode.currentIndex() == 1, self.attn_layers.text(), self.ffn_layers.text(),
                                self.experts.text() if self.experts.isEnabled() else "")

    def set_experts(self, n_expert: int) -> None:
        """Expert ablation only where the model has experts."""
        self.experts.setEnabled(n_expert > 0)
        self.experts.setPlaceholderText(f"e.g. 9:12 (experts 0-{n_expert - 1})" if n_expert else
                                        "the model has no experts (a dense model)")

    def _clear_all(self) -> None:
        """Clear all: the heads, layers and experts typed go with what they set (the files stay, to apply again)."""
        self.forget(files=False)
        self._ask(InterventionSpec())

    def forget(self, files: bool = True) -> None:
        """Empty the fields that name parts of a model (and the adapter files, which are made for one model)."""
        for field in (self.heads, self.attn_layers, self.ffn_layers, self.experts):
            field.clear()
        if files:
            self.cvec.path.clear()
            self.lora.path.clear()

    def set_model(self, loaded: bool) -> None:
        """A new model (or none): nothing is set on it, and no field names a head or file of the model before."""
        self.forget()
        self.apply_button.setEnabled(loaded)
        self.clear_button.setEnabled(False)
        self.regen_button.setEnabled(False)
        self.record = None
        self.active.setText("Nothing is set: the model runs as its file says.")
        self.effect_view.busy(False)
        self.effect_view.show_text(HELP)

    def set_can_regenerate(self, can: bool) -> None:
        """Whether the chat on screen has a last turn to answer again (and no reply is being made)."""
        self.regen_button.setEnabled(can)

    def started(self) -> None:
        """An Apply or Clear all runs: no second one meanwhile; its measurement shows progress and Stop."""
        self.apply_button.setEnabled(False)
        self.effect.setText("Applying…")
        self.effect_view.busy(True)

    def set_progress(self, what: str, fraction: float) -> None:
        self.effect_view.set_progress(what, fraction)

    def set_record(self, rec: InterventionRecord) -> None:
        self.record = rec
        self.apply_button.setEnabled(True)
        self.clear_button.setEnabled(bool(rec.description))
        self.effect_view.busy(False)
        self._give_back_focus()
        self.active.setText(f"On: {rec.description}" if rec.description else "Nothing is set: the model runs as its "
                            "file says.")
        if rec.measured:
            self.effect_view.show_record(rec)
        elif rec.note:
            done = "Set" if rec.description else "Cleared"
            self.effect_view.show_text(f"{done}. The effect is not shown: {rec.note}.")
        elif not rec.token_texts:
            self.effect_view.show_text("Set. Send a message: the chat's tokens show the effect." if rec.description
                                       else HELP)
        else:
            self.effect_view.show_text(HELP)

    def failed(self, message: str) -> None:
        self.apply_button.setEnabled(True)
        self._give_back_focus()
        self.effect_view.show_failure(message)

    def _give_back_focus(self) -> None:
        """The focus back on the button pressed (disabling it had moved it to the panel, not to the next field)."""
        button, self._refocus = self._refocus, None
        if button is not None and button.isEnabled() and self.hasFocus():
            button.setFocus(Qt.FocusReason.OtherFocusReason)

    def _ask(self, spec: InterventionSpec) -> None:
        pressed = next((b for b in (self.apply_button, self.clear_button) if b.hasFocus()), None)
        if pressed is not None:  # a disabled button passes its focus to the next field (patching's): keep it here
            self._refocus = pressed
            self.setFocus(Qt.FocusReason.OtherFocusReason)
        self.started()
        self.apply_requested.emit(spec)
