"""The Compare view: A (the file) against B (the overrides, the file with another KV cache, or another GGUF).

It shows attention of one head in both with their difference, the per-layer divergence, the text
shaded by per-token KLD (click a token for both top-10 next-token distributions), the summary
statistics, and the presets' size-vs-KLD chart. It only draws records; the bridge runs the work.
"""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.records.compare import (
    CACHE_TYPES,
    CompareOptions,
    CompareRecord,
    HeadPair,
    SweepDone,
    SweepPoint,
    TaskProgress,
)
from app.data.overrides import OverrideSpec, eval_text
from app.records.interventions import LoadedAdapter
from app.records.model import ModelRecord
from app.views.attention.logit_pair import LogitPairView
from app.views.compare.charts import LayerCurve, SummaryTable, SweepChart
from app.views.compare.empty import EMPTY, dominant_type, set_empty_text
from app.views.compare.empty import empty_state as _empty_state
from app.views.common.dialogs import open_file
from app.views.compare.heads import HeadPairView
from app.views.compare.pages import AdaptiveSplitter, controls_bar, result_pages
from app.views.compare.source import SourceBox
from app.views.compare.tokens import KldStrip, KldText, TopBars

PRESET_CHOICES = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0",
                  "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")
class CompareView(QWidget):
    """Controls for a comparison and every chart of its result."""

    compare_requested = Signal(object)  # CompareOptions
    cancel_requested = Signal()
    head_requested = Signal(int, int)  # (layer, head) of the last comparison
    sweep_requested = Signal(str)  # the evaluation text
    sweep_cancel_requested = Signal()
    mix_requested = Signal(float, str)  # (budget in bits per weight, the evaluation text)
    apply_requested = Signal(object)  # OverrideSpec for the Quantization lens

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.record: CompareRecord | None = None
        self.other_path: str | None = None
        self.adapter_path: str | None = None
        self.selected = -1
        self.source = SourceBox()  # what B is (app/views/compare/source.py)
        self.choose = QPushButton("Choose GGUF…")
        self.choose_adapter = QPushButton("Choose adapter…")
        self.b_scale = QDoubleSpinBox()
        self.b_scale.setRange(-8.0, 8.0)
        self.b_scale.setSingleStep(0.1)
        self.b_scale.setValue(1.0)
        self.b_scale.setPrefix("× ")
        self.b_scale.setKeyboardTracking(False)  # a value when typing ends, not per keystroke
        self.b_scale.setToolTip("The adapter's scale, as llama.cpp's --lora-scaled")
        self.b_preset = QComboBox()
        self.b_preset.addItems(list(PRESET_CHOICES))
        self.b_preset.setCurrentText("Q4_K_M")
        self.b_preset.setToolTip("B is the file requantized to this preset, as llama-quantize would")
        self.mix_rules: tuple[str, ...] = ()
        self.mix_name = ""
        self.a_cache, self.b_cache = QComboBox(), QComboBox()
        for box in (self.a_cache, self.b_cache):
            box.addItems(list(CACHE_TYPES))
            box.setToolTip("The KV cache type of this side's run (llama.cpp's --cache-type-k/v); the chat's until "
                           "chosen here")
            box.activated.connect(lambda _i, b=box: b.setProperty("chosen", True))  # by hand: kept from then on
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(2, 4096)
        self.max_tokens.setValue(512)
        self.max_tokens.setPrefix("≤ ")
        self.max_tokens.setSuffix(" tokens")
        self.run = QPushButton("Compare")
        self.cancel = QPushButton("Cancel")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setFormat("%p%")  # what runs is said in the status line beside it: the bar holds a number only
        self.progress.setFixedWidth(160)
        self.text = QPlainTextEdit(eval_text())
        self.text.setMaximumHeight(54)
        self.text.setToolTip("Both models read this text; statistics are over every position")
        self.reset_text = QPushButton("Evaluation text")
        self.reset_text.setToolTip("Put the bundled evaluation text back")
        self.idle_text = "Load a model, then Compare. A is the file as it is on disk."  # the status when nothing ran
        self.status = QLabel(self.idle_text)
        self.status.setTextFormat(Qt.TextFormat.RichText)  # every text set is markup with escaped names: an entity
        self.status.setWordWrap(True)  # such as &#x27; renders (Qt's guess took a line without tags for plain text)
        self.overrides_label = "file"
        self.summary = SummaryTable()
        self.layers = LayerCurve()
        self.sweep = SweepChart()
        self.heads = HeadPairView()
        self.kld_text = KldText()
        self.strip = KldStrip()
        self.bars = TopBars()
        self.logit_pair = LogitPairView()  # the logit lens of A and B (app/views/attention/logit_pair.py)
        self._layout()
        self.source.currentIndexChanged.connect(lambda _i: self._source_changed())
        self.source.activated.connect(lambda _i: self._choose_wanted() if self._wants_file() else None)
        self.choose.clicked.connect(self._choose_file)
        self.choose_adapter.clicked.connect(self._choose_adapter)
        self.run.clicked.connect(lambda: self.compare_requested.emit(self.options()))
        self.cancel.clicked.connect(self.cancel_requested)
        self.reset_text.clicked.connect(lambda: self.text.setPlainText(eval_text()))
        self.heads.head_requested.connect(self.head_requested)
        self.kld_text.token_clicked.connect(self.select_token)
        self.strip.token_clicked.connect(self.select_token)
        self.sweep.run_requested.connect(lambda: self.sweep_requested.emit(eval_text()))
        self.sweep.cancel_requested.connect(self.sweep_cancel_requested)
        self.sweep.point_clicked.connect(self.compare_point)
        self.sweep.mix.compare_requested.connect(self.compare_point)
        self.sweep.mix.apply_requested.connect(self._apply_point)
        self.sweep.mix.find_requested.connect(lambda bpw: self.mix_requested.emit(bpw, eval_text()))
        self.b_preset.activated.connect(lambda _i: self.source.setCurrentIndex(self.source.findData("preset")))
        self._source_changed()
        self.set_running(False)

    def _layout(self) -> None:
        bar = controls_bar([[QLabel("A: the file · B:"), self.source, self.b_preset, self.choose, self.choose_adapter,
                             self.b_scale],
                            [QLabel("KV cache A"), self.a_cache, QLabel("B"), self.b_cache], [self.max_tokens]])
        buttons = QVBoxLayout()
        buttons.setSpacing(2)
        run_row = QHBoxLayout()
        run_row.addWidget(self.run)
        run_row.addWidget(self.cancel)
        buttons.addLayout(run_row)
        buttons.addWidget(self.reset_text)
        text_row = QHBoxLayout()
        text_row.addWidget(self.text, 1)
        text_row.addLayout(buttons)
        status_row = QHBoxLayout()
        status_row.addWidget(self.status, 1)
        status_row.addWidget(self.progress)
        self.stacks = {"summary": _empty_state(self.summary, EMPTY["summary"]),
                       "layers": _empty_state(self.layers, EMPTY["layers"]),
                       "heads": _empty_state(self.heads, EMPTY["heads"])}
        tokens = QSplitter(Qt.Orientation.Vertical)
        tokens.addWidget(self.kld_text)
        tokens.addWidget(self.strip)
        tokens.setSizes([150, 90])
        tokens.setChildrenCollapsible(False)
        self.stacks["tokens"] = _empty_state(AdaptiveSplitter(tokens, self.bars, ratio=1.6, share=0.55), EMPTY["tokens"])
        self.middle, self.pages = result_pages({
            "summary": AdaptiveSplitter(self.stacks["summary"], self.stacks["layers"], ratio=1.0, share=0.48,
                                        first_max=340),
            "tokens": self.stacks["tokens"], "sweep": self.sweep, "heads": self.stacks["heads"],
            "logit": self.logit_pair})
        root = QVBoxLayout(self)
        root.addWidget(bar)
        root.addLayout(text_row)
        root.addLayout(status_row)
        root.addWidget(self.middle, 1)

    def show_page(self, key: str) -> None:
        """Bring a page of the results forward: 'summary', 'tokens', 'sweep', 'heads' or 'logit'."""
        self.middle.setCurrentWidget(self.pages[key])

    # ---- public API

    def options(self) -> CompareOptions:
        """The comparison the controls describe."""
        loaded = self.source.loaded_choice()  # an adapter the Experiments tab has on the chat's model
        if loaded is not None:
            source, path, scale = "adapter", loaded.path, loaded.scale
        else:
            source, scale = str(self.source.currentData()), self.b_scale.value()
            path = self.adapter_path if source == "adapter" else self.other_path
        return CompareOptions(
            b_source=source, b_preset=self.b_preset.currentText(), b_scale=scale, b_path=path,
            b_rules=self.mix_rules, b_name=self.mix_name, a_cache=self.a_cache.currentText(),
            b_cache=self.b_cache.currentText(), text=self.text.toPlainText(), max_tokens=self.max_tokens.value(),
            layer=self.heads.layer.value(), head=self.heads.head.value(),
        )

    def set_cache_default(self, cache_type: object) -> None:
        """The chat's KV cache type (one default across the chat and Compare) for each side not chosen by hand."""
        kind = str(cache_type or "").upper()
        for box in (self.a_cache, self.b_cache):
            if not box.property("chosen") and box.findText(kind) >= 0:
                box.setCurrentText(kind)

    def set_model(self, record: ModelRecord) -> None:
        """A model was loaded: results of the previous one are cleared."""
        if self.model is not None and self.model.path == record.path:
            self.model = record
            return
        self.model = record
        self.clear()
        self.logit_pair.clear()
        self.heads.set_shape(record.n_layers, record.n_heads)
        self.heads.head.setValue(0)
        self.heads.layer.setValue(record.n_layers // 2)
        self.sweep.set_file_size(record.total_bytes)
        self.sweep.set_file_type(dominant_type(record))
        self.sweep.mix.set_weights(record.total_weights)
        self.sweep.mix.set_budget(min(record.average_bpw, 4.9))
        self.idle_text = f"A is {html.escape(Path(record.path).name)} as on disk. Choose B and press Compare."
        self.status.setText(self.idle_text)

    def clear(self) -> None:
        """Forget every result (another model was loaded): the empty states come back."""
        self.record = None
        self.selected = -1
        self.summary.setRowCount(0)
        self.layers.clear_record()
        self.heads.pair = None
        self.mix_rules, self.mix_name = (), ""
        self.sweep.clear()
        for stack in self.stacks.values():
            stack.setCurrentIndex(0)

    def compare_point(self, point: SweepPoint) -> None:
        """Compare a point of the sweep in full: B = that preset, mix or the overrides."""
        if point.kind == "preset":
            self.b_preset.setCurrentText(point.name)
            self.source.setCurrentIndex(self.source.findData("preset"))
        elif point.kind == "mix":
            self.mix_rules, self.mix_name = point.rules, point.name
            self.source.setCurrentIndex(self.source.findData("mix"))
        else:
            self.source.setCurrentIndex(self.source.findData("overrides"))
        self.compare_requested.emit(self.options())

    def _apply_point(self, point: SweepPoint) -> None:
        if point.kind == "preset":
            self.apply_requested.emit(OverrideSpec(point.name))
        elif point.kind == "mix":
            self.apply_requested.emit(OverrideSpec(None, point.rules))

    def mix_started(self) -> None:
        self.sweep.set_running(True, "starting the search", 0.0)
        self.sweep.status.setText("Searching the best mix… (sensitivities are cached: a cancelled search resumes)")

    def mix_finished(self, point: SweepPoint | None, message: str = "") -> None:
        self.sweep.set_running(False)
        if point is not None:  # a search at the same size again replaces its point
            self.sweep.points = [p for p in self.sweep.points if not (p.kind == "mix" and p.name == point.name)]
            self.sweep.add_point(point)
            self.sweep.mix.choose(point)
            self.sweep.status.setText(f"{point.name}: KLD {point.kld_mean:.5f} on the evaluation text, "
                                      f"{point.bpw:.3f} bpw (hover for the mix)")
            self.sweep.status.setToolTip(point.detail)
        elif message:
            self.sweep.status.setText(message)

    def set_loaded_adapters(self, adapters: tuple[LoadedAdapter, ...]) -> None:
        """The adapter files the Experiments tab has on the chat's model, each offered as B (the file with it, at its
        scale there); a B chosen among them that is no longer on stays B, as an adapter chosen here."""
        gone = self.source.set_loaded(adapters)
        if gone is not None:
            self.b_scale.setValue(gone.scale)
            self.set_adapter(gone.path)
        self._source_changed()

    def set_overrides(self, spec: OverrideSpec) -> None:
        """The Quantization lens's overrides changed: the B menu names them."""
        self.overrides_label = "file (no overrides set)" if spec.empty else spec.label()
        self.source.set_item(0, f"overrides: {self.overrides_label}")

    def set_running(self, running: bool, what: str = "") -> None:
        """A comparison runs (what it does now, in the status line and the empty summary) or does not; "press
        Compare" is never shown while one runs."""
        self.run.setEnabled(not running)
        self.cancel.setEnabled(running)
        self.progress.setVisible(running)
        for key, stack in self.stacks.items():  # no page says "press Compare" while it runs
            set_empty_text(stack, EMPTY["running"].format(what=what or "starting") if running else EMPTY[key])
        if running:
            self.status.setText(f"Comparing A and B: {html.escape(what or 'starting')}…")
        elif self.status.text().startswith("Comparing A and B"):  # ended without a result or a reason
            self.status.setText(self.idle_text)

    def set_progress(self, p: TaskProgress) -> None:
        """Progress of the comparison or the sweep."""
        if p.task in ("sweep", "mix"):
            self.sweep.set_running(True, p.what, p.fraction)
            return
        self.set_running(True, p.what)
        self.progress.setValue(int(1000 * max(0.0, min(1.0, p.fraction))))

    def set_record(self, rec: CompareRecord) -> None:
        """Draw a finished comparison; the token with the largest KLD is selected."""
        self.record = rec
        self.set_running(False)
        for stack in self.stacks.values():
            stack.setCurrentIndex(1)
        self.summary.set_record(rec)
        self.logit_pair.set_tokens(rec.n_tokens)
        self.layers.set_record(rec)
        self.strip.set_record(rec)
        self.heads.set_shape(rec.n_layers, rec.n_heads)
        s = rec.stats
        self.status.setText(f"<b>A</b> {html.escape(rec.a_label)} ({rec.a_cache} cache) vs <b>B</b> {html.escape(rec.b_label)} "
                            f"({rec.b_cache} cache) · {s.n_tokens} tokens · KLD mean {s.kld_mean:.5f} · "
                            f"same top token {s.same_top_pct:.1f} % · PPL {s.ppl_base:.3f} → {s.ppl_other:.3f} · "
                            f"{routing_text(s)}{rec.elapsed_s:.1f} s")
        self.select_token(int(rec.kld[:-1].argmax()) if rec.n_tokens > 1 else 0)

    def set_heads(self, pair: HeadPair) -> None:
        self.heads.set_pair(pair)

    def select_token(self, i: int) -> None:
        """Show both next-token distributions after token i."""
        rec = self.record
        if rec is None or not 0 <= i < rec.n_tokens:
            return
        self.selected = i
        self.kld_text.set_record(rec, i)
        self.strip.select(i)
        self.bars.show_position(rec, i)
        self.logit_pair.show_position(i)

    def sweep_started(self) -> None:
        self.sweep.start()

    def add_sweep_point(self, point: SweepPoint) -> None:
        self.sweep.add_point(point)

    def sweep_finished(self, done: SweepDone | None, message: str = "") -> None:
        self.sweep.finish(done, message)

    def failed(self, task: str, message: str) -> None:
        """A comparison or sweep failed or was cancelled."""
        if task == "sweep":
            self.sweep.finish(None, f"Sweep stopped: {message}")
            return
        if task == "mix":
            self.mix_finished(None, f"Mix search stopped: {message}")
            return
        self.set_running(False)
        self.status.setText(f"<span style='color:#b00020'>Comparison stopped: {html.escape(message)}</span>")

    def prepare_screenshot(self) -> None:
        """Start a comparison and the preset sweep (python -m app --screenshot PATH --tab Compare)."""
        self.compare_requested.emit(self.options())
        self.sweep_requested.emit(eval_text())

    def screenshot_ready(self) -> bool:
        """True once the comparison, its heads and the sweep have arrived (or failed)."""
        compared = (self.record is not None and self.heads.pair is not None) or "stopped" in self.status.text()
        return compared and self.sweep.run.isEnabled()

    # ---- controls

    def _source_changed(self) -> None:
        self.choose.setVisible(self.source.currentData() == "gguf")
        self.b_preset.setVisible(self.source.currentData() == "preset")
        self.choose_adapter.setVisible(self.source.currentData() == "adapter")
        self.b_scale.setVisible(self.source.currentData() == "adapter")

    def _wants_file(self) -> bool:
        return self.source.currentData() in ("gguf", "adapter") and (
            self.other_path if self.source.currentData() == "gguf" else self.adapter_path) is None

    def _choose_adapter(self) -> None:
        path = open_file(self, "A LoRA adapter (llama.cpp's GGUF format)", "GGUF files (*.gguf)")
        if path:
            self.set_adapter(path)

    def set_adapter(self, path: str) -> None:
        """Use the file with this LoRA adapter as B."""
        self.adapter_path = path
        i = self.source.findData("adapter")
        self.source.set_item(i, f"file + LoRA {Path(path).name}")
        self.source.setCurrentIndex(i)

    def _choose_wanted(self) -> None:
        self._choose_file() if self.source.currentData() == "gguf" else self._choose_adapter()

    def _choose_file(self) -> None:
        path = open_file(self, "Another GGUF of the same model", "GGUF models (*.gguf)")
        if path:
            self.set_other(path)

    def set_other(self, path: str) -> None:
        """Use this GGUF file as B."""
        self.other_path = path
        i = self.source.findData("gguf")
        self.source.set_item(i, f"GGUF: {Path(path).name}")
        self.source.setCurrentIndex(i)


def routing_text(s: Any) -> str:
    """'routing changed in 12.5 % of token-layer pairs (most in layer 3: 25.0 %) · ' for MoE models, else ''
    (s: the record's engine Comparison)."""
    worst = s.routing_most_changed
    if worst is None:
        return ""
    return (f"routing changed in {s.routing_changed_pct:.1f} % of token-layer pairs "
            f"(most in layer {worst.layer}: {worst.changed_pct:.1f} %) · ")
