"""Step through one attention cell: q, q·kⱼ, the scaling, the causal mask, softmax, the weighted values, the output.

Pick a layer, a head and a query token (the Attention lens passes the token clicked there); the view asks for a
StepRecord through `step_requested(layer, head, query)` and draws each step with its real numbers and shapes.
Per-key plots share one x axis in token coordinates; keys the mask hides are hatched grey.
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QSpinBox, QSplitter, QVBoxLayout, QWidget

from app.records.attention import StepRecord, describe_scale
from app.records.model import ModelRecord
from app.views.attention.scaling import FitLabel, ScalingPanel, fit_title
from app.views.common.tokens import TokenAxis, token_label

BLUE, RED, ORANGE = (31, 119, 180), (214, 39, 40), (230, 120, 20)
MASKED = QBrush(QColor(150, 150, 150), Qt.BrushStyle.BDiagPattern)
TITLE = dict(size="8pt", color="#333")
KEY_STEPS = ("dots", "scaled", "masked", "weights")
MIX_KEYS = 12  # rows of the w·v image


def _plot(layout: pg.GraphicsLayoutWidget, row: int, tokens: bool) -> pg.PlotItem:
    axes = {"bottom": TokenAxis("bottom")} if tokens else {}
    p = layout.addPlot(row=row, col=0, axisItems=axes)
    p.setMenuEnabled(False)
    p.hideButtons()
    p.getAxis("left").setWidth(52)
    p.showGrid(y=True, alpha=0.2)
    return p


def _signed_bars(plot: pg.PlotItem, values: np.ndarray) -> None:
    """Bars of a (d_k,) vector at components 0..d_k-1, blue for positive, red for negative."""
    plot.clear()
    x = np.arange(values.size) + 0.5
    brushes = [pg.mkBrush(BLUE if v >= 0 else RED) for v in values]
    plot.addItem(pg.BarGraphItem(x=x, height=values, width=0.8, brushes=brushes, pen=None))
    plot.setXRange(0, values.size, padding=0.01)


class StepThroughView(QWidget):
    """softmax(q Kᵀ · scale + mask) V for one (layer, head, query), one plot per step, with the sqrt(d_k) panel."""

    step_requested = Signal(int, int, int)  # layer, head, query token
    hovered = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.record: StepRecord | None = None
        self.texts: tuple[str, ...] = ()
        self._asked: tuple[int, ...] | None = None
        self._build()

    # ---- layout

    def _build(self) -> None:
        self.layer_box, self.head_box, self.query_spin = QComboBox(), QComboBox(), QSpinBox()
        self.query_spin.setKeyboardTracking(False)
        self.query_spin.setToolTip("The query token: its attention row is taken apart below")
        self.query_text = QLabel("")
        self.query_text.setTextFormat(Qt.TextFormat.PlainText)
        bar = QHBoxLayout()
        for w in (QLabel("Layer"), self.layer_box, QLabel("Head"), self.head_box, QLabel("Query token"),
                  self.query_spin, self.query_text):
            bar.addWidget(w)
        bar.addStretch(1)
        self.header = FitLabel()  # as tall as its lines: the scale line under the cell's line is never cut
        self.header.setText("Run a prompt, then pick a layer, a head and a query token.")
        self.keys_view = pg.GraphicsLayoutWidget()
        self.keys_view.setBackground("w")
        # reading order: the left column is steps 1-5 top to bottom (q, then the per-key steps), the right 6-7
        self.q_plot = _plot(self.keys_view, 0, tokens=False)
        self.plots = {name: _plot(self.keys_view, i + 1, tokens=name == "weights") for i, name in enumerate(KEY_STEPS)}
        for name in KEY_STEPS[:-1]:
            self.plots[name].setXLink(self.plots["weights"])
        self.vec_view = pg.GraphicsLayoutWidget()
        self.vec_view.setBackground("w")
        self.mix_plot = self.vec_view.addPlot(row=0, col=0)
        self.mix_plot.setMenuEnabled(False)
        self.mix_plot.hideButtons()
        self.mix_plot.invertY(True)
        self.mix_plot.getAxis("left").setWidth(100)
        self.mix_image = pg.ImageItem(axisOrder="row-major")
        self.mix_plot.addItem(self.mix_image)
        self.mix_image.setColorMap(pg.colormap.get("CET-D1"))
        self.mix_keys: list[int] = []  # the keys drawn as rows of the w·v image
        self.out_plot = _plot(self.vec_view, 1, tokens=False)
        self.out_plot.getAxis("left").setWidth(100)  # the same as the image above: linked x ranges line up in pixels
        self.vec_view.ci.layout.setRowStretchFactor(0, 2)
        self.out_plot.setXLink(self.mix_plot)
        self.scaling = ScalingPanel(text_inside=False)
        self.numbers = QLabel("")
        self.numbers.setTextFormat(Qt.TextFormat.RichText)
        self.numbers.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        self.numbers.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        plots = QSplitter(Qt.Orientation.Horizontal)
        plots.addWidget(self.keys_view)
        plots.addWidget(self.vec_view)
        plots.setSizes([560, 440])
        bottom = QWidget()  # "Why ÷ √d_k" over the whole width (a few lines), then the keys' numbers and the charts
        column = QVBoxLayout(bottom)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.scaling.text)
        row = QHBoxLayout()
        row.addWidget(self.numbers, 0)
        row.addWidget(self.scaling, 1)
        column.addLayout(row, 1)
        self.split = QSplitter(Qt.Orientation.Vertical)
        self.split.addWidget(plots)
        self.split.addWidget(bottom)
        self.split.setSizes([560, 250])
        root = QVBoxLayout(self)
        root.setContentsMargins(0, 0, 0, 0)
        root.addLayout(bar)
        root.addWidget(self.header)
        root.addWidget(self.split, 1)
        self.layer_box.activated.connect(lambda _: self.request())
        self.head_box.activated.connect(lambda _: self.request())
        self.query_spin.valueChanged.connect(lambda _: self.request())
        self.keys_view.scene().sigMouseMoved.connect(self._hover_keys)
        self.vec_view.scene().sigMouseMoved.connect(self._hover_vectors)

    # ---- public API

    def set_model(self, model: ModelRecord) -> None:
        """A new model: fill the layer and head pickers (heads name the KV head they read)."""
        self.model, self.record, self.texts, self._asked = model, None, (), None
        for box in (self.layer_box, self.head_box):
            box.blockSignals(True)
            box.clear()
        for layer in model.layers:
            if layer.recurrent:  # no softmax cell to take apart: the Overview's read maps and State show them
                continue
            self.layer_box.addItem(f"{layer.index}" + (f"  (window {layer.window})" if layer.window else ""), layer.index)
        for h in range(model.n_heads):
            self.head_box.addItem(f"h{h} · KV {model.kv_head(h)}" if model.group > 1 else f"h{h}", h)
        for box in (self.layer_box, self.head_box):
            box.blockSignals(False)
        self.layer_box.setToolTip(recurrent_note(model).strip())
        self.set_tokens(())
        self.header.setText(f"{model.name}: {model.n_layers} layers × {model.n_heads} heads, d_k = {model.head_dim}. "
                            "Run a prompt to step through an attention cell." + recurrent_note(model))

    def set_tokens(self, texts: tuple[str, ...] | list[str]) -> None:
        """The tokens of the context (the query picker's range); keeps the chosen query when it still exists."""
        old, query = len(self.texts), self.query_spin.value()
        self.texts = tuple(texts)
        self.query_spin.blockSignals(True)
        self.query_spin.setRange(0, max(0, len(self.texts) - 1))
        if old == 0 or query >= old - 1:  # on the last token: follow the context as it grows
            self.query_spin.setValue(len(self.texts) - 1)
        self.query_spin.blockSignals(False)
        self._label_query()

    def select(self, layer: int | None = None, head: int | None = None, query: int | None = None) -> bool:
        """Move the pickers (without asking); True when something changed."""
        before = self.picks()
        for box, value in ((self.layer_box, layer), (self.head_box, head)):
            i = box.findData(value) if value is not None else -1
            if i >= 0:
                box.setCurrentIndex(i)
        if query is not None:
            self.query_spin.blockSignals(True)
            self.query_spin.setValue(int(query))
            self.query_spin.blockSignals(False)
        self._label_query()
        return self.picks() != before

    def picks(self) -> tuple[int, int, int]:
        """(layer, head, query) the pickers show."""
        layer = self.layer_box.currentData()
        return int(layer if layer is not None else 0), int(self.head_box.currentData() or 0), self.query_spin.value()

    def stale(self) -> bool:
        """Whether the pickers (or the context) moved past the record shown and nothing was asked for yet."""
        if self.model is None or not self.texts:
            return False
        want = (*self.picks(), len(self.texts))
        rec = self.record
        have = None if rec is None else (rec.cell.layer, rec.cell.head, rec.cell.query_index, rec.n_tokens)
        return want != have and want != self._asked

    def request(self) -> None:
        """Ask for the cell the pickers describe."""
        self._label_query()
        if self.model is not None and self.texts:
            self._asked = (*self.picks(), len(self.texts))
            self.step_requested.emit(*self.picks())

    def set_record(self, rec: StepRecord) -> None:
        """Draw every step of the record's cell."""
        self.record = rec
        c = rec.cell
        self.texts = rec.token_texts if len(rec.token_texts) >= len(self.texts) else self.texts
        self.set_tokens(self.texts)
        self.select(c.layer, c.head, c.query_index)
        group = ""
        if c.group > 1:
            heads = rec.group_heads
            group = f" reads KV head {c.kv_head} of {rec.n_kv_heads} (GQA: h{heads[0]}–h{heads[-1]} share it)"
        window = f" · sliding window {c.window}" if c.window else ""
        self.header.setText(
            f"Layer {c.layer}, head {c.head}{group}{window} · query token {c.query_index} "
            f"“{token_label(rec.token(c.query_index), 24)}” of {rec.n_tokens} · d_k = {c.d_k}\n"
            f"Scale {describe_scale(c)} · K, V read from the {rec.cache_type} KV cache · {rec.elapsed_s * 1000:.0f} ms"
            + (f"\nLearned sink: logit {c.sink:.2f} joins the softmax and takes {c.sink_share:.1%} of this row; it "
               "carries no value (attention to nothing)" if c.sink is not None else ""))
        self._draw_keys(rec)
        self._draw_vectors(rec)
        self._draw_numbers(rec)
        self.scaling.set_record(rec)

    # ---- drawing

    def _draw_keys(self, rec: StepRecord) -> None:
        c = rec.cell
        n = c.dots.size
        x = np.arange(n) + 0.5
        vis = c.visible
        shown = {"dots": c.dots, "scaled": c.scaled, "masked": c.masked, "weights": c.weights}
        seen = c.scaled[vis]
        lo, hi = min(0.0, float(seen.min())), max(0.0, float(seen.max()))
        same = bool(np.isclose(c.scale, c.textbook_scale, rtol=1e-5))
        total = f"Σ = {float(c.weights.sum(dtype=np.float64)):.6f}"
        if c.sink is not None:  # gpt-oss: the learned sink logit took the rest of the row and gives nothing back
            total += f" (+ sink {c.sink:.2f} → {c.sink_share:.3f})"
        titles = {  # each title longest first: a plot shows the longest drawn whole in its width
            "dots": (f"② q·kⱼ: K {c.keys.shape} · q {c.q.shape} → {c.dots.shape}", f"② q·kⱼ → {c.dots.shape}",
                     "② q·kⱼ"),
            "scaled": ((f"③ × {c.scale:.4g}" + (f" = ÷ √{c.d_k}" if same else
                                               f" (the model's; ÷ √{c.d_k} = × {c.textbook_scale:.4g})")
                        + f" → {c.scaled.shape}"),
                       f"③ × {c.scale:.4g}" + (f" = ÷ √{c.d_k}" if same else " (the model's)"), f"③ × {c.scale:.4g}"),
            "masked": (f"④ mask{' + window' if c.window else ''}: {int(vis.sum())} of {n} keys visible, rest −∞ "
                       "(hatched)", f"④ mask: {int(vis.sum())} of {n} keys visible", f"④ mask: {int(vis.sum())}/{n}"),
            "weights": (f"⑤ softmax {c.weights.shape}: {total}", f"⑤ softmax: {total}", "⑤ softmax"),
        }
        for name, p in self.plots.items():
            p.clear()
            fit_title(p, *titles[name], **TITLE)
            v = shown[name]
            if name == "masked":
                p.addItem(pg.BarGraphItem(x=x[vis], height=v[vis], width=0.8, brush=pg.mkBrush(BLUE), pen=None))
                if (~vis).any():
                    p.addItem(pg.BarGraphItem(x=x[~vis], y0=lo, height=hi - lo, width=0.9, brush=MASKED,
                                              pen=pg.mkPen((150, 150, 150))))
            else:
                colour = ORANGE if name == "weights" else BLUE
                brushes = [pg.mkBrush(colour) if ok else MASKED for ok in vis]
                pens = [None if ok else pg.mkPen((150, 150, 150)) for ok in vis]
                height = np.where(vis, v, 0.0) if name == "weights" else v
                p.addItem(pg.BarGraphItem(x=x, height=height, width=0.8, brushes=brushes, pens=pens))
            p.addItem(pg.InfiniteLine(c.query_index + 1, pen=pg.mkPen((230, 30, 30), width=1, style=Qt.PenStyle.DashLine)))
        self.plots["weights"].getAxis("bottom").set_tokens(rec.token_texts)
        right = min(n, c.query_index + 1 + max(3, (c.query_index + 1) // 6))
        self.plots["weights"].setXRange(0, right, padding=0.01)
        for p in self.plots.values():
            p.enableAutoRange(axis="y")

    def _draw_vectors(self, rec: StepRecord) -> None:
        c = rec.cell
        norm = f"|q| = {np.linalg.norm(c.q):.3g}"
        fit_title(self.q_plot, f"① q (after RoPE) {c.q.shape}, {norm}", f"① q {c.q.shape}, {norm}", "① q", **TITLE)
        _signed_bars(self.q_plot, c.q)
        # only the keys with the most weight: the rest add almost nothing and would leave the image blank
        keys = sorted(rec.top_keys(MIX_KEYS))
        self.mix_keys = keys
        mix = c.weights[keys, None] * c.values[keys]  # (k, d_k): wⱼ vⱼ of those keys
        row_top = np.abs(mix).max(axis=1, keepdims=True)
        shown = mix / np.where(row_top > 0, row_top, 1.0)  # each row on its own scale: a key of weight 0.01 still shows
        self.mix_image.setImage(shown, autoLevels=False, levels=(-1.0, 1.0))
        self.mix_image.setRect(0, 0, c.d_k, len(keys))
        self.mix_plot.getAxis("left").setTicks([[(i + 0.5, f"{j} {token_label(rec.token(j), 6)} {c.weights[j]:.2f}")
                                                 for i, j in enumerate(keys)]])
        self.mix_plot.setYRange(0, max(1, len(keys)), padding=0)
        self.mix_plot.setXRange(0, c.d_k, padding=0.01)
        share = float(c.weights[keys].sum())
        fit_title(self.mix_plot, f"⑥ wⱼ·vⱼ, top {len(keys)} keys (Σw {share:.2f})", f"⑥ wⱼ·vⱼ, top {len(keys)} keys",
                  "⑥ wⱼ·vⱼ", **TITLE)
        self.mix_plot.setToolTip("Each row is scaled to its own largest |wⱼ·vⱼ| (blue −, red +), so keys of small "
                                 "weight still show their values; the labels give each key's weight")
        norm = f"|o| = {np.linalg.norm(c.output):.3g}"
        fit_title(self.out_plot, f"⑦ output {c.output.shape}, {norm}", f"⑦ output, {norm}", "⑦ output", **TITLE)
        _signed_bars(self.out_plot, c.output)

    def _draw_numbers(self, rec: StepRecord) -> None:
        c = rec.cell
        rows = "".join(
            f"<tr><td align=right>{j}</td><td>{html.escape(token_label(rec.token(j), 14))}</td>"
            f"<td align=right>{c.dots[j]:.3f}</td><td align=right>{c.scaled[j]:.3f}</td>"
            f"<td align=right><b>{c.weights[j]:.4f}</b></td>"
            f"<td align=right>{np.linalg.norm(c.weights[j] * c.values[j]):.3f}</td></tr>"
            for j in rec.top_keys(6)
        )
        self.numbers.setText(
            "<b>Keys with the most weight</b><table cellspacing=0 cellpadding=2>"
            "<tr style='color:#555'><td>key</td><td>token</td><td>q·k</td><td>scaled</td><td>weight</td>"
            f"<td>|w·v|</td></tr>{rows}</table>"
        )

    # ---- hover

    def _hover_keys(self, pos: QPointF) -> None:
        rec = self.record
        if rec is None:
            return
        if self.q_plot.sceneBoundingRect().contains(pos):
            return self._hover_vectors(pos, self.q_plot)
        for p in self.plots.values():
            if p.sceneBoundingRect().contains(pos):
                j = int(np.floor(p.vb.mapSceneToView(pos).x()))
                if 0 <= j < rec.cell.dots.size:
                    self.hovered.emit(self.describe_key(j))
                return

    def _hover_vectors(self, pos: QPointF, only: pg.PlotItem | None = None) -> None:
        rec = self.record
        if rec is None:
            return
        c = rec.cell
        for p in (only,) if only is not None else (self.mix_plot, self.out_plot):
            if p.sceneBoundingRect().contains(pos):
                at = p.vb.mapSceneToView(pos)
                i, j = int(np.floor(at.x())), int(np.floor(at.y()))
                if not 0 <= i < c.d_k:
                    return
                if p is self.mix_plot and 0 <= j < len(self.mix_keys):
                    j = self.mix_keys[j]
                    w, v = c.weights[j], c.values[j, i]
                    self.hovered.emit(f"key {j} “{token_label(rec.token(j), 20)}”, component {i}: "
                                      f"w = {w:.4f} × v = {v:.4f} → {w * v:.5f}")
                elif p is not self.mix_plot:
                    self.hovered.emit(f"component {i}: q = {c.q[i]:.4f}, output = {c.output[i]:.4f}")
                return

    def describe_key(self, j: int) -> str:
        """Every step's number for key j, for the status line."""
        rec = self.record
        assert rec is not None
        c = rec.cell
        head = f"key {j} “{token_label(rec.token(j), 20)}”: q·k = {c.dots[j]:.4f}, scaled = {c.scaled[j]:.4f}"
        if not c.visible[j]:
            return head + ", masked (−∞) → weight 0"
        return head + f", weight = {c.weights[j]:.5f}"

    def _label_query(self) -> None:
        i = self.query_spin.value()
        self.query_text.setText(f"“{token_label(self.texts[i], 20)}”" if 0 <= i < len(self.texts) else "")


def recurrent_note(model: ModelRecord) -> str:
    """Why a hybrid's recurrent layers are not in the layer picker ('' for a model without them)."""
    if not model.hybrid:
        return ""
    from app.records.logit_lens import layer_runs  # noqa: PLC0415 - plain Python

    return (f" Layers {layer_runs(model.recurrent)} are recurrent (gated DeltaNet): no softmax cell to step through, "
            "so only the attention layers are listed; their reads are in the Overview and their state in State.")
