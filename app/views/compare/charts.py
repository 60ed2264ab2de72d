"""The Compare view's charts: the summary table, the per-layer divergence curve, the presets' size-vs-KLD chart."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.records.compare import CompareRecord, SweepDone, SweepPoint, pareto_front, summary_rows
from app.views.compare.mix_bar import MixBar
from app.views.compare.sweep_labels import leader_end, place

KLD_MIN = 1e-6  # a KLD of 0 is drawn here on the log axis
POINT = (0, 114, 178)
FRONT = (213, 94, 0)
OVERRIDES = (0, 158, 115)
MIX = (204, 121, 167)
OWN = (0, 158, 115)
RECURRENT = (86, 180, 233)
BOTTOM = "layer · bars: B's layer on A's input"
TITLE_WIDTH = 430  # px: a layer chart narrower than this gets the short title


class SummaryTable(QTableWidget):
    """Statistic | value rows of a comparison."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(0, 2, parent)
        self.setHorizontalHeaderLabels(["statistic", "value"])
        self.verticalHeader().setVisible(False)
        self.verticalHeader().setDefaultSectionSize(19)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        self.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        # never sideways: a long value (B's label) is elided, and its cell's tooltip says it whole
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.setWordWrap(False)
        self.setMinimumWidth(200)

    def set_record(self, rec: CompareRecord) -> None:
        rows = summary_rows(rec)
        self.setRowCount(len(rows))
        for i, (name, value) in enumerate(rows):
            for j, text in enumerate((name, value)):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.setItem(i, j, item)

    def value(self, name: str) -> str | None:
        """The value shown for a statistic (tests, copy-paste)."""
        for i in range(self.rowCount()):
            if self.item(i, 0).text() == name:
                return self.item(i, 1).text()
        return None


