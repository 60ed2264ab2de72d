"""The Why lens fed synthetic records: the waterfall's bars add up from 0 to the logit, the head map has the model's
layers x heads with each head's value at its cell, the hover text names the head and its value, the picker lists the
reply's tokens, the input tint colours follow the sign of each input attribution (and is replaced by a note without
them), Confirm asks for the picked part, and refusals are shown."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from PySide6.QtCore import Qt

from app.records.attribution import AblationCheck, AttributionPair, AttributionRecord, make_attribution_record
from app.views.attribution import NO_INPUTS_TEXT, NO_REPLY_TEXT, WhyLens
from app.views.attribution_plots import TOP
from tests.app.test_lenses_common import synthetic_model_record

N_LAYERS, N_HEADS = 3, 4
TEXTS = ("<s>", "user", ":", " hi", "\n", "assistant", ":", " Hello", " there", "!")
REPLY_START = 7


def parts(n_layers: int = N_LAYERS, n_heads: int = N_HEADS) -> tuple[list[str], list[int], list[int], list[float]]:
    """embed, per layer its heads then its FFN and remainder, then the output's remainder, with distinct values."""
    kinds, layers, indices, values = ["embed"], [-1], [-1], [0.5]
    rng = np.random.default_rng(3)
    for layer in range(n_layers):
        for h in range(n_heads):
            kinds.append("head"), layers.append(layer), indices.append(h)
            values.append(float(np.round(rng.normal(0, 1), 3)))
        kinds += ["ffn", "remainder"]
        layers += [layer, layer]
        indices += [-1, -1]
        values += [float(np.round(rng.normal(0, 2), 3)), 0.001]
    kinds.append("remainder"), layers.append(-1), indices.append(-1), values.append(0.01)
    return kinds, layers, indices, values


def engine_result(inputs: object = None) -> SimpleNamespace:
    """What engine.attribute.api.attribute returns, made up (the token at index 9, '!', after position 8)."""
    kinds, layers, indices, values = parts()
    tok = SimpleNamespace
    return SimpleNamespace(
        kinds=np.array(kinds), layers=np.array(layers, np.int32), indices=np.array(indices, np.int32),
        values=np.array(values), logit_diff=float(np.sum(values)), position=8, target=tok(id=33, text="!"),
        contrast=tok(id=44, text="?"), numerics="ggml", inputs=inputs)


def record(inputs: object = None, scale: float = 1.0) -> AttributionRecord:
    result = engine_result(inputs)
    result.values = result.values * np.linspace(1.0, scale, result.values.size)  # B: the later parts scaled
    result.logit_diff = float(np.sum(result.values))
    return make_attribution_record(result, list(TEXTS), REPLY_START, [N_HEADS] * N_LAYERS, 0.25,
                                   tuple(range(100, 100 + len(TEXTS))))


@pytest.fixture
def lens(qtbot) -> WhyLens:
    w = WhyLens()
    qtbot.addWidget(w)
    w.resize(1100, 700)
    w.show()
    w.set_model(synthetic_model_record(N_LAYERS, N_HEADS))
    return w


def test_the_waterfall_adds_up_from_zero_to_the_logit(lens: WhyLens) -> None:
    rec = record()
    lens.set_attribution(rec)
    opts = lens.plots.fall_bars.opts
    x0, width = np.asarray(opts["x0"]), np.asarray(opts["width"])
    bars = lens.plots.bars
    assert len(bars) == TOP + 1 and bars[-1][2] is None  # the top 15 parts and the rest in one bar
    assert sum(v for _, v, _ in bars) == pytest.approx(rec.logit_diff, abs=1e-9)
    run = 0.0
    for row, (_label, value, _i) in enumerate(bars):  # each bar starts where the one before ended
        assert x0[row] == pytest.approx(min(run, run + value)) and width[row] == pytest.approx(abs(value))
        run += value
    assert x0[-1] == pytest.approx(min(0.0, rec.logit_diff)) and width[-1] == pytest.approx(abs(rec.logit_diff))
    top = {rec.label(i) for i in rec.top(TOP)}
    assert {label for label, _, i in bars if i is not None} == top
    ticks = [t for _, t in lens.plots.fall.getAxis("left")._tickLevels[0]]
    assert ticks[0].startswith("embed") and ticks[-1].startswith("= logit")
    assert any(t.startswith("head L") for t in ticks) and any(t.startswith("ffn L") for t in ticks)
    assert "logit difference of '!' rather than '?' at token 9" in lens.status.text()


