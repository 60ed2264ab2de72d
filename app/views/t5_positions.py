"""The Positions lens of a T5 model: the third positional scheme beside the sinusoid and RoPE.

T5 adds no position to the embeddings and rotates nothing: each attention adds a learned bias per head to its scores,
looked up by the *bucket* of the distance between key and query (exact buckets for short distances, log-spaced ones
up to 128, one bucket beyond). The encoder's buckets are bidirectional (keys before and after the query), the
decoder's causal. Drawn here: the bias each head adds against distance, for the encoder and the decoder, and which
bucket each distance falls in. The tables come from engine.observe.t5_maps (the first layer's, which every layer
shares in llama.cpp's t5 graph).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QWidget

from app.views.common.flow import FillLayout, FlowBox

from engine.observe.t5_maps import PositionTable, T5PositionTables

HEAD_COLOURS = ((0, 114, 178), (213, 94, 0), (0, 158, 115), (204, 121, 167), (230, 159, 0), (86, 180, 233),
                (240, 228, 66), (0, 0, 0))  # Okabe-Ito


class T5PositionsPanel(QWidget):
    """Bias against distance per head (encoder, decoder) and the bucket of each distance."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        widgets = [pg.PlotWidget(background="w") for _ in range(3)]
        for w in widgets:  # stacked in a 1366x768 window's pane, the three fit its height: it never scrolls
            w.setMinimumSize(240, 160)
        self.enc, self.dec, self.buckets = (w.getPlotItem() for w in widgets)
        for p, title in ((self.enc, "Encoder: bias by distance (bidirectional)"),
                         (self.dec, "Decoder: bias by distance (causal)"), (self.buckets, "Bucket of each distance")):
            p.setTitle(title, size="9pt")
        self.plots = FlowBox(widgets, min_width=300, stretches=[1, 1, 1])  # side by side when wide, stacked when not
        for p, left in ((self.enc, "bias added to the score"), (self.dec, "bias added to the score"),
                        (self.buckets, "bucket")):
            p.setLabel("left", left)
            p.setLabel("bottom", "distance (key − query)")
            p.showGrid(x=True, y=True, alpha=0.2)
            p.setMenuEnabled(False)
            p.hideButtons()
        self.enc_legend = self.enc.addLegend(offset=(-5, 5), labelTextSize="8pt")
        self.note = QLabel("")
        self.note.setWordWrap(True)
        self.note.setTextFormat(Qt.TextFormat.PlainText)
        lay = FillLayout(self)  # the word-wrapped note must not make the lens's scroll area as tall as every plot
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.note)
        lay.addWidget(self.plots, 1)
        self.tables: T5PositionTables | None = None

    def set_tables(self, tables: T5PositionTables) -> None:
        self.tables = tables
        for plot in (self.enc, self.dec, self.buckets):
            plot.clear()
        self.enc_legend.clear()
        self._curves(self.enc, tables.encoder, legend=True)
        self._curves(self.dec, tables.decoder, legend=False)
        for table, colour, name in ((tables.encoder, (0, 114, 178), "encoder"), (tables.decoder, (213, 94, 0), "decoder")):
            self.buckets.plot(table.distance, table.bucket, pen=pg.mkPen(colour, width=2), stepMode=None, name=name)
        enc, dec = tables.encoder, tables.decoder
        exact = tables.n_buckets // 4  # the bidirectional half's exact buckets (max_exact = n / 2 / 2)
        self.note.setText(
            f"T5: no positional encoding is added and nothing rotates. Each head adds a learned bias to its attention "
            f"scores, chosen by the bucket of the distance: {tables.n_buckets} buckets, one per distance up to "
            f"{exact} (encoder) or {tables.n_buckets // 2} (decoder), then log-spaced up to 128, one beyond. "
            f"The encoder's buckets tell keys after the query from keys before it (distances −{int(-enc.distance.min())}"
            f"…+{int(enc.distance.max())} drawn); the decoder only sees keys before (−{int(-dec.distance.min())}…0). "
            "Layer 0's table is shared by every layer, as in llama.cpp's graph.")

    def _curves(self, plot: pg.PlotItem, table: PositionTable, legend: bool) -> None:
        bias = table.bias[0]  # (H, n): the first layer's table, shared
        for h in range(bias.shape[0]):
            colour = HEAD_COLOURS[h % len(HEAD_COLOURS)]
            plot.plot(table.distance, np.asarray(bias[h], np.float32), pen=pg.mkPen(colour, width=1.5),
                      name=f"head {h}" if legend and h < 8 else None)
