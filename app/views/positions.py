"""The Positions lens: RoPE as the model uses it at a chosen distance d (every base side by side), token angles on
the unit circle, q.k against distance, and the sinusoidal encoding of "Attention Is All You Need" with its M_k."""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QSpinBox, QTabWidget, QVBoxLayout, QWidget

from app.records.model import ModelRecord
from app.views.common.colours import colormap
from app.views.common.flow import FlowBox
from app.views.common.tokens import token_label
from app.views.rope_distance import RopeDistancePanel, Series
from app.views.t5_positions import T5PositionsPanel
from engine.models.rope import rope_freqs
from engine.observe.positions import (
    relative_rotation,
    rope_relative_check,
    rope_pair_angles,
    rope_score_vs_distance,
    scaled_freqs,
    shift_error,
    sinusoid_freqs,
    sinusoidal_encoding,
    wavelengths,
)

if TYPE_CHECKING:
    from app.views.lenses import LensRequests

MIN_POSITIONS = 128
MAX_POSITIONS = 4096
MAX_CIRCLE_LABELS = 24
MAX_CIRCLE_POINTS = 256  # the newest tokens placed on the circle (older ones only crowd it)
M_K_SHOWN = 16  # dims of M_k drawn (it is block diagonal; the rest repeats the pattern)
DEFAULT_DISTANCE = 64
BASE_COLOURS = ((0, 114, 178), (213, 94, 0), (0, 158, 115), (204, 121, 167))  # Okabe-Ito, colour-blind safe
GREY = (120, 120, 120)


def _wavelengths(freqs: np.ndarray) -> np.ndarray:
    """Tokens per turn of each pair; NaN (not drawn on the log axis) for a pair that never turns (frequency 0: the
    pairs multi-section RoPE gives a fourth position, 0 for text, as Qwen3-VL's sections leave some)."""
    with np.errstate(divide="ignore"):
        w = wavelengths(np.asarray(freqs, np.float64))
    return np.where(np.isfinite(w), w, np.nan)


def _count(n: int, hybrid: bool, base: float) -> str:
    """'10,000 (30 layers)', or a hybrid's '10,000,000 (1 attention layer)'."""
    return f"{base:,.0f} ({n} {'attention ' if hybrid else ''}layer{'' if n == 1 else 's'})"


def _recurrent_note(model: ModelRecord) -> str:
    """A hybrid: its recurrent layers have no positions at all ('' for any other model)."""
    if not model.hybrid:
        return ""
    from app.records.logit_lens import layer_runs  # noqa: PLC0415 - plain Python

    return (f". Layers {layer_runs(model.recurrent)} are recurrent (gated DeltaNet): no RoPE and no positions; "
            "order reaches them through the recurrence itself (and a short causal convolution)")