def test_the_head_map_holds_each_head_at_its_cell_and_hover_names_it(lens: WhyLens) -> None:
    rec = record()
    lens.set_attribution(rec)
    image = lens.plots.image.image
    assert image.shape == (N_LAYERS, N_HEADS)
    i = rec.find("head", 2, 1)
    assert i is not None and image[2, 1] == pytest.approx(rec.values[i])
    lo, hi = lens.plots.image.getLevels()
    assert lo == pytest.approx(-hi) and hi == pytest.approx(np.max(np.abs(rec.heads)))  # centred at 0
    assert lens.plots.describe_head(2, 1).startswith(f"head L2.1: {rec.values[i]:+.4f}")

    class Hover:
        def isExit(self) -> bool:  # noqa: N802 - pyqtgraph's event API
            return False

        def pos(self):  # noqa: ANN202
            return SimpleNamespace(x=lambda: 1.5, y=lambda: 2.5)

    lens.plots._hover(Hover())
    assert lens.plots.toolTip() == lens.plots.describe_head(2, 1)

    class Click(Hover):
        accepted = False

        def button(self):  # noqa: ANN202
            return Qt.MouseButton.LeftButton

        def accept(self) -> None:
            self.accepted = True

    click = Click()
    lens.plots._map_click(click)  # the cell picks its head in the lens, outlined in the map
    assert click.accepted and lens.selected == i and "head L2.1" in lens.pick_label.text()
    assert lens.plots.map_pick.isVisible() and lens.plots.map_pick.rect().topLeft().toTuple() == (1.0, 2.0)


def test_a_layer_with_fewer_heads_says_so() -> None:
    m = make_attribution_record(engine_result(), list(TEXTS), REPLY_START, [4, 2, 4], 0.1).heads
    assert m.shape == (3, 4) and np.isnan(m[1, 3]) and np.isfinite(m[1, 1])


def test_the_picker_lists_the_reply_tokens_and_asks_for_the_one_picked(lens: WhyLens, qtbot) -> None:
    lens.set_attribution(record())
    box = lens.token_box
    assert [box.itemData(i) for i in range(box.count())] == [7, 8, 9]
    assert box.currentData() == 9 and "!" in box.currentText()
    lens.contrast_edit.setText(" ?")
    with qtbot.waitSignal(lens.attribution_requested) as got:
        box.setCurrentIndex(0)
        box.activated.emit(0)
    assert got.args == [7, " ?", ""]  # the leading space kept: it is part of a token
    assert lens.busy and lens.stop_button.isEnabled() and not lens.run_button.isEnabled()
    with qtbot.waitSignal(lens.stop_requested):
        lens.stop_button.click()
    assert not lens.busy
    with qtbot.waitSignal(lens.attribution_requested) as got:  # ticking the tint asks again, with input x gradient
        lens.inputs_box.setChecked(True)
    assert got.args == [7, " ?", "ixg"]


def test_the_input_tint_follows_the_sign_and_is_replaced_by_a_note_without_inputs(lens: WhyLens) -> None:
    lens.set_attribution(record())
    assert lens.tint_colours() == [] and not lens.text_note.isHidden() and lens.text_note.text() == NO_INPUTS_TEXT
    vals = np.array([0.0, 1.0, -1.0, 0.2, 0, 0, 0, 0, -0.5])
    lens.set_attribution(record(SimpleNamespace(values=vals, method="ixg")))
    colours = lens.tint_colours()
    assert len(colours) == 9 and lens.text_note.isHidden()
    rgb = [tuple(int(c[k:k + 2], 16) for k in (1, 3, 5)) for c in colours]
    assert rgb[1][2] > rgb[1][0] and rgb[2][0] > rgb[2][2]  # for: blue, against: red
    assert abs(rgb[0][0] - rgb[0][2]) < 30  # zero: neutral
    html = lens.text.toHtml()
    assert colours[1] in html and "[!]" in html and "ixg" in lens.text.toPlainText()