class LayerCurve(pg.PlotWidget):
    """How far each layer's residual stream moved: relative L2 and 1 − cosine, by layer (log scale)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, background="w")
        self._titles = tuple(
            f"<span style='color:{_hex(POINT)}'>{rel}</span> · <span style='color:{_hex(FRONT)}'>1 − cos</span> · "
            f"<span style='color:{_hex(OWN)}'>{own}</span>"
            for rel, own in (("‖h<sub>B</sub>−h<sub>A</sub>‖/‖h<sub>A</sub>‖", "layer's own share"),
                             ("rel. L2", "own share")))  # the long title, and one that fits a narrow pane
        self._title = -1
        self._fit_title()
        self.setToolTip("Accumulated: the residual stream after each layer in B against A (everything before adds up).\n"
                        "Own share (green): B's layer run on A's input to it, against A's output of that layer: "
                        "the damage that layer adds by itself.")
        self.setLabel("bottom", BOTTOM)
        self.showGrid(x=False, y=True, alpha=0.2)
        self.rel = self.plot([], [], pen=pg.mkPen(POINT, width=2), symbol="o", symbolSize=5, symbolBrush=POINT)
        self.cos = self.plot([], [], pen=pg.mkPen(FRONT, width=2, style=Qt.PenStyle.DashLine))
        self.own = pg.BarGraphItem(x=[], height=[], width=0.6, brush=pg.mkBrush(*OWN, 110), pen=pg.mkPen(None))
        self.addItem(self.own)
        # a hybrid's recurrent layers: open squares over their points (their residual update has no attention map)
        self.recurrent = pg.ScatterPlotItem(symbol="s", size=11, pen=pg.mkPen(RECURRENT, width=2), brush=None,
                                            hoverable=True, tip=lambda x, y, data: f"layer {int(x)}: recurrent "
                                            "(gated DeltaNet), no attention map")
        self.addItem(self.recurrent)

    def _fit_title(self) -> None:
        if "_titles" not in self.__dict__:  # a resize while PlotWidget's __init__ runs
            return
        short = int(self.width() < TITLE_WIDTH)
        if short != self._title:
            self._title = short
            self.setTitle(self._titles[short], size="9pt")

    def resizeEvent(self, ev: Any) -> None:  # noqa: N802 (Qt's name)
        self._fit_title()  # before the layout, which takes the title's width as its least width
        super().resizeEvent(ev)

    def clear_record(self) -> None:
        self.rel.setData([], [])
        self.cos.setData([], [])
        self.own.setOpts(x=[], height=[], y0=[])
        self.recurrent.setData([], [])
        self.setLabel("bottom", BOTTOM)

    def set_record(self, rec: CompareRecord) -> None:
        x = rec.layers.astype(float)
        rel = np.log10(np.maximum(rec.rel_l2.astype(float), KLD_MIN))
        cos = np.log10(np.maximum(1.0 - rec.cosine.astype(float), KLD_MIN))
        self.rel.setData(x, rel)
        self.cos.setData(x, cos)
        own = (np.log10(np.maximum(rec.own_l2.astype(float), KLD_MIN)) if rec.own_l2 is not None
               and len(rec.own_l2) == len(x) else np.zeros(0))
        self.setXRange(-0.5, max(0.5, float(x.max(initial=0)) + 0.5), padding=0)
        lo, hi = float(min(rel.min(initial=0), cos.min(initial=0))), float(max(rel.max(initial=0), cos.max(initial=0)))
        if own.size:
            lo, hi = min(lo, float(own.min())), max(hi, float(own.max()))
            self.own.setOpts(x=x, y0=np.full(x.size, lo - 0.1), height=own - (lo - 0.1))
        else:
            self.own.setOpts(x=[], height=[], y0=[])
        self.setYRange(lo - 0.1, hi + 0.1, padding=0)
        marked = np.isin(rec.layers, np.asarray(rec.recurrent, np.int64))
        self.recurrent.setData(x[marked], rel[marked])
        self.setLabel("bottom", BOTTOM + (" · <span style='color:%s'>□</span> recurrent layer" % _hex(RECURRENT)
                                          if marked.any() else ""))
        set_log_ticks(self.getAxis("left"), lo - 0.1, hi + 0.1)


class InsetLabelAxis(pg.AxisItem):
    """A left axis whose title sits inside the axis: pyqtgraph puts it 5 px past the widget's edge, which cuts the
    first pixels of "mean KLD (log)" off."""

    def resizeEvent(self, ev: Any = None) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(ev)
        if self.orientation == "left":
            self.label.setX(0)


class SweepChart(QWidget):
    """Size against mean KLD for llama-quantize's presets of the loaded model, with their Pareto front."""

    run_requested = Signal()
    cancel_requested = Signal()
    point_clicked = Signal(object)  # SweepPoint

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.points: list[SweepPoint] = []
        self.file_bytes = 0
        self.run = QPushButton("Sweep presets")
        self.run.setToolTip("Requantize a copy of the model to each preset and measure KLD against the file on the "
                            "evaluation text (takes a while; runs in the background)")
        self.cancel = QPushButton("Cancel")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = QLabel("")
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # preset and rule names, never markup
        self.status.setWordWrap(True)  # a mix's summary is long: wrap it rather than widen the chart
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.plot = pg.PlotWidget(background="w", title="Presets and searched mixes: size vs KLD to the file",
                                  axisItems={"left": InsetLabelAxis("left")})
        self.plot.setLabel("bottom", "size of the tensors", units="MiB")
        self.plot.setLabel("left", "mean KLD")
        self.mix = MixBar()
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        # y is drawn as log10(KLD), with decade ticks written as KLD values
        self.front = self.plot.plot([], [], pen=pg.mkPen(FRONT, width=2))
        self.scatter = pg.ScatterPlotItem(size=9, pen=pg.mkPen("w"), brush=pg.mkBrush(*POINT), hoverable=True,
                                          hoverSize=13, tip=_tip)
        self.special = pg.ScatterPlotItem(size=15, symbol="star", pen=pg.mkPen("k"), brush=pg.mkBrush(*OVERRIDES),
                                          hoverable=True, tip=_tip)
        self.mixes = pg.ScatterPlotItem(size=13, symbol="d", pen=pg.mkPen("k"), brush=pg.mkBrush(*MIX),
                                        hoverable=True, hoverSize=16, tip=_tip)
        self.plot.addItem(self.scatter)
        self.plot.addItem(self.special)
        self.plot.addItem(self.mixes)
        for item in (self.scatter, self.special, self.mixes):
            item.sigClicked.connect(self._clicked)
        self.file_line = pg.InfiniteLine(angle=90, pen=pg.mkPen((120, 120, 120), style=Qt.PenStyle.DashLine),
                                         label="the file", labelOpts={"position": 0.6, "color": (90, 90, 90)})
        self.file_line.setVisible(False)
        self.plot.addItem(self.file_line)
        self.labels: list[pg.TextItem] = []
        self.leaders: list[pg.PlotCurveItem] = []  # lines from a point to its name, where the name sits away from it
        self.plot.getViewBox().sigResized.connect(lambda _vb: self._redraw() if self.points else None)
        bar = QHBoxLayout()
        bar.addWidget(self.run)
        bar.addWidget(self.cancel)
        bar.addWidget(self.mix.compare)
        bar.addWidget(self.mix.apply)
        bar.addStretch(1)
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        self.empty = QLabel("Sweep presets to see every preset's size against its KLD to the file, "
                            "or choose a size and Find the best mix.\nClick a point to compare it in full.")
        self.empty.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.empty.setWordWrap(True)
        self.empty.setStyleSheet("color: #666; background: white; border: 1px solid #ddd;")
        self.stack = QStackedWidget()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(self.plot)
        root.addLayout(bar)
        root.addWidget(self.progress)  # a line of its own: what runs is said whole, never squeezed beside the buttons
        root.addWidget(self.mix)
        root.addWidget(self.status)
        root.addWidget(self.stack, 1)
        self.run.clicked.connect(self.run_requested)
        self.cancel.clicked.connect(self.cancel_requested)
        self.set_running(False)

    def set_file_type(self, name: str) -> None:
        """Say what the KLD is measured against: 'mean KLD to the file (Q4_1), not to full precision'."""
        self.plot.setTitle(f"Size vs KLD to the file ({name}), not to full precision", size="9pt")
        self.plot.setToolTip(f"Presets (●) and searched mixes (◆): each one's size against its mean KLD to the file "
                             f"({name}) on the evaluation text, not to full precision; click a point to compare it")
        self.plot.setLabel("left", "mean KLD (log)")

    def _clicked(self, _item: object, spots: object) -> None:
        spots = list(spots)  # type: ignore[call-overload]
        if spots and isinstance(spots[0].data(), SweepPoint):
            self.mix.choose(spots[0].data())
            self.point_clicked.emit(spots[0].data())

    def set_file_size(self, nbytes: int) -> None:
        """Where the loaded file sits on the size axis (its KLD against itself is 0)."""
        self.file_bytes = nbytes
        self.file_line.setValue(nbytes / 2**20)
        self.file_line.setVisible(nbytes > 0)

    def set_running(self, running: bool, what: str = "", fraction: float = 0.0) -> None:
        self.run.setEnabled(not running)
        self.mix.set_running(running)
        self.cancel.setEnabled(running)
        self.progress.setVisible(running)
        if running:
            self.progress.setValue(int(1000 * max(0.0, min(1.0, fraction))))
            self.progress.setFormat(f"{what} %p%")

    def clear(self) -> None:
        """Another model: no points, the empty state."""
        self.points = []
        self.mix.choose(None)
        self.status.setText("")
        self._redraw()

    def start(self) -> None:
        """A sweep begins: clear the old presets' points (searched mixes stay)."""
        self.points = [p for p in self.points if p.kind == "mix"]
        self._redraw()
        self.status.setText("Sweeping the presets… (each point appears as soon as it is measured)")
        self.set_running(True, "starting", 0.0)

    def add_point(self, point: SweepPoint) -> None:
        self.points.append(point)
        self._redraw()

    def finish(self, done: SweepDone | None, message: str = "") -> None:
        self.set_running(False)
        if message:
            self.status.setText(message)
        elif done is not None:
            front = ", ".join(self.points[i].name for i in pareto_front(self.points))
            self.status.setText(f"{done.n_points} points{' (cancelled)' if done.cancelled else ''} · "
                                f"Pareto front: {front}")

    def _redraw(self) -> None:
        self.stack.setCurrentIndex(1 if self.points else 0)
        presets = [p for p in self.points if p.kind == "preset"]
        others = [p for p in self.points if p.kind == "overrides"]
        mixes = [p for p in self.points if p.kind == "mix"]
        floor = _floor(self.points)
        self.scatter.setData([p.nbytes / 2**20 for p in presets], [_y(p.kld_mean, floor) for p in presets], data=presets)
        self.special.setData([p.nbytes / 2**20 for p in others], [_y(p.kld_mean, floor) for p in others], data=others)
        self.mixes.setData([p.nbytes / 2**20 for p in mixes], [_y(p.kld_mean, floor) for p in mixes], data=mixes)
        on_front = pareto_front(self.points)
        front = [self.points[i] for i in on_front]
        self.front.setData([p.nbytes / 2**20 for p in front], [_y(p.kld_mean, floor) for p in front])
        xs = [p.nbytes / 2**20 for p in self.points] + ([self.file_bytes / 2**20] if self.file_bytes else [])
        ys = [_y(p.kld_mean, floor) for p in self.points]
        if xs:
            span = max(max(xs) - min(xs), 1.0)
            self.plot.setXRange(min(xs) - 0.05 * span, max(xs) + 0.15 * span, padding=0)  # room for the labels
        if ys:
            self.plot.setYRange(min(ys) - 0.35, max(ys) + 0.5, padding=0)  # room for labels above and below
            set_log_ticks(self.plot.getAxis("left"), min(ys) - 0.35, max(ys) + 0.5)
        self._place_labels(on_front, floor)

    def _place_labels(self, on_front: list[int], floor: float) -> None:
        """Name every point without overlaps, the Pareto front first (app.views.compare.sweep_labels); every point
        also has a hover tip."""
        for item in self.labels + self.leaders:
            self.plot.removeItem(item)
        self.labels, self.leaders = [], []
        vb = self.plot.getViewBox()
        (x0, x1), (y0, y1) = vb.viewRange()
        w, h = max(vb.width(), 200.0), max(vb.height(), 120.0)

        def pixel(x: float, y: float) -> tuple[float, float]:
            return (x - x0) / max(x1 - x0, 1e-9) * w, (y1 - y) / max(y1 - y0, 1e-9) * h

        def view(px: float, py: float) -> tuple[float, float]:
            return x0 + px / w * (x1 - x0), y1 - py / h * (y1 - y0)

        marks = [pixel(p.nbytes / 2**20, _y(p.kld_mean, floor)) for p in self.points]
        texts = []
        for i, p in enumerate(self.points):
            mark = {"preset": "", "mix": "◆ "}.get(p.kind, "★ ")
            text = pg.TextItem(f"{mark}{p.name}" + (" (≈ file)" if p.kld_mean < floor else ""),
                               color=(20, 20, 20) if i in on_front else (120, 120, 120), anchor=(0, 0))
            font = QFont()
            font.setPointSize(8)
            font.setBold(i in on_front)
            text.setFont(font)
            texts.append(text)
        sizes = [(t.textItem.boundingRect().width(), t.textItem.boundingRect().height()) for t in texts]  # pixels
        order = on_front + [i for i in range(len(self.points)) if i not in on_front]
        for i, spot in place(marks, sizes, order, w, h).items():
            text = texts[i]
            text.setPos(*view(spot.box[0], spot.box[1]))
            text.setToolTip(_tip(data=self.points[i]))
            self.plot.addItem(text)
            self.labels.append(text)
            if spot.leader:
                ex, ey = leader_end(*marks[i], spot.box)
                (ax, ay), (bx, by) = view(*marks[i]), view(ex, ey)
                line = pg.PlotCurveItem([ax, bx], [ay, by], pen=pg.mkPen((150, 150, 150), width=1))
                self.plot.addItem(line)
                self.leaders.append(line)


