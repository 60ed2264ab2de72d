"""The Patching view: activation patching between a clean and a corrupted prompt, as the standard figure.

Two prompts of the same token length ("The Eiffel Tower is in the city of" / "The Colosseum is in the city of"); Run
patches the residual stream (or what attention or the FFN adds) of every layer at every position from the clean run
into the corrupted one, on the worker with progress and Cancel, and draws how much of the clean answer's logit
difference each cell restores: layers down, the clean prompt's tokens across, blue for restored, red for the
opposite. The view only shows and asks; app.controllers.patching runs the job.
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton, QVBoxLayout,
                               QWidget)

from app.records.patching import PatchRecord
from app.views.common.tokens import TokenAxis, token_label

CLEAN_DEFAULT = "The Eiffel Tower is in the city of"
CORRUPT_DEFAULT = "The Colosseum is in the city of"
KINDS = (("residual stream", "resid_pre"), ("attention output", "attn_out"), ("FFN output", "mlp_out"),
         ("each head's output", "heads"))
HELP = ("Two prompts of the same length in tokens. Run patches each layer x position of the corrupted run with the clean "
        "run's activation and shows how much of the clean answer's logit difference comes back (1 = all of it).")


def _diverging() -> pg.ColorMap:
    return pg.ColorMap([0.0, 0.5, 1.0], [(200, 40, 40), (255, 255, 255), (30, 80, 200)])


class PatchingView(QWidget):
    """Prompts, Run / Cancel with progress, the layers x positions map and its summary."""

    run_requested = Signal(str, str, str)  # (clean, corrupted, kind)
    cancel_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.record: PatchRecord | None = None
        self.clean_edit, self.corrupt_edit = QLineEdit(CLEAN_DEFAULT), QLineEdit(CORRUPT_DEFAULT)
        self.kind_box = QComboBox()
        for label, key in KINDS:
            self.kind_box.addItem(label, key)
        self.run_button, self.cancel_button = QPushButton("Run"), QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.run_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setVisible(False)
        self.info = QLabel(HELP)
        self.info.setWordWrap(True)
        self.info.setTextFormat(Qt.TextFormat.RichText)
        self.plots = pg.GraphicsLayoutWidget()
        self.plots.setBackground("w")
        self.tokens_axis = TokenAxis("bottom")
        self.plot = self.plots.addPlot(axisItems={"bottom": self.tokens_axis})
        self.plot.setLabel("left", "layer")
        self.plot.setLabel("bottom", "position (clean prompt's tokens)")
        self.plot.invertY(True)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.image = pg.ImageItem(axisOrder="row-major")
        self.plot.addItem(self.image)
        self.colorbar = pg.ColorBarItem(values=(-1, 1), colorMap=_diverging(), label="logit difference restored",
                                        interactive=False)
        self.colorbar.setImageItem(self.image, insert_in=self.plot)
        self.image.hoverEvent = self._hover
        self.plots.setVisible(False)  # shown with the first map
        self.status = QLabel("")
        form = QVBoxLayout(self)
        for label, edit in (("Clean", self.clean_edit), ("Corrupted", self.corrupt_edit)):
            row = QHBoxLayout()
            name = QLabel(label)
            name.setMinimumWidth(72)
            row.addWidget(name)
            row.addWidget(edit, 1)
            form.addLayout(row)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Patch"))
        bar.addWidget(self.kind_box)
        bar.addWidget(self.run_button)
        bar.addWidget(self.cancel_button)
        bar.addWidget(self.progress, 1)
        bar.addStretch(1)  # the buttons keep their size while the progress bar is hidden
        form.addLayout(bar)
        form.addWidget(self.info)
        form.addWidget(self.plots, 1)
        form.addWidget(self.status)
        self.run_button.clicked.connect(self._run)
        self.cancel_button.clicked.connect(self.cancel_requested.emit)

    # ---- what the controller calls

    def set_model(self, loaded: bool) -> None:
        """A model was loaded (Run is possible) or there is none; the old map goes."""
        self.run_button.setEnabled(loaded and not self.cancel_button.isEnabled())
        self.record = None
        self.image.clear()
        self.plots.setVisible(False)
        self.info.setText(HELP)

    def set_progress(self, what: str, fraction: float) -> None:
        self.progress.setVisible(True)
        self.progress.setValue(int(1000 * max(0.0, min(1.0, fraction))))
        self.progress.setFormat(f"{what} %p%")

    def set_record(self, rec: PatchRecord) -> None:
        self._idle()
        self.record = rec
        self.plots.setVisible(True)
        scores = np.nan_to_num(rec.scores, nan=0.0).astype(np.float32)
        self.image.setImage(scores, autoLevels=False, levels=(-1.0, 1.0))
        self.image.setRect(0, 0, scores.shape[1], scores.shape[0])
        heads = rec.kind == "heads"
        self.tokens_axis.set_tokens([f"h{h}" for h in range(scores.shape[1])] if heads else rec.clean_texts)
        self.plot.setLabel("bottom", "head (its output, every position)" if heads else "position (clean prompt's tokens)")
        self.plot.setRange(xRange=(0, scores.shape[1]), yRange=(0, scores.shape[0]), padding=0)
        layer, pos, best = rec.best()
        done = "" if rec.complete else " · cancelled: the cells run so far"
        where = f"head {pos}" if heads else f"at “{html.escape(token_label(rec.clean_texts[pos], 16))}”"
        self.info.setText(
            f"Answer <b>{html.escape(token_label(rec.answer, 16))}</b> vs <b>{html.escape(token_label(rec.wrong, 16))}"
            f"</b>: logit difference {rec.clean_diff:+.2f} clean, {rec.corrupt_diff:+.2f} corrupted. Most restored: "
            f"layer {layer} {where} ({best:.2f}) · {rec.elapsed_s:.1f} s{' (kept from an earlier run)' if rec.cached else ''}{done}")

    def failed(self, message: str) -> None:
        self._idle()
        self.info.setText(f"<span style='color:#b00'>{html.escape(message)}</span>")

    # ---- internals

    def _run(self) -> None:
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.set_progress("waiting", 0.0)
        self.run_requested.emit(self.clean_edit.text(), self.corrupt_edit.text(), self.kind_box.currentData())

    def _idle(self) -> None:
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        self.progress.setVisible(False)

    def _hover(self, ev) -> None:  # noqa: ANN001 - pyqtgraph's event
        rec = self.record
        if rec is None or ev.isExit():
            return
        layer, pos = int(np.floor(ev.pos().y())), int(np.floor(ev.pos().x()))
        if rec.kind == "heads" and 0 <= layer < rec.scores.shape[0] and 0 <= pos < rec.scores.shape[1]:
            self.status.setText(f"layer {layer}, head {pos}: {rec.scores[layer, pos]:.3f} restored")
        elif 0 <= layer < rec.scores.shape[0] and 0 <= pos < rec.scores.shape[1]:
            self.status.setText(f"layer {layer}, position {pos} “{token_label(rec.clean_texts[pos], 16)}” ← "
                                f"“{token_label(rec.corrupt_texts[pos], 16)}”: {rec.scores[layer, pos]:.3f} restored")
