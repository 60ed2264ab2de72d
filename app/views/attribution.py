"""The Why lens: why the model wrote a token of its reply (rather than another), split into the parts that wrote it.

For a token of the last reply (the picker; the last one by default) and an optional contrast token: a waterfall of the
parts that push its logit (or the logit difference) hardest, from the embedding to the logit, in the model's order
(the rest summed in one bar), and every head's share as a layers x heads map (blue pushes the token, red pushes against
it); the input text tinted by each token's input attribution when the engine computed them. A head, an FFN or an
expert picked in the waterfall or the map can be switched off for real ("Confirm by ablation"): the logit
(difference) with and without it, beside what the attribution said. The "A and B (Compare)" tab shows the same
attribution in A and B of the Compare tab's last comparison side by side, and the parts the change moved most; the
"Patching" tab (app.views.attribution_patching.PatchingPanel, asked through its own signals) attribution patching of
the token for a corrupted prompt, checked against real patching.

It asks through `attribution_requested(token_index, contrast, method)` (-1: the last token; method 'ixg': the input
tint too), `ablation_requested((token_index, contrast, kind, layer, index, estimate))` and `stop_requested()`, and
draws what it is given: `set_attribution` (app.records.attribution.AttributionRecord), `set_check` (AblationCheck),
`progress`, `failed`, `waiting`; A and B through `pair_requested((ids, token index, reply start, contrast id))`,
answered with `set_pair` (AttributionPair), `pair_progress`, `pair_failed`. The plots are app.views.attribution_plots's.
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING, ClassVar

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSizePolicy,
                               QSplitter, QStackedWidget, QTabWidget, QTextBrowser, QVBoxLayout, QWidget)

from app.records.attribution import ABLATABLE, AblationCheck, AttributionPair, AttributionRecord
from app.records.model import ModelRecord
from app.views.attention.controls import ElidedLabel, empty_state
from app.views.attribution_patching import PatchingPanel
from app.views.attribution_plots import AttributionPlots, head_limit, tint_colours
from app.views.common.tokens import token_html, token_label

if TYPE_CHECKING:
    from app.views.lenses import LensRequests

NO_MODEL_TEXT = "Load a model to see why it writes each token."
NO_REPLY_TEXT = "Send a message: the Why lens explains the tokens of the model's reply."
PAUSED_TEXT = "Run explains the last token of the reply (Follow replies is off)."
NO_INPUTS_TEXT = ("Tick \"Tint inputs\" to colour the text by each input token's attribution (input x gradient: one "
                  "backward pass more). The waterfall and the head map are exact splits of the logit.")
PAIR_TEXT = ("The same attribution in A and B of the Compare tab's last comparison (the file, and B: another "
             "quantization, file or adapter): what changed between them. Run a comparison there first.")
MOVED = 8  # parts listed as moved most from A to B
INPUT_METHOD = "ixg"  # engine.attribute's input x gradient
TINT_REACH = 0.35  # the tint goes this far from the map's white middle, so the text stays readable


class WhyLens(QWidget):
    """One reply token's logit split into parts (see the module docstring)."""

    title: ClassVar[str] = "Why"
    attribution_requested = Signal(int, str, str)  # (token index, -1: the last; contrast text or #id; input method)
    ablation_requested = Signal(object)  # (token index, contrast, kind, layer, index, estimate)
    stop_requested = Signal()
    pair_requested = Signal(object)  # (token ids, token index, reply start, contrast id or None): A and B of Compare

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.model: ModelRecord | None = None
        self.record: AttributionRecord | None = None
        self.check: AblationCheck | None = None
        self.pair: AttributionPair | None = None
        self.selected: int | None = None  # the part picked (index into the record's arrays)
        self.busy = False
        self._build()

    # ---- layout

    def _build(self) -> None:
        self.token_box = QComboBox()
        self.token_box.setMinimumContentsLength(10)
        self.token_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.token_box.setToolTip("The reply token to explain: the model's logit for it, at the position before it")
        self.contrast_edit = QLineEdit()
        self.contrast_edit.setPlaceholderText("token text or #id (optional)")
        self.contrast_edit.setMinimumWidth(120)
        self.contrast_edit.setToolTip("Explain the logit of the token minus this token's logit: why this token rather "
                                      "than that one")
        self.run_button = QPushButton("Run")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.live_box = QCheckBox("Follow replies")
        self.live_box.setChecked(True)
        self.live_box.setToolTip("Explain the last token of each new reply while this tab is shown")
        self.inputs_box = QCheckBox("Tint inputs")
        self.inputs_box.setToolTip("Also attribute the logit to each input token (input x gradient, a backward pass "
                                   "through the model) and tint the text by it")
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Token"))
        bar.addWidget(self.token_box, 1)
        bar.addWidget(QLabel("rather than"))
        bar.addWidget(self.contrast_edit, 1)
        bar.addWidget(self.run_button)
        bar.addWidget(self.stop_button)
        self.status = ElidedLabel("")
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        status_row = QHBoxLayout()
        status_row.addWidget(self.status, 1)
        status_row.addWidget(self.inputs_box)
        status_row.addWidget(self.live_box)

        self.plots = AttributionPlots()
        self.plots.part_picked.connect(self.select)
        self.pick_label = QLabel("")
        self.pick_label.setWordWrap(True)
        self.confirm_button = QPushButton("Confirm by ablation")
        self.confirm_button.setEnabled(False)
        self.confirm_button.setToolTip("Switch the picked head (or FFN, or expert) off for real, run the same tokens, "
                                       "and compare the logit (difference) with the attribution's share")
        self.check_label = QLabel("")
        self.check_label.setWordWrap(True)
        self.check_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        confirm = QHBoxLayout()
        confirm.addWidget(self.pick_label, 1)
        confirm.addWidget(self.confirm_button)
        self.text = QTextBrowser()
        self.text.setOpenLinks(False)
        self.text.setMinimumHeight(60)
        self.text_note = QLabel(NO_INPUTS_TEXT)
        self.text_note.setWordWrap(True)
        self.text_note.setStyleSheet("color:#666")
        lower = QWidget()
        lower_layout = QVBoxLayout(lower)
        lower_layout.setContentsMargins(0, 0, 0, 0)
        lower_layout.addLayout(confirm)
        lower_layout.addWidget(self.check_label)
        lower_layout.addWidget(self.text_note)
        lower_layout.addWidget(self.text, 1)
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(self.plots)
        self.splitter.addWidget(lower)
        self.splitter.setSizes([480, 200])

        self.views = QTabWidget()
        self.views.setDocumentMode(True)
        self.views.addTab(self.splitter, "This model")
        self.views.addTab(self._build_pair(), "A and B (Compare)")
        self.patching = PatchingPanel()
        self.patching.stop_requested.connect(self._stop)
        self.views.addTab(self.patching, "Patching")
        self.empty = empty_state(NO_MODEL_TEXT)
        self.stack = QStackedWidget()
        self.stack.addWidget(self.empty)
        self.stack.addWidget(self.views)
        root = QVBoxLayout(self)
        root.addLayout(bar)
        root.addLayout(status_row)
        root.addWidget(self.stack, 1)
        self.run_button.clicked.connect(self.run)
        self.stop_button.clicked.connect(self._stop)
        self.contrast_edit.returnPressed.connect(self.run)
        self.token_box.activated.connect(lambda _i: self.run())
        self.confirm_button.clicked.connect(self.confirm)
        self.inputs_box.toggled.connect(lambda _on: self.run() if self.record is not None and not self.busy else None)

    def _build_pair(self) -> QWidget:
        self.pair_button = QPushButton("Explain this token in A and B")
        self.pair_button.setEnabled(False)
        self.pair_button.setToolTip("Load A and B of the Compare tab's last comparison again and split the same "
                                    "token's logit (difference) in both")
        self.pair_status = QLabel(PAIR_TEXT)
        self.pair_status.setWordWrap(True)
        self.pair_status.setStyleSheet("color:#666")
        self.plots_a = AttributionPlots(stacked=True)
        self.plots_b = AttributionPlots(stacked=True)
        self.label_a = QLabel("A")
        self.label_b = QLabel("B")
        sides = QSplitter(Qt.Orientation.Horizontal)
        for label, plots in ((self.label_a, self.plots_a), (self.label_b, self.plots_b)):
            side = QWidget()
            lay = QVBoxLayout(side)
            lay.setContentsMargins(0, 0, 0, 0)
            lay.addWidget(label)
            lay.addWidget(plots, 1)
            sides.addWidget(side)
        self.moved_label = QLabel("")
        self.moved_label.setWordWrap(True)
        self.moved_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        page = QWidget()
        lay = QVBoxLayout(page)
        lay.setContentsMargins(0, 4, 0, 0)
        top = QHBoxLayout()
        top.addWidget(self.pair_button)
        top.addWidget(self.pair_status, 1)
        lay.addLayout(top)
        lay.addWidget(sides, 1)
        lay.addWidget(self.moved_label)
        self.pair_button.clicked.connect(self.request_pair)
        return page

    # ---- public API

    def connect_requests(self, to: LensRequests) -> None:
        self.attribution_requested.connect(to.request_attribution)
        self.ablation_requested.connect(to.request_ablation)
        self.stop_requested.connect(to.stop_attribution)
        self.pair_requested.connect(to.request_attribution_pair)

    def set_model(self, model: ModelRecord) -> None:
        """A new model: nothing of the old one's attributions stays."""
        self.model = model
        self.clear_chat()

    def clear_chat(self) -> None:
        """Another chat or model: the picker, the plots and the check go."""
        self.record = self.check = None
        self.selected = None
        self.token_box.clear()
        self.plots.clear_plots()
        self._clear_pair()
        self.patching.clear()
        self.check_label.setText("")
        self.pick_label.setText("")
        self.confirm_button.setEnabled(False)
        self._set_busy(False)
        self.status.setText("")
        self.empty.setText(NO_MODEL_TEXT if self.model is None else NO_REPLY_TEXT)
        self.stack.setCurrentWidget(self.empty)

    def waiting(self, text: str) -> None:
        """Nothing to explain yet (no model, no reply): say what to do."""
        self._set_busy(False)
        if self.record is None:
            self.empty.setText(text)
            self.stack.setCurrentWidget(self.empty)
        else:
            self.status.setText(text)

    def follow_last(self) -> None:
        """A new reply (or the tab came on screen on another one): explain its last token if following."""
        if self.model is None:
            return
        if self.live_box.isChecked():
            self.token_box.clear()
            self.ask(-1)
        elif self.record is None:
            self.waiting(PAUSED_TEXT)

    def run(self) -> None:
        """Explain the token picked (the last when none is), against the contrast typed."""
        data = self.token_box.currentData()
        self.ask(int(data) if data is not None else -1)

    def ask(self, token_index: int) -> None:
        self._set_busy(True)
        self.status.setStyleSheet("")
        self.status.setText("Attributing…")
        method = INPUT_METHOD if self.inputs_box.isChecked() else ""
        contrast = self.contrast_edit.text()  # a leading space is part of a token (' dog' is not 'dog')
        self.attribution_requested.emit(int(token_index), contrast if contrast.strip() else "", method)

    def confirm(self) -> None:
        """Switch the picked part off for real (the engine answers with set_check)."""
        rec, i = self.record, self.selected
        if rec is None or i is None or str(rec.kinds[i]) not in ABLATABLE:
            return
        contrast = f"#{rec.contrast_id}" if rec.contrast_id is not None else ""
        self._set_busy(True)
        self.check_label.setText(f"Ablating {rec.label(i)}…")
        self.ablation_requested.emit((rec.token_index, contrast, str(rec.kinds[i]), int(rec.layers[i]),
                                      int(rec.indices[i]), float(rec.values[i])))

    def progress(self, text: str) -> None:
        """What the running job is doing (shown while it runs)."""
        if self.busy:
            self.status.setText(text)

    def failed(self, message: str) -> None:
        """The engine refused or failed: say why (the last record stays)."""
        self._set_busy(False)
        self.check_label.setText(self.check_text())  # not "Ablating …" any more: the last check, if any
        if self.record is None:
            self.empty.setText(message)
            self.stack.setCurrentWidget(self.empty)
        self.status.setText(message)
        self.status.setStyleSheet("color:#b03020")

    def stopped(self) -> None:
        self._set_busy(False)
        self.status.setText("Stopped.")
        self.patching.stopped()

    def set_attribution(self, rec: AttributionRecord) -> None:
        """Draw a record: the picker (the last reply's tokens), the waterfall, the head map, the tint."""
        self._set_busy(False)
        same_token = self.record is not None and self.record.token_index == rec.token_index
        self.record, self.check = rec, None
        self.check_label.setText("")
        self._fill_picker(rec)
        self.stack.setCurrentWidget(self.views)
        pair = self.pair
        if pair is not None and (pair.a.token_ids, pair.a.token_index) != (rec.token_ids, rec.token_index):
            self._clear_pair()  # A and B of another token
        self.pair_button.setEnabled(True)
        self.patching.set_record(rec)
        self.status.setText(self.summary())
        self.status.setStyleSheet("")
        self.plots.draw(rec)
        self._draw_text(rec)
        keep = self.selected if same_token and self.selected is not None and self.selected < rec.n_parts else None
        self.select(keep if keep is not None else self._default_pick(rec))

    def request_pair(self) -> None:
        """Ask for the record's token in A and B of the last comparison."""
        rec = self.record
        if rec is None or not rec.token_ids:
            return
        self.pair_button.setEnabled(False)
        self.pair_status.setText("Waiting for the compare lane…")
        self.pair_requested.emit((rec.token_ids, rec.token_index, rec.reply_start, rec.contrast_id))

    def pair_progress(self, text: str) -> None:
        self.pair_status.setText(text)

    def pair_failed(self, message: str) -> None:
        self.pair_status.setText(message)
        self.pair_button.setEnabled(self.record is not None)

    def set_pair(self, pair: AttributionPair) -> None:
        """Draw A and B side by side and list what moved most."""
        self.pair = pair
        self.pair_button.setEnabled(self.record is not None)
        limit = max(head_limit(pair.a), head_limit(pair.b))  # one colour scale: the maps compare
        self.plots_a.draw(pair.a, limit)
        self.plots_b.draw(pair.b, limit)
        for label, name, rec in ((self.label_a, pair.a_label, pair.a), (self.label_b, pair.b_label, pair.b)):
            label.setText(f"<b>{html.escape(name)}</b>: {rec.logit_diff:+.4f}")
        self.pair_status.setText(f"{self.pair_title()} ({pair.elapsed_s:.1f} s)")
        self.moved_label.setText(self.moved_text())

    def pair_title(self) -> str:
        p = self.pair
        if p is None:
            return ""
        return (f"{p.a.describe_target()} at token {p.a.token_index}: {p.a.logit_diff:+.4f} in A, "
                f"{p.b.logit_diff:+.4f} in B ({p.b.logit_diff - p.a.logit_diff:+.4f})")

    def moved_text(self) -> str:
        p = self.pair
        if p is None:
            return ""
        rows = [f"{html.escape(label)} {a:+.3f} → {b:+.3f} ({b - a:+.3f})" for label, a, b in p.moved(MOVED)]
        return "What the change moved most: " + " · ".join(rows)

    def _clear_pair(self) -> None:
        self.pair = None
        self.plots_a.clear_plots()
        self.plots_b.clear_plots()
        self.label_a.setText("A")
        self.label_b.setText("B")
        self.moved_label.setText("")
        self.pair_status.setText(PAIR_TEXT)
        self.pair_button.setEnabled(False)

    def set_check(self, check: AblationCheck) -> None:
        """What the real ablation did, beside the attribution's share."""
        self._set_busy(False)
        self.check = check
        self.check_label.setText(self.check_text())
        self.status.setText(self.summary())
        self.plots.show_check(check)

    # ---- text (also what the tests read)

    def summary(self) -> str:
        rec = self.record
        if rec is None:
            return ""
        what = "logit" if rec.contrast_text is None else "logit difference"
        return (f"{what} of {rec.describe_target()} at token {rec.token_index}: {rec.logit_diff:+.4f} "
                f"({rec.n_parts} parts, {rec.numerics} numerics, {rec.elapsed_s:.2f} s)")

    def check_text(self) -> str:
        c = self.check
        if c is None:
            return ""
        return (f"{c.label} switched off: {c.base:+.4f} → {c.ablated:+.4f}, so it adds {c.effect:+.4f} in the real "
                f"run; its direct share (attribution) is {c.estimate:+.4f}. The difference is what it moves through "
                f"later layers (the dashed bar; {c.elapsed_s:.2f} s).")

    def tint_colours(self) -> list[str]:
        """The background colour of each input token of the tint ('' : no input attributions)."""
        rec = self.record
        return tint_colours(rec.inputs, TINT_REACH) if rec is not None and rec.inputs is not None else []

    # ---- drawing

    def _set_busy(self, on: bool) -> None:
        self.busy = on
        self.stop_button.setEnabled(on)
        self.run_button.setEnabled(not on)
        self._update_confirm()

    def _fill_picker(self, rec: AttributionRecord) -> None:
        want = list(range(max(1, rec.reply_start), len(rec.token_texts)))
        have = [self.token_box.itemData(i) for i in range(self.token_box.count())]
        self.token_box.blockSignals(True)
        if have != want:
            self.token_box.clear()
            for i in want:
                self.token_box.addItem(f"{i}: {token_label(rec.token_texts[i], 24)}", i)
        j = self.token_box.findData(rec.token_index)
        if j < 0:  # a prompt token (not in the reply): listed for this record
            self.token_box.addItem(f"{rec.token_index}: {token_label(rec.token_texts[rec.token_index], 24)}",
                                   rec.token_index)
            j = self.token_box.count() - 1
        self.token_box.setCurrentIndex(j)
        self.token_box.blockSignals(False)

    def _draw_text(self, rec: AttributionRecord) -> None:
        colours = self.tint_colours()
        has = bool(colours)
        self.text_note.setVisible(not has)
        self.text.setVisible(True)
        parts = []
        for i, text in enumerate(rec.token_texts[: rec.token_index]):
            bg = f"background:{colours[i]};" if i < len(colours) else ""
            parts.append(f"<span style='{bg}'>{token_html(text)}</span>")
        target = html.escape(rec.target_text).replace("\n", "⏎") or "∅"
        parts.append(f"<span style='border:1px solid #222; font-weight:bold; color:#1a3f8f'>[{target}]</span>")
        said = (f"Input tokens tinted by their attribution ({html.escape(rec.inputs_method or 'input attribution')}; "
                "blue: for, red: against); " if has else "The text the model read; ")
        head = f"<p style='color:#666'>{said}the token explained in brackets.</p>"
        self.text.setHtml(head + "<p>" + "".join(parts) + "</p>")
        sb = self.text.verticalScrollBar()
        sb.setValue(sb.maximum())

    def _default_pick(self, rec: AttributionRecord) -> int | None:
        """The strongest head (something to confirm at once), else the strongest part."""
        heads = [i for i in rec.top(rec.n_parts) if str(rec.kinds[i]) == "head"]
        top = rec.top(1)
        return heads[0] if heads else (top[0] if top else None)

    def select(self, i: int | None) -> None:
        """Pick part i of the record (outlined in the waterfall and the map)."""
        rec = self.record
        self.selected = i
        self.plots.outline(i)
        if rec is None or i is None:
            self.pick_label.setText("")
            self._update_confirm()
            return
        ok = str(rec.kinds[i]) in ABLATABLE
        self.pick_label.setText(f"Picked: <b>{html.escape(rec.label(i))}</b> {rec.values[i]:+.4f}"
                                + ("" if ok else " (only a head, an FFN or an expert can be switched off)"))
        self._update_confirm()

    def _update_confirm(self) -> None:
        rec, i = self.record, self.selected
        ok = rec is not None and i is not None and str(rec.kinds[i]) in ABLATABLE
        self.confirm_button.setEnabled(bool(ok) and not self.busy)

    # ---- interaction

    def _stop(self) -> None:
        self.stop_requested.emit()
        self.stopped()

    def pick_head(self, layer: int, head: int) -> None:
        """Pick head (layer, head) of the map."""
        if self.record is not None:
            self.select(self.record.find("head", layer, head))