def test_confirm_asks_for_the_picked_head_and_shows_the_real_change(lens: WhyLens, qtbot) -> None:
    rec = record()
    lens.set_attribution(rec)
    heads = [i for i in rec.top(rec.n_parts) if rec.kinds[i] == "head"]
    assert lens.selected == heads[0] and lens.confirm_button.isEnabled()  # the strongest head, ready to confirm
    lens.pick_head(0, 2)
    i = rec.find("head", 0, 2)
    assert i in [j for _l, _v, j in lens.plots.bars]  # one of the waterfall's parts
    assert lens.selected == i and "head L0.2" in lens.pick_label.text()
    with qtbot.waitSignal(lens.ablation_requested) as got:
        lens.confirm_button.click()
    assert got.args[0] == (9, "#44", "head", 0, 2, pytest.approx(rec.values[i]))
    lens.set_check(AblationCheck("head", 0, 2, 9, base=2.0, ablated=1.25, estimate=float(rec.values[i]), elapsed_s=0.1))
    assert "head L0.2 switched off: +2.0000 → +1.2500, so it adds +0.7500" in lens.check_label.text()
    row = next(r for r, (_l, _v, j) in enumerate(lens.plots.bars) if j == i)
    run = sum(v for _l, v, _j in lens.plots.bars[:row])
    box = lens.plots.fall_check.rect()  # the real effect, dashed, on the part's row from where its bar starts
    assert lens.plots.fall_check.isVisible() and box.width() == pytest.approx(0.75) and box.left() == pytest.approx(run)
    assert box.top() < row < box.bottom()
    lens.select(rec.find("embed", -1, -1))
    assert not lens.confirm_button.isEnabled()  # the embedding cannot be switched off


def test_refusals_are_shown_and_a_new_model_starts_over(lens: WhyLens) -> None:
    lens.failed("contrast 'hello there' is not one token of the vocabulary")
    assert "not one token" in lens.empty.text() and lens.stack.currentWidget() is lens.empty
    lens.set_attribution(record())
    lens.failed("attribution was stopped")
    assert lens.record is not None and "stopped" in lens.status.text()
    t5 = synthetic_model_record(N_LAYERS, N_HEADS)
    lens.set_model(type(t5)(**{**t5.__dict__, "encoder_decoder": True}))
    assert lens.record is None and lens.empty.text() == NO_REPLY_TEXT and lens.token_box.count() == 0  # T5 is explained too


def test_a_and_b_side_by_side_with_what_moved_most(lens: WhyLens, qtbot) -> None:
    a, b = record(), record(scale=0.5)
    lens.set_attribution(a)
    assert lens.pair_button.isEnabled()
    with qtbot.waitSignal(lens.pair_requested) as got:
        lens.pair_button.click()
    assert got.args[0] == (a.token_ids, 9, REPLY_START, 44) and not lens.pair_button.isEnabled()
    lens.pair_progress("attributing token 9 in B")
    assert lens.pair_status.text() == "attributing token 9 in B"
    lens.set_pair(AttributionPair(a, b, "A: the file", "B: Q4_0", 1.5))
    assert lens.plots_a.record is a and lens.plots_b.record is b and lens.plots_a.bars and lens.plots_b.bars
    assert lens.plots_b.image.image[2, 1] == pytest.approx(b.values[b.find("head", 2, 1)])
    lim = max(np.nanmax(np.abs(a.heads)), np.nanmax(np.abs(b.heads)))
    assert lens.plots_a.image.getLevels()[1] == pytest.approx(lim) == lens.plots_b.image.getLevels()[1]  # one scale
    assert "B: Q4_0" in lens.label_b.text() and f"{b.logit_diff:+.4f}" in lens.label_b.text()
    moved = lens.pair.moved(20)
    changes = [abs(vb - va) for _, va, vb in moved]
    assert changes == sorted(changes, reverse=True) and changes[0] > 0
    assert all(not label.startswith("remainder") for label, _, _ in moved)
    first = moved[0]
    assert lens.moved_text().startswith(f"What the change moved most: {first[0]} {first[1]:+.3f} → {first[2]:+.3f}")
    assert f"{b.logit_diff - a.logit_diff:+.4f}" in lens.pair_status.text()
    lens.pair_failed("run a comparison in the Compare tab first")
    assert "Compare tab first" in lens.pair_status.text() and lens.pair_button.isEnabled()
    lens.set_attribution(record(scale=2.0))  # the same token again: A and B stay
    assert lens.pair is not None
    other = make_attribution_record(engine_result(), list(TEXTS), REPLY_START, [N_HEADS] * N_LAYERS, 0.1, (1, 2))
    lens.set_attribution(other)  # another conversation: A and B of the old one go
    assert lens.pair is None and lens.plots_a.record is None and lens.moved_label.text() == ""

