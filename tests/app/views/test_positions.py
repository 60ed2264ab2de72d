"""PositionsLens with synthetic model records (one and two RoPE bases) and the real SmolLM2 record."""
from __future__ import annotations

import numpy as np

from app.records.model import make_model_record
from app.views.positions import PositionsLens
from engine.models.rope import rope_freqs
from engine.observe.positions import sinusoidal_encoding
from tests.app.test_lenses_common import smollm2_run, synthetic_model_record  # noqa: F401


def _lens(qtbot, **kw) -> PositionsLens:
    lens = PositionsLens()
    qtbot.addWidget(lens)
    lens.resize(1400, 900)
    lens.set_model(synthetic_model_record(**kw))
    return lens


def test_sinusoid_heatmap_at_the_model_width(qtbot) -> None:
    lens = _lens(qtbot)
    img = lens.pe_image.image
    assert img.shape == (128, 64)  # positions x d_model
    np.testing.assert_allclose(img, sinusoidal_encoding(128, 64), atol=1e-6)
    assert "d_model = 64" in lens.pe_plot.titleLabel.text


def test_shift_check_is_shown_and_tiny(qtbot) -> None:
    lens = _lens(qtbot)
    lens.offset_spin.setValue(11)
    assert lens.last_error < 1e-10
    assert "PE(pos + 11)" in lens.check.text() and "e-" in lens.check.text()
    m = lens.mk_image.image
    assert m.shape == (16, 16)
    c, s = np.cos(11.0), np.sin(11.0)  # pair 0 has omega = 1
    np.testing.assert_allclose(m[:2, :2], [[c, s], [-s, c]], atol=1e-6)
    assert m[0, 2] == 0.0  # block diagonal


def test_two_bases_give_two_curves_and_two_rings(qtbot) -> None:
    bases = (10000.0, 10000.0, 1_000_000.0)
    lens = _lens(qtbot, windows=(8, 8, None), bases=bases)
    assert lens.bases == (10000.0, 1_000_000.0)
    assert [c.isVisible() for c in lens.freq_curves] == [True, True, False, False]
    assert "10,000" in lens.legend.text() and "1,000,000" in lens.legend.text() and "sinusoid" in lens.legend.text()
    assert sum(c.isVisible() for c in lens.dot_curves) == 2
    np.testing.assert_allclose(10 ** lens.freq_curves[1].getData()[1], 2 * np.pi / rope_freqs(16, 1_000_000.0), rtol=1e-6)  # log axis
    assert "2 layers" in lens.summary.text() and "(1 layer)" in lens.summary.text()
    lens.set_tokens([f"t{i}" for i in range(10)])
    lens.pair_spin.setValue(3)
    rings = [r for r in lens.rings if r.isVisible()]
    assert len(rings) == 2
    x, y = rings[0].getData()
    ang = np.mod(np.arctan2(y, x), 2 * np.pi)
    np.testing.assert_allclose(ang, np.mod(np.arange(10) * rope_freqs(16, 10000.0)[3], 2 * np.pi), atol=1e-6)
    assert [lab.isVisible() for lab in lens.labels[:11]] == [True] * 10 + [False]
    assert lens.labels[4].textItem.toPlainText() == "4:t4"
    assert lens.dot_ctx.value() == 10
    assert "pair 3" in lens.circle_plot.titleLabel.text


def test_tokens_set_the_positions(qtbot) -> None:
    lens = _lens(qtbot)
    lens.set_tokens(["a"] * 300)
    assert lens.pos_spin.value() == 300 and lens.pe_image.image.shape == (300, 64)
    lens.set_tokens(["a"] * 5)
    assert lens.pos_spin.value() == 128


def test_real_smollm2_positions(qtbot, smollm2_run) -> None:
    lens = PositionsLens()
    qtbot.addWidget(lens)
    lens.set_model(make_model_record(smollm2_run.model))
    lens.set_tokens(smollm2_run.texts)
    assert lens.d_model == 576 and lens.rope_dim == 64 and lens.bases == (100000.0,)
    assert lens.pair_spin.maximum() == 31 and lens.last_error < 1e-10
    assert "100,000" in lens.summary.text()
