"""The sqrt(d_k) argument, measured on one head: score variance against d_k, softmax entropy with and without scaling.

Vaswani et al. (2017, footnote 4): if q and k have independent components of mean 0 and variance 1, q·k has
variance d_k; dividing by sqrt(d_k) brings it back to 1 so the softmax does not saturate. Here the same
numbers are measured from the model's real post-RoPE queries and keys (engine.attention_steps.scaling_stats).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QWidget

from app.records.attention import StepRecord
from engine.observe.attention_steps import AttentionCell

RAW, SCALED, PREDICTED = (214, 39, 40), (31, 119, 180), (150, 150, 150)


class WrapLabel(QLabel):
    """A word-wrapped label that gives no height-for-width, which a scroll area would turn into a minimum height."""

    def __init__(self, rich: bool = False, parent: QWidget | None = None):
        super().__init__(parent)
        self.setTextFormat(Qt.TextFormat.RichText if rich else Qt.TextFormat.PlainText)
        self.setWordWrap(True)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt override
        return False


def _bars(title: str) -> pg.PlotWidget:
    w = pg.PlotWidget()
    w.setBackground("w")
    w.setMenuEnabled(False)
    w.hideButtons()
    w.setMouseEnabled(False, False)
    w.setTitle(title, size="9pt", color="#333")
    w.getAxis("left").setWidth(36)
    w.setMinimumSize(120, 110)
    return w


def _draw(plot: pg.PlotWidget, labels: list[str], values: list[float], colours: list[tuple[int, int, int]]) -> None:
    """Bars with their value written on top and a text label under each."""
    plot.clear()
    x = np.arange(len(values), dtype=float)
    plot.addItem(pg.BarGraphItem(x=x, height=values, width=0.6, brushes=[pg.mkBrush(c) for c in colours],
                                 pens=[pg.mkPen(c) for c in colours]))
    top = max([v for v in values if np.isfinite(v)] + [1e-9])
    for xi, v in zip(x, values):
        text = pg.TextItem(_fmt(v), color="#222", anchor=(0.5, 1.0))
        text.setPos(xi, v)
        plot.addItem(text)
    plot.getAxis("bottom").setTicks([list(zip(x, labels))])
    plot.setXRange(-0.6, len(values) - 0.4, padding=0)
    plot.setYRange(0, top * 1.5, padding=0)


def row_entropy(cell: AttentionCell) -> tuple[float, float, float]:
    """(scaled, unscaled, uniform) softmax entropy in nats of the cell's own row."""
    vis = cell.visible
    ent = []
    for scores in (cell.masked, np.where(vis, cell.dots, -np.inf)):
        x = scores[vis].astype(np.float64)
        p = np.exp(x - x.max())
        p /= p.sum()
        ent.append(float(-(p * np.log(np.where(p > 0, p, 1.0))).sum()))
    return ent[0], ent[1], float(np.log(max(1, int(vis.sum()))))


def _fmt(v: float) -> str:
    if not np.isfinite(v):
        return "–"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


class ScalingPanel(QWidget):
    """Two bar charts (variance, entropy) and a few lines of numbers for one head."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.text = WrapLabel(rich=True)
        self.text.setMinimumHeight(92)
        self.variance = _bars("variance of q·k")
        self.entropy = _bars("mean softmax entropy per row (nats)")
        lay = QGridLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.text, 0, 0, 1, 2)
        lay.addWidget(self.variance, 1, 0)
        lay.addWidget(self.entropy, 1, 1)
        lay.setRowStretch(1, 1)
        self.record: StepRecord | None = None

    def set_record(self, rec: StepRecord) -> None:
        """Show the statistics of the record's (layer, head)."""
        self.record = rec
        s, cell = rec.stats, rec.cell
        predicted = s.d_k * s.q_var * s.k_var  # Var(sum of d_k products of independent components)
        _draw(self.variance, ["raw q·k", "d_k·σq²·σk²", "scaled"], [s.var_raw, predicted, s.var_scaled],
              [RAW, PREDICTED, SCALED])
        _draw(self.entropy, ["unscaled", "scaled", "uniform"],
              [s.entropy_unscaled, s.entropy_scaled, s.entropy_uniform], [RAW, SCALED, PREDICTED])
        over = f"the first {rec.stats_tokens:,} of {rec.n_tokens:,} tokens" if rec.stats_tokens < rec.n_tokens \
            else f"all {rec.n_tokens:,} tokens"
        ratio = s.var_raw / s.var_scaled if s.var_scaled > 0 else float("nan")
        drop = s.entropy_scaled - s.entropy_unscaled
        row = row_entropy(cell)
        self.text.setText(
            f"<b>Why ÷ √d_k</b> — layer {cell.layer}, head {cell.head}, over {s.n_pairs:,} visible (query, key) pairs "
            f"of {over}.<br>"
            f"d_k = <b>{s.d_k}</b>, σq² = {s.q_var:.3g}, σk² = {s.k_var:.3g}: independent components would give "
            f"Var(q·k) = d_k·σq²·σk² = {_fmt(predicted)}.<br>"
            f"Measured Var(q·k) = <b>{_fmt(s.var_raw)}</b>; × {cell.scale:.4g} → <b>{_fmt(s.var_scaled)}</b> "
            f"(÷ {ratio:.3g}).<br>"
            f"This row's entropy (query {cell.query_index}): <b>{row[0]:.3f}</b> nats scaled, <b>{row[1]:.3f}</b> "
            f"unscaled, {row[2]:.3f} uniform (the bars: the head's mean over its rows). Without the scaling the "
            f"softmax {'collapses onto fewer keys' if drop >= 0 else 'spreads out'}."
        )

    def clear(self) -> None:
        self.record = None
        self.variance.clear()
        self.entropy.clear()
        self.text.setText("")
