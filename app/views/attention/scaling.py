"""The sqrt(d_k) argument, measured on one head: score variance against d_k, softmax entropy with and without scaling.

Vaswani et al. (2017, footnote 4): if q and k have independent components of mean 0 and variance 1, q·k has
variance d_k; dividing by sqrt(d_k) brings it back to 1 so the softmax does not saturate. Here the same
numbers are measured from the model's real post-RoPE queries and keys (engine.attention_steps.scaling_stats).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetrics, QResizeEvent
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


class FitLabel(WrapLabel):
    """A word-wrapped label exactly as tall as its text at its width: never cut, and no height-for-width (which a
    scroll area would turn into a tall minimum height)."""

    def setText(self, text: str) -> None:  # noqa: N802 - Qt override
        super().setText(text)
        self._fit()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        if self.width() <= 0:
            return
        height = max(self.fontMetrics().height(), self.heightForWidth(self.width())) if self.text() else 0
        if height != self.height() or self.minimumHeight() != height:
            self.setFixedHeight(height)


def _view(plot: pg.PlotItem) -> pg.GraphicsView | None:
    scene = plot.scene()
    views = scene.views() if scene is not None else []
    return views[0] if views else None


def title_room(plot: pg.PlotItem) -> float:
    """The width a title of this plot may take: over the plot's data column when the plot fills its view (a
    one-column layout), not the plot's own width, which a long title widens past the view (pyqtgraph gives the
    title label its text's width as a minimum width)."""
    view = _view(plot)
    width = view.width() if view is not None else plot.width()
    axes = sum(plot.getAxis(side).width() for side in ("left", "right") if plot.getAxis(side).isVisible())
    return width - axes - 20


def fit_title(plot: pg.PlotItem, *candidates: str, **style: str) -> None:
    """The first title (longest first) drawn whole in the plot's view; the last one cut with … if none is.
    The plot keeps its candidates and fits them again whenever its view is resized."""
    plot._fit_titles = (candidates, style)  # noqa: SLF001 - our own attribute on the plot
    view = _view(plot)
    if view is not None and not getattr(plot, "_fit_connected", False):
        plot._fit_connected = True  # noqa: SLF001
        view.sigDeviceRangeChanged.connect(lambda *_a, p=plot: _refit_title(p))
    _refit_title(plot)


def _refit_title(plot: pg.PlotItem) -> None:
    candidates, style = plot._fit_titles  # noqa: SLF001
    room = title_room(plot)
    label = plot.titleLabel
    for text in candidates:
        if label.text != text:
            plot.setTitle(text, **style)
        if room <= 0 or label.item.boundingRect().width() <= room:
            break
    else:
        metrics = QFontMetrics(label.item.font())
        plot.setTitle(metrics.elidedText(candidates[-1], Qt.TextElideMode.ElideRight, int(room)), **style)
    height = int(label.item.boundingRect().height()) + 2  # pyqtgraph's title row is 30 px: the data gets the rest
    label.setMaximumHeight(height)
    plot.layout.setRowFixedHeight(0, height)


def title_fits(plot: pg.PlotItem) -> bool:
    """Whether the plot's title is drawn whole inside its view (tests)."""
    return plot.titleLabel.item.boundingRect().width() <= title_room(plot) + 4 and "…" not in plot.titleLabel.text


def axis_width(plot: pg.PlotWidget) -> float:
    return float(plot.getAxis("left").width()) + 16


def _bars(*titles: str) -> pg.PlotWidget:
    w = pg.PlotWidget()
    w.setBackground("w")
    w.setMenuEnabled(False)
    w.hideButtons()
    w.setMouseEnabled(False, False)
    fit_title(w.getPlotItem(), *titles, size="9pt", color="#333")
    w.getAxis("left").setWidth(36)
    w.setMinimumSize(120, 110)
    w.sigDeviceRangeChanged.connect(lambda *_a: _fit_ticks(w))
    return w


def _draw(plot: pg.PlotWidget, labels: list[tuple[str, str]], values: list[float],
          colours: list[tuple[int, int, int]]) -> None:
    """Bars with their value written on top and a label under each: (long, short), the short one when the long
    ones would run into each other."""
    plot.clear()
    x = np.arange(len(values), dtype=float)
    plot.addItem(pg.BarGraphItem(x=x, height=values, width=0.6, brushes=[pg.mkBrush(c) for c in colours],
                                 pens=[pg.mkPen(c) for c in colours]))
    top = max([v for v in values if np.isfinite(v)] + [1e-9])
    for xi, v in zip(x, values):
        text = pg.TextItem(_fmt(v), color="#222", anchor=(0.5, 1.0))
        text.setPos(xi, v)
        plot.addItem(text)
    plot._bar_labels = labels  # noqa: SLF001
    _fit_ticks(plot)
    plot.setXRange(-0.6, len(values) - 0.4, padding=0)
    plot.setYRange(0, top * 1.5, padding=0)


def _fit_ticks(plot: pg.PlotWidget) -> None:
    labels = getattr(plot, "_bar_labels", None)
    if not labels:
        return
    axis = plot.getAxis("bottom")
    per_bar = (plot.width() - axis_width(plot)) / max(1, len(labels)) - 6
    metrics = QFontMetrics(axis.font() if axis.style.get("tickFont") is None else axis.style["tickFont"])
    fits = all(metrics.horizontalAdvance(long) <= per_bar for long, _short in labels)
    axis.setTicks([[(float(i), long if fits else short) for i, (long, short) in enumerate(labels)]])
    plot._bar_ticks = [long if fits else short for long, short in labels]  # noqa: SLF001 - what is drawn (tests)


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
    """Two bar charts (variance, entropy) and a few lines of numbers for one head.

    With `text_inside=False` the paragraph (`text`) is left for the caller to place (the step-through view gives
    it the whole width, above the charts, so that it is a few lines and never cut)."""

    def __init__(self, parent: QWidget | None = None, text_inside: bool = True):
        super().__init__(parent)
        self.text = FitLabel(rich=True)  # as tall as its paragraph: the charts below take what is left
        self.variance = _bars("variance of q·k", "Var(q·k)")
        self.entropy = _bars("mean softmax entropy per row (nats)", "mean row entropy (nats)", "entropy (nats)")
        lay = QGridLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        if text_inside:
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
        _draw(self.variance, [("raw q·k", "raw"), ("d_k·σq²·σk²", "pred."), ("scaled", "scaled")],
              [s.var_raw, predicted, s.var_scaled], [RAW, PREDICTED, SCALED])
        _draw(self.entropy, [("unscaled", "raw"), ("scaled", "scaled"), ("uniform", "unif.")],
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
