"""The Patching view: activation patching between a clean and a corrupted prompt, as the standard figure.

Two prompts of the same token length ("The Eiffel Tower is in the city of" / "The Colosseum is in the city of"); Run
patches the residual stream (or what attention or the FFN adds) of every layer at every position from the clean run
into the corrupted one, on the worker with progress and Cancel, and draws how much of the clean answer's logit
difference each cell restores: layers down, the clean prompt's tokens across, blue for restored, red for the
opposite. A click on a cell (after a run: the cell that restores the most) shows what patching that cell alone does to
the corrupted prompt's next token (app.views.patching_effect). The view only shows and asks; app.controllers.patching
runs the jobs.
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QComboBox, QHBoxLayout, QLabel, QLineEdit, QProgressBar, QPushButton, QVBoxLayout,
                               QWidget)

from app.records.patching import PatchEffect, PatchRecord
from app.views.common.tokens import TokenAxis, token_label
from app.views.patching_effect import HELP as CELL_HELP
from app.views.patching_effect import CellBox, CellEffectView, cell_words, scrolled

CLEAN_DEFAULT = "The Eiffel Tower is in the city of"
CORRUPT_DEFAULT = "The Colosseum is in the city of"
KINDS = (("residual stream", "resid_pre"), ("attention output", "attn_out"), ("FFN output", "mlp_out"),
         ("each head's output", "heads"))
HELP = ("Two prompts of the same length in tokens. Run patches each layer x position of the corrupted run with the clean "
        "run's activation and shows how much of the clean answer's logit difference comes back (1 = all of it).")


def _diverging() -> pg.ColorMap:
    return pg.ColorMap([0.0, 0.5, 1.0], [(200, 40, 40), (255, 255, 255), (30, 80, 200)])


class PatchingView(QWidget):
    """Prompts, Run / Cancel with progress, the layers x positions map and its summary, the selected cell's effect."""

    run_requested = Signal(str, str, str)  # (clean, corrupted, kind)
    cancel_requested = Signal()
    effect_requested = Signal(str, str, str, int, int)  # (clean, corrupted, kind, layer, cell) of the map shown
    effect_stop_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.record: PatchRecord | None = None
        self.selected: tuple[int, int] | None = None  # the (layer, cell) whose effect is shown or asked for
        self.effect_record: PatchEffect | None = None
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
        self.image.mouseClickEvent = self._click
        self.box = CellBox()
        self.plot.addItem(self.box)
        self.plots.setVisible(False)  # shown with the first map
        self.effect = CellEffectView()
        self.effect.stop_requested.connect(self.effect_stop_requested)
        self.effect_area = scrolled(self.effect)
        self.effect_area.setVisible(False)  # shown with the map
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
        body = QHBoxLayout()
        body.addWidget(self.plots, 1)
        body.addWidget(self.effect_area, 1)
        form.addLayout(body, 1)
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
        self._clear_effect()
        self.effect_area.setVisible(False)

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
        self._clear_effect()
        self.effect_area.setVisible(True)
        if np.isfinite(best):
            self.select_cell(layer, pos)

    def select_cell(self, layer: int, cell: int) -> bool:
        """Outline the map's cell and ask for its effect; False (nothing asked) while a map is made, or for a cell
        outside the map or not run."""
        rec = self.record
        if rec is None:
            return False
        if self.cancel_button.isEnabled():
            self.status.setText("a map is being made: click a cell when it is done")
            return False
        if not (0 <= layer < rec.scores.shape[0] and 0 <= cell < rec.scores.shape[1]
                and np.isfinite(rec.scores[layer, cell])):
            return False
        self.selected, self.effect_record = (layer, cell), None
        self.box.show_at(layer, cell)
        self.effect.show_text(f"Measuring {html.escape(cell_words(rec, layer, cell))}…")
        self.effect.busy(True)
        self.effect_requested.emit(rec.prompts[0], rec.prompts[1], rec.kind, layer, cell)
        return True

    def set_effect(self, eff: PatchEffect) -> None:
        """A cell's effect, shown if it is of the selected cell of the map on screen (an older answer is dropped)."""
        rec = self.record
        if rec is None or self.selected is None or eff.where != (rec.prompts, rec.kind, *self.selected):
            return
        self.effect_record = eff
        self.effect.busy(False)
        self.effect.show_cell(rec, eff)

    def set_effect_progress(self, what: str, fraction: float) -> None:
        self.effect.set_progress(what, fraction)

    def effect_failed(self, message: str) -> None:
        """The cell's effect could not be measured: the reason, and how to ask again; the map stays."""
        self.effect.show_text(CELL_HELP)
        self.effect.show_failure(message)

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

    def _clear_effect(self) -> None:
        self.selected, self.effect_record = None, None
        self.box.setVisible(False)
        self.effect.busy(False)
        self.effect.show_text(CELL_HELP)

    def _hover(self, ev) -> None:  # noqa: ANN001 - pyqtgraph's event
        rec = self.record
        if rec is None or ev.isExit():
            return
        layer, pos = int(np.floor(ev.pos().y())), int(np.floor(ev.pos().x()))
        if 0 <= layer < rec.scores.shape[0] and 0 <= pos < rec.scores.shape[1]:
            self.status.setText(f"{cell_words(rec, layer, pos)}: {rec.scores[layer, pos]:.3f} restored · click: its "
                                "effect")

    def _click(self, ev) -> None:  # noqa: ANN001 - pyqtgraph's event
        if ev.button() != Qt.MouseButton.LeftButton:
            return
        ev.accept()
        self.select_cell(int(np.floor(ev.pos().y())), int(np.floor(ev.pos().x())))
