"""The Positions lens's distance panel: at a chosen distance d, every pair's rotation angle and share of q.k,
for every RoPE base of the model side by side (and the frequencies before Llama 3's factors when it has them)."""
from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from app.views.common.flow import FlowBox
from engine.observe.positions import DistanceView, rope_at_distance

MAX_SERIES = 5


@dataclass(frozen=True)
class Series:
    """One set of frequencies to draw: a RoPE base as some layers use it."""

    label: str  # "base 10,000 · 15 local layers (sliding window 512)"
    colour: tuple[int, int, int]
    freqs: np.ndarray  # theta_i the layers rotate by, (rope_dim/2,)
    dashed: bool = False  # e.g. the frequencies before the model's RoPE scaling


class RopeDistancePanel(QWidget):
    """Two plots against the pair index, rotation angle d * theta_i and cos(d * theta_i), and a per-base table."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.views: list[DistanceView] = []
        self.angle_widget = pg.PlotWidget(background="w")
        self.contrib_widget = pg.PlotWidget(background="w")
        for w in (self.angle_widget, self.contrib_widget):
            w.setMinimumSize(260, 200)
        self.plots = FlowBox([self.angle_widget, self.contrib_widget], min_width=380)
        self.angle_plot = self.angle_widget.getPlotItem()
        self.angle_plot.setLogMode(y=True)
        self.angle_plot.setLabel("bottom", "pair index i")
        self.angle_plot.setLabel("left", "rotation d·θᵢ (rad)")
        self.contrib_plot = self.contrib_widget.getPlotItem()
        self.contrib_plot.setLabel("bottom", "pair index i")
        self.contrib_plot.setLabel("left", "cos(d·θᵢ)")
        self.contrib_plot.setYRange(-1.05, 1.05, padding=0)
        for value, text in ((2 * np.pi, "one turn (2π)"), (0.1, "0.1 rad")):
            line = pg.InfiniteLine(pos=np.log10(value), angle=0, pen=pg.mkPen((150, 150, 150), style=Qt.PenStyle.DotLine),
                                   label=text, labelOpts={"position": 0.8, "color": (110, 110, 110)})
            self.angle_plot.addItem(line)
        self.contrib_plot.addItem(pg.InfiniteLine(pos=0, angle=0, pen=pg.mkPen((180, 180, 180))))
        self.angle_curves = [self.angle_plot.plot() for _ in range(MAX_SERIES)]
        self.contrib_curves = [self.contrib_plot.plot() for _ in range(MAX_SERIES)]
        self.pair_lines = [pg.InfiniteLine(angle=90, pen=pg.mkPen((0, 0, 0, 90))) for _ in range(2)]
        self.angle_plot.addItem(self.pair_lines[0])
        self.contrib_plot.addItem(self.pair_lines[1])
        self.table = QLabel("")
        self.table.setWordWrap(True)
        self.table.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.plots, 1)
        lay.addWidget(self.table)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        """No: the wrapped table would make the lens's scroll area add up the plots' preferred heights."""
        return False

    def show_distance(self, series: list[Series], distance: int, pair: int) -> None:
        """Draw every series at distance d; the chosen pair is marked in both plots."""
        series = series[:MAX_SERIES]
        self.views = [rope_at_distance(s.freqs, distance) for s in series]
        for k, (a_curve, c_curve) in enumerate(zip(self.angle_curves, self.contrib_curves)):
            if k >= len(series):
                a_curve.setVisible(False)
                c_curve.setVisible(False)
                continue
            s, v = series[k], self.views[k]
            pen = pg.mkPen(s.colour, width=2, style=Qt.PenStyle.DashLine if s.dashed else Qt.PenStyle.SolidLine)
            x = np.arange(v.angles.size)
            # log axis: a zero angle (d = 0) has no place on it, so it sits at the smallest float instead
            a_curve.setData(x, np.maximum(v.angles, 1e-12), pen=pen, symbol=None if s.dashed else "o", symbolSize=4,
                            symbolBrush=s.colour, symbolPen=None)
            c_curve.setData(x, v.contributions, pen=pen, symbol=None if s.dashed else "o", symbolSize=4,
                            symbolBrush=s.colour, symbolPen=None)
            a_curve.setVisible(True)
            c_curve.setVisible(True)
        for line in self.pair_lines:
            line.setValue(pair)
        self.angle_plot.setTitle(f"Rotation d·θᵢ at d = {distance:,}")
        self.contrib_plot.setTitle(f"cos(d·θᵢ): each pair's q·k at d = {distance:,}")
        rows = []
        for s, v in zip(series, self.views):
            r, g, b = s.colour
            n = v.angles.size
            chosen = (f"; pair {pair}: {v.angles[pair]:,.3g} rad = {v.angles[pair] / (2 * np.pi):,.3g} turns, "
                      f"cos {v.contributions[pair]:+.3f}") if 0 <= pair < n else ""
            rows.append(f"<span style='color:rgb({r},{g},{b})'>{'╌╌' if s.dashed else '━━'}</span> "
                        f"{html.escape(s.label, quote=False)}: q·k(d)/q·k(0) = <b>{v.score:+.3f}</b>; {v.turned} of {n} pairs have "
                        f"turned at least once, {v.still} less than 0.1 rad{chosen}")
        self.table.setText("<br>".join(rows))