def _tip(x: float = 0.0, y: float = 0.0, data: SweepPoint | None = None) -> str:
    """A point's hover text."""
    p = data
    if p is None:
        return ""
    return (f"{p.name}: {p.nbytes / 2**20:.1f} MiB · {p.bpw:.3f} bpw\nKLD mean {p.kld_mean:.5f} · p99 {p.kld_p99:.4f}\n"
            f"same top token {p.same_top_pct:.1f} % · PPL ratio {p.ppl_ratio:.4f}"
            + (f"\n{p.detail}" if p.detail else "") + "\nclick: compare it in full")


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#%02x%02x%02x" % rgb


def _floor(points: list[SweepPoint]) -> float:
    """The lowest KLD drawn: a decade under the smallest clearly non-zero one (a preset equal to the file is ~0)."""
    real = [p.kld_mean for p in points if p.kld_mean > KLD_MIN * 10]
    return max(KLD_MIN, min(real) / 10) if real else KLD_MIN


def _y(kld: float, floor: float = KLD_MIN) -> float:
    """Where a KLD is drawn: log10, anything under `floor` at the floor."""
    return math.log10(max(float(kld), floor))


def set_log_ticks(axis: pg.AxisItem, lo: float, hi: float) -> None:
    """Ticks for an axis drawn in log10 units: labelled decades, and 2 and 5 between them when the range is short."""
    major, minor = [], []
    for e in range(math.floor(lo), math.ceil(hi) + 1):
        for m in (1, 2, 5):
            v = e + math.log10(m)
            if lo <= v <= hi:
                (major if m == 1 or hi - lo < 2.5 else minor).append((v, f"{m * 10.0 ** e:g}"))
    axis.setTicks([major, [(v, "") for v, _ in minor]])