class PositionsLens(QWidget):
    """Sinusoid heatmap and frequencies, RoPE per base: token angles on the unit circle, q.k vs distance, M_k.

    Every plot item is made once and updated in place (no clear/re-add): cheap enough to follow a streaming reply.
    """

    title: ClassVar[str] = "Positions"  # the tab it shows in

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.tokens: list[str] = []
        self.d_model = 512
        self.rope_dim = 64
        self.bases: tuple[float, ...] = (10000.0,)
        self.ratio: tuple[float, ...] = ()  # the model's RoPE scaling per pair (Llama 3's factor curve), () for none
        self.dims: tuple[int, ...] = (64,)  # rotated dims per base (the kinds of layers may differ: Gemma 4)
        self.ratios: tuple[tuple[float, ...], ...] = ((),)  # the scaling per pair of each base's layers
        self.n_ctx = 2048
        self.last_error = float("nan")
        self.rope_error = float("nan")
        self.pair_spin = QSpinBox()
        self.pair_spin.setPrefix("RoPE pair ")
        self.pair_spin.setRange(0, 31)
        self.offset_spin = QSpinBox()
        self.offset_spin.setRange(0, MAX_POSITIONS)
        self.offset_spin.setValue(DEFAULT_DISTANCE)
        self.offset_spin.setPrefix("distance d = offset k = ")
        self.offset_spin.setToolTip("The distance m − n between query and key: RoPE's angles and q·k at d, and the "
                                    "shift k of both checks (RoPE's and the sinusoid's M_k)")
        self.pos_spin = QSpinBox()
        self.pos_spin.setRange(8, MAX_POSITIONS)
        self.pos_spin.setValue(MIN_POSITIONS)
        self.pos_spin.setPrefix("positions ")
        self.pos_spin.setToolTip("Positions plotted: the current chat's tokens (at least 128)")
        bar = QHBoxLayout()
        for w in (self.pos_spin, self.pair_spin, self.offset_spin):
            bar.addWidget(w)
        bar.addStretch(1)
        self.summary = QLabel("")
        self.summary.setTextFormat(Qt.TextFormat.PlainText)  # it quotes general.name from the file
        self.summary.setWordWrap(True)  # a long model line must never widen the lens
        self.distance = RopeDistancePanel()
        self.dot_widget = pg.PlotWidget(background="w")  # q.k against distance
        self.circle_widget = pg.PlotWidget(background="w")  # token angles on the unit circle
        for w in (self.dot_widget, self.circle_widget):
            w.setMinimumSize(260, 220)
        self.plots = FlowBox([self.dot_widget, self.circle_widget], min_width=400, stretches=[3, 2])
        self.sinusoid_plots = pg.GraphicsLayoutWidget()  # the sinusoid, the wavelengths and M_k
        self.sinusoid_plots.setBackground("w")
        self.check = QLabel("")
        self.check.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.check.setWordWrap(True)
        self.legend = QLabel("")  # one key for every panel: each RoPE base keeps its colour throughout
        self.legend.setWordWrap(True)
        sin_page = QWidget()
        sl = QVBoxLayout(sin_page)
        sl.setContentsMargins(0, 0, 0, 0)
        sl.addWidget(self.sinusoid_plots, 1)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.distance, "RoPE at distance d")
        self.tabs.addTab(self.plots, "q·k against distance, unit circle")
        self.tabs.addTab(sin_page, "Wavelengths, sinusoid, M_k")
        self.t5 = T5PositionsPanel()  # an encoder-decoder (T5) model's learned bias: its tab only, for one
        self.tabs.addTab(self.t5, "Relative position bias (T5)")
        self.tabs.setTabVisible(self.tabs.indexOf(self.t5), False)
        root = QVBoxLayout(self)
        root.addLayout(bar)
        root.addWidget(self.summary)
        root.addWidget(self.legend)
        # Ignored: the word-wrapped labels make the scroll area ask the layout's height for its width, which adds up
        # the plots' preferred heights; they take what is left instead, down to their minimum
        self.tabs.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        root.addWidget(self.tabs, 1)
        root.addWidget(self.check)
        self._build_plots()
        self.pair_spin.valueChanged.connect(lambda _: (self._draw_circle(), self._draw_pair_marker(), self._draw_distance()))
        self.offset_spin.valueChanged.connect(lambda _: (self._draw_shift(), self._draw_distance()))
        self.pos_spin.valueChanged.connect(lambda _: (self._draw_pe(), self._draw_shift()))
        self.redraw()

    def _build_plots(self) -> None:
        p = self.sinusoid_plots
        self.pe_plot = p.addPlot(row=0, col=0, rowspan=2)
        self.pe_plot.invertY(True)
        self.pe_plot.setLabel("left", "position")
        self.pe_plot.setLabel("bottom", "dimension (even: sin, odd: cos)")
        self.pe_image = pg.ImageItem(axisOrder="row-major")
        self.pe_plot.addItem(self.pe_image)
        self.pe_bar = pg.ColorBarItem(values=(-1, 1), colorMap=colormap("CET-D1"), interactive=False, width=14)
        self.pe_bar.setImageItem(self.pe_image, insert_in=self.pe_plot)
        self.freq_plot = p.addPlot(row=0, col=1)
        self.freq_plot.setLogMode(y=True)
        self.freq_plot.setLabel("bottom", "pair index i (frequency base^(-2i/d))")
        self.freq_plot.setLabel("left", "2π / θᵢ (tokens per turn)")
        self.sinusoid_curve = self.freq_plot.plot(pen=pg.mkPen(GREY, width=2, style=Qt.PenStyle.DashLine))
        self.unscaled_curve = self.freq_plot.plot(pen=pg.mkPen(BASE_COLOURS[0], width=1, style=Qt.PenStyle.DotLine))
        self.freq_curves = [self.freq_plot.plot(pen=pg.mkPen(c, width=2), symbol="o", symbolSize=4, symbolBrush=c, symbolPen=None)
                            for c in BASE_COLOURS]
        self.ctx_line = pg.InfiniteLine(angle=0, pen=pg.mkPen((200, 0, 0), style=Qt.PenStyle.DotLine), label="context",
                                        labelOpts={"position": 0.85, "color": (200, 0, 0)})
        self.pair_line = pg.InfiniteLine(angle=90, pen=pg.mkPen((0, 0, 0, 90)))
        self.cur_line = pg.InfiniteLine(angle=0, pen=pg.mkPen((0, 120, 0), style=Qt.PenStyle.DashLine),
                                        label="this chat", labelOpts={"position": 0.15, "color": (0, 120, 0)})
        self.freq_plot.addItem(self.ctx_line)
        self.freq_plot.addItem(self.cur_line)
        self.freq_plot.addItem(self.pair_line)
        self.circle_plot = self.circle_widget.getPlotItem()
        self.circle_plot.setAspectLocked(True)
        t = np.linspace(0, 2 * np.pi, 200)
        self.circle_plot.plot(np.cos(t), np.sin(t), pen=pg.mkPen((180, 180, 180)))
        self.rings = [pg.ScatterPlotItem(size=7, pen=None) for _ in BASE_COLOURS]
        self.labels = [pg.TextItem("", color=(60, 60, 60), anchor=(0.5, 0.5)) for _ in range(MAX_CIRCLE_LABELS)]
        for item in self.rings + self.labels:
            self.circle_plot.addItem(item)
        self.circle_plot.setRange(xRange=(-1.55, 1.55), yRange=(-1.55, 1.55), padding=0)
        self.dot_plot = self.dot_widget.getPlotItem()
        self.dot_plot.setLabel("bottom", "distance m − n (tokens)")
        self.dot_plot.setLabel("left", "q·k / q·k at distance 0")
        self.dot_sinusoid = self.dot_plot.plot(pen=pg.mkPen(GREY, width=1.5, style=Qt.PenStyle.DashLine))
        self.dot_curves = [self.dot_plot.plot(pen=pg.mkPen(c, width=1.5)) for c in BASE_COLOURS]
        self.dot_ctx = pg.InfiniteLine(angle=90, pen=pg.mkPen((200, 0, 0), style=Qt.PenStyle.DotLine), label="current context",
                                       labelOpts={"position": 0.9, "color": (200, 0, 0)})
        self.dot_d = pg.InfiniteLine(angle=90, pen=pg.mkPen((0, 0, 0, 140), style=Qt.PenStyle.DashLine), label="d",
                                     labelOpts={"position": 0.08, "color": (0, 0, 0)})
        self.dot_plot.addItem(self.dot_ctx)
        self.dot_plot.addItem(self.dot_d)
        self.mk_plot = p.addPlot(row=1, col=1)
        self.mk_plot.invertY(True)
        self.mk_plot.setAspectLocked(True)
        self.mk_image = pg.ImageItem(axisOrder="row-major")
        self.mk_plot.addItem(self.mk_image)
        self.mk_bar = pg.ColorBarItem(values=(-1, 1), colorMap=colormap("CET-D1"), interactive=False, width=14)
        self.mk_bar.setImageItem(self.mk_image, insert_in=self.mk_plot)

    # ---- public API

    def connect_requests(self, to: LensRequests) -> None:
        """The Positions lens asks for nothing: it draws the model and the context's tokens it is given."""

    def set_model(self, model: ModelRecord) -> None:
        """Use the model's width, RoPE dimensions and per-layer bases; another model's tokens are dropped."""
        if self.model is None or self.model.path != model.path:
            self.tokens = []
            self.pos_spin.blockSignals(True)
            self.pos_spin.setValue(MIN_POSITIONS)
            self.pos_spin.blockSignals(False)
        self.model = model
        on = model.encoder_decoder
        for i in range(self.tabs.count()):  # RoPE's and the sinusoid's tabs, or T5's bias only
            self.tabs.setTabVisible(i, (self.tabs.widget(i) is self.t5) == on)
        for w in (self.pos_spin, self.pair_spin, self.offset_spin, self.legend, self.check):
            w.setVisible(not on)
        if on:
            self.tabs.setCurrentWidget(self.t5)
            self.summary.setText(f"{model.name}: d_model {model.dim}, no RoPE: a learned bias per head by bucket of "
                                 f"distance ({model.n_buckets} buckets); {model.n_layers} encoder and "
                                 f"{model.n_dec_layers} decoder layers")
            return
        if self.tabs.currentWidget() is self.t5:
            self.tabs.setCurrentIndex(0)
        self.d_model = model.dim
        self.bases = (model.rope_bases or (10000.0,))[: len(BASE_COLOURS)]
        kinds = [model.rope_of(b) for b in self.bases]  # each base's rotated dims and scaling (Gemma 4: its own)
        self.dims = tuple(d for d, _ in kinds)
        self.ratios = tuple(r for _, r in kinds)
        self.rope_dim = max(self.dims)
        self.ratio = next((r for r in self.ratios if r), ())
        self.n_ctx = model.n_ctx
        self.pair_spin.setRange(0, max(0, self.rope_dim // 2 - 1))
        attends = [x for x in model.layers if not x.recurrent]  # a hybrid's recurrent layers use no positions
        layers = ", ".join(_count(sum(1 for x in attends if x.rope_base == b), model.hybrid, b) for b in self.bases)
        on = (f"{model.rope_dim} of {model.head_dim} head dims" if len(set(self.dims)) == 1 and not model.rope_kinds else
              " / ".join(f"{d} dims at base {b:,.0f}" for b, d in zip(self.bases, self.dims)))
        self.summary.setText(f"{model.name}: d_model {model.dim}, RoPE on {on} "
                             f"({model.rope_mode} pairing), base {layers}, context {model.n_ctx:,}"
                             + (f"; {model.rope_scaling}" if model.rope_scaling else "") + _recurrent_note(model))
        self.redraw()

    def set_t5_tables(self, tables: object) -> None:
        """An encoder-decoder model's position bias tables (engine.observe.t5_maps.T5PositionTables)."""
        self.t5.set_tables(tables)  # type: ignore[arg-type]

    def set_tokens(self, tokens: list[str]) -> None:
        """The current context: its tokens go on the unit circle and set the plotted positions (cheap: streaming calls it)."""
        self.tokens = list(tokens)
        want = int(np.clip(len(self.tokens), MIN_POSITIONS, MAX_POSITIONS))
        if want != self.pos_spin.value():
            self.pos_spin.setValue(want)  # redraws the heatmap and the shift check
        self._draw_circle()
        self._draw_context()

    def redraw(self) -> None:
        self._draw_pe()
        self._draw_freqs()
        self._draw_circle()
        self._draw_dots()
        self._draw_shift()
        self._draw_distance()

    def series(self) -> list[Series]:
        """The frequency sets the distance panel compares: one per RoPE base (and the unscaled one, if scaled)."""
        out = []
        layers = self.model.layers if self.model is not None else ()
        for k, b in enumerate(self.bases):
            mine = [x for x in layers if x.rope_base == b and not x.recurrent]
            windows = sorted({x.window for x in mine if x.window})
            where = ""
            if mine:
                kind = f"local, sliding window {windows[0]:,}" if windows else ("global" if len(self.bases) > 1 else "")
                where = f" · {len(mine)} layer{'s' if len(mine) != 1 else ''}" + (f" ({kind})" if kind else "")
            scaled = " with the model's RoPE scaling" if self.ratios[k] else ""
            out.append(Series(f"base {b:,.0f}{where}{scaled}", BASE_COLOURS[k], self._freqs(k)))
        if self.ratio:
            k = self._scaled_base()
            out.append(Series(f"base {self.bases[k]:,.0f} before the scaling (no frequency factors)", BASE_COLOURS[k],
                              rope_freqs(self.dims[k], self.bases[k]), dashed=True))
        return out

    # ---- panels

    def _freqs(self, k: int) -> np.ndarray:
        """The frequencies of base k as the model rotates by them (its RoPE scaling applied), one per rotated pair of
        the layers with that base."""
        return scaled_freqs(self.dims[k], self.bases[k], self.ratios[k])

    def _scaled_base(self) -> int:
        """The first base whose layers scale their frequencies (the dashed 'before the scaling' curve's)."""
        return next((k for k, r in enumerate(self.ratios) if r), 0)

    def _positions(self) -> int:
        return self.pos_spin.value()

    def _draw_pe(self) -> None:
        pe = sinusoidal_encoding(self._positions(), self.d_model).astype(np.float32)
        self.pe_image.setImage(pe, autoLevels=False, levels=(-1.0, 1.0))
        self.pe_plot.setTitle(f"Sinusoid PE, d_model = {self.d_model} (Vaswani §3.5)")

    def _draw_freqs(self) -> None:
        w = wavelengths(sinusoid_freqs(self.d_model))
        # against i * rope_dim / d_model: the same geometric ladder, so base 10,000 lies on the sinusoid's line
        self.sinusoid_curve.setData(np.arange(len(w)) * (self.dims[0] / self.d_model), w)
        for k, curve in enumerate(self.freq_curves):
            if k < len(self.bases):
                wl = _wavelengths(self._freqs(k))
                curve.setData(np.arange(len(wl)), wl, connect="finite")
            curve.setVisible(k < len(self.bases))
        k0 = self._scaled_base()
        plain = wavelengths(rope_freqs(self.dims[k0], self.bases[k0]))  # dotted: before the model's scaling
        self.unscaled_curve.setData(np.arange(len(plain)), plain)
        self.unscaled_curve.setVisible(bool(self.ratio))
        self.ctx_line.setValue(np.log10(max(2, self.n_ctx)))
        _line_text(self.ctx_line, f"context {self.n_ctx:,}")
        self._draw_pair_marker()
        keys = [_key(c, f"RoPE base {b:,.0f} ({d // 2} pairs)") for c, b, d in zip(BASE_COLOURS, self.bases, self.dims)]
        if self.ratio:
            keys.append(_key(BASE_COLOURS[k0], f"base {self.bases[k0]:,.0f} before the model's RoPE scaling", dashed=True))
        keys.append(_key(GREY, f"sinusoid, d_model {self.d_model}, base 10,000 (pair index rescaled to RoPE's)", dashed=True))
        self.legend.setText("&nbsp;&nbsp;&nbsp;".join(keys))
        self.freq_plot.setTitle("Tokens per turn of each pair")

    def _draw_pair_marker(self) -> None:
        self.pair_line.setValue(self.pair_spin.value())

    def _draw_circle(self) -> None:
        i = self.pair_spin.value()
        n = len(self.tokens) or 32
        positions = np.arange(max(0, n - MAX_CIRCLE_POINTS), n)
        fade = (60 + 195 * positions / max(1, n - 1)).astype(int)
        title = [f"pair {i}"]
        for k, ring in enumerate(self.rings):
            if k >= len(self.bases):
                ring.setVisible(False)
                continue
            freqs = self._freqs(k)
            if i >= len(freqs):  # this base's layers rotate fewer pairs (Gemma 4's sliding blocks)
                ring.setVisible(False)
                continue
            ang = rope_pair_angles(positions, freqs, i)
            r = 1.0 - 0.12 * k  # one ring per base so both stay readable
            c = BASE_COLOURS[k]
            ring.setData(r * np.cos(ang), r * np.sin(ang), brush=[pg.mkBrush(*c, a) for a in fade])
            ring.setVisible(True)
            title.append(f"<span style='color:rgb{c}'>{2 * np.pi / freqs[i]:,.1f}</span>")
        freqs = max((self._freqs(k) for k in range(len(self.bases))), key=len)
        for j, label in enumerate(self.labels):
            p = j
            if p >= n:
                label.setVisible(False)
                continue
            a = float(rope_pair_angles([p], freqs, i)[0])
            r_label = 1.18 + 0.14 * (int(p * freqs[i] // (2 * np.pi)) % 2)  # alternate turns apart
            text = token_label(self.tokens[p], 10) if self.tokens else str(p)
            label.setText(f"{p}:{text}")
            label.setPos(r_label * np.cos(a), r_label * np.sin(a))
            label.setVisible(True)
        self.circle_plot.setTitle(f"{title[0]}: tokens per turn " + " / ".join(title[1:]))

    def _draw_dots(self) -> None:
        far = int(min(max(self.n_ctx, 256), 8192))
        dist = np.arange(far)
        for k, curve in enumerate(self.dot_curves):
            if k < len(self.bases):
                s = rope_score_vs_distance(self._freqs(k), dist)
                curve.setData(dist, s / s[0])
            curve.setVisible(k < len(self.bases))
        w = sinusoid_freqs(self.d_model)
        pe_dot = np.cos(dist[:, None] * w[None, :]).sum(axis=1)  # PE(p) . PE(p + k) = sum_i cos(k w_i)
        self.dot_sinusoid.setData(dist, pe_dot / pe_dot[0])
        self.dot_plot.setTitle("q·k against distance m − n (q = k = 1); dashed: sinusoid")
        self._draw_context()

    def _draw_context(self) -> None:
        """The current chat's length: on q.k against distance, and on the wavelengths (pairs slower than it have
        not turned once within the chat)."""
        self.cur_line.setValue(np.log10(max(2, len(self.tokens))))
        _line_text(self.cur_line, f"this chat: {len(self.tokens):,} tokens")
        self.cur_line.setVisible(bool(self.tokens))
        self.dot_ctx.setValue(len(self.tokens))
        _line_text(self.dot_ctx, f"current context: {len(self.tokens):,}")
        self.dot_ctx.setVisible(bool(self.tokens))
        self.dot_d.setValue(self.offset_spin.value())
        _line_text(self.dot_d, f"d = {self.offset_spin.value():,}")

    def _draw_distance(self) -> None:
        """Every base's per-pair angle and q.k share at d = the offset k, and RoPE's own relative-position check."""
        k = self.offset_spin.value()
        self.distance.show_distance(self.series(), k, self.pair_spin.value())
        self._draw_context()

    def _draw_shift(self) -> None:
        """M_k for the plotted encoding and the numeric check PE(pos + k) = M_k PE(pos)."""
        k = self.offset_spin.value()
        pe = sinusoidal_encoding(self._positions(), self.d_model)
        m_k = relative_rotation(k, sinusoid_freqs(self.d_model), self.d_model)
        self.last_error = shift_error(pe, k, m_k)
        d = min(M_K_SHOWN, self.d_model)
        self.mk_image.setImage(m_k[:d, :d].astype(np.float32), autoLevels=False, levels=(-1.0, 1.0))
        self.mk_plot.setTitle(f"M_k, k = {k} (first {d} of {self.d_model} dims)")
        pairs = max(0, self._positions() - k)
        mode = self.model.rope_mode if self.model is not None else "norm"
        known = mode in ("norm", "neox")  # an architecture whose pair layout is unknown: the check assumes adjacent pairs
        check_mode, label = (mode, mode) if known else ("norm", "norm (assumed)")
        self.rope_error = max((rope_relative_check(self._freqs(j), self.dims[j], check_mode, k, self._positions())
                               for j in range(len(self.bases))), default=0.0)
        self.check.setText(
            f"Checks at k = {k} over {pairs} positions: RoPE (the model's own rotation, {label} pairs, every base): "
            f"max |q_m·k_(m−{k}) − formula(k)| / (|q||k|) = {self.rope_error:.1e}, the same for every m: the score "
            f"depends on the distance only.   Sinusoid: max |PE(pos + {k}) − M_{k} · PE(pos)| over {self.d_model} dims "
            f"= {self.last_error:.2e} (M_k: one 2×2 rotation [[cos kω, sin kω], [−sin kω, cos kω]] per frequency ω)"
        )


def _line_text(line: pg.InfiniteLine, text: str) -> None:
    """Set a line's label now (pyqtgraph's setFormat skips a label that is not on screen, e.g. in a hidden tab)."""
    line.label.format = text.replace("{", "{{").replace("}", "}}")
    line.label.setText(text)


def _key(colour: tuple[int, int, int], text: str, dashed: bool = False) -> str:
    """A legend entry as HTML for a plot title (pyqtgraph legends are avoided: their items are re-created)."""
    mark = "╌╌" if dashed else "━━"
    return f"<span style='color:rgb{colour}'>{mark}</span>&nbsp;{text}"
