"""One cell of the patching map patched alone, drawn as the Experiments tab's effect is (app.views.intervention_effect):
the corrupted prompt's next token before (the corrupted run) and after (that one cell taken from the clean run), their
KLD, whether the top token changed, the top 5 of each with their probabilities, and the KLD at every corrupted
position; an outline marks the cell on the map. Draws PatchEffects of the map on screen only."""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QWidget

from app.records.patching import PatchEffect, PatchRecord
from app.views.common.tokens import token_label
from app.views.intervention_effect import EffectView, kld_line, next_token_html

HELP = ("Click a cell of the map: what patching that cell alone does to the corrupted prompt's next token shows here "
        "(the cell that restores the most is shown after each run).")


def cell_words(rec: PatchRecord, layer: int, cell: int) -> str:
    """"layer 5, head 3" or "layer 5, position 2 “ iffel” ← “osse”" (the clean token's activation in for the
    corrupted one's), plain text."""
    if rec.kind == "heads":
        return f"layer {layer}, head {cell}"
    return (f"layer {layer}, position {cell} “{token_label(rec.clean_texts[cell], 16)}” ← "
            f"“{token_label(rec.corrupt_texts[cell], 16)}”")


def effect_html(rec: PatchRecord, eff: PatchEffect) -> str:
    """The cell's effect as rich text."""
    restored = float(rec.scores[eff.layer, eff.cell])
    return (f"Patching {html.escape(cell_words(rec, eff.layer, eff.cell))} alone (restores {restored:.2f}): the "
            f"corrupted prompt's next token before → after<br>"
            f"{next_token_html(eff.next_kld, eff.top_before, eff.top_after)}<br>"
            f"{kld_line(eff.kld, eff.token_texts, 'the corrupted prompt')} · {eff.elapsed_s:.1f} s")


class CellEffectView(EffectView):
    """The selected cell's effect; progress and Stop while it is measured. Words only: beside the map there is no room
    for the KLD curve (its mean and peak are said)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(HELP, parent, stop_tip="Stop measuring this cell's effect (the map stays)", positions=None,
                         refused="")
        self.layout().addStretch(1)  # the text stays at the top beside a tall map

    def show_cell(self, rec: PatchRecord, eff: PatchEffect) -> None:
        self.show_effect(effect_html(rec, eff), eff.kld)


def scrolled(effect: CellEffectView) -> QScrollArea:
    """The effect in a scroll area without a frame: its words scroll where the tab is too short for them."""
    area = QScrollArea()
    area.setWidget(effect)
    area.setWidgetResizable(True)
    area.setFrameShape(QFrame.Shape.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)  # the words wrap
    for filled in (effect, area.viewport()):  # the words sit on the tab's own background (setWidget fills it)
        filled.setAutoFillBackground(False)
    return area


class CellBox(pg.PlotCurveItem):
    """The outline of the selected cell, in the map's (cell, layer) coordinates."""

    def __init__(self):
        super().__init__(pen=pg.mkPen((20, 20, 20), width=2.5))
        self.setZValue(10)  # above the image
        self.setVisible(False)

    def show_at(self, layer: int, cell: int) -> None:
        self.setData(np.array([cell, cell + 1, cell + 1, cell, cell], np.float64),
                     np.array([layer, layer, layer + 1, layer + 1, layer], np.float64))
        self.setVisible(True)
