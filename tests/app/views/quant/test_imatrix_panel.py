"""The imatrix panel and heat strip of the Quantization lens, and the imatrix jobs on a real session."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from app.jobs.quant import (
    apply_job,
    imatrix_clear_job,
    imatrix_compute_job,
    imatrix_load_job,
)
from app.jobs.session import Session
from app.records.imatrix import ImatrixRecord
from app.views.quant.lens import QuantLens
from tests.app.test_lenses_common import synthetic_model_record
from tests.app.views.quant.test_lens import _tensor_record
from tests.conftest import SMOLLM2_FILE, model_path

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "imatrix"


def _run(gen):
    items = []
    while True:
        try:
            items.append(next(gen))
        except StopIteration as stop:
            return items, stop.value


def test_lens_draws_the_strip_of_the_shown_tensor(qtbot) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    lens.set_model(synthetic_model_record())
    rec = _tensor_record()
    lens.set_tensor(rec)
    assert lens.detail.importance.isHidden()  # no imatrix: no strip
    values = np.linspace(0.1, 2.0, 256, dtype=np.float32)
    values[7] = 50.0
    im = ImatrixRecord("test.imatrix", 2, 512, ("calib.txt",), {rec.name: values}, 1)
    lens.set_imatrix(im)
    strip = lens.detail.importance
    assert not strip.isHidden()
    assert strip.image.image.shape == (1, 256)
    assert "top columns 7," in strip.caption.text() and rec.name in strip.caption.text()
    assert "test.imatrix" in lens.imatrix_panel.status.text() and lens.imatrix_panel.clear_button.isEnabled()
    lens.set_imatrix(None)
    assert strip.isHidden() and "None" in lens.imatrix_panel.status.text()


def test_panel_busy_state_and_signals(qtbot, monkeypatch: pytest.MonkeyPatch) -> None:
    lens = QuantLens()
    qtbot.addWidget(lens)
    p = lens.imatrix_panel
    p.set_busy(True, "imatrix chunk 1/4", 0.25)
    assert not p.cancel_button.isHidden() and not p.load_button.isEnabled() and p.progress.value() == 250
    with qtbot.waitSignal(p.cancel_requested, timeout=60_000):
        p.cancel_button.click()
    p.show_message("the calibration text is 10 tokens")
    assert p.cancel_button.isHidden() and p.load_button.isEnabled() and "10 tokens" in p.status.text()
    from PySide6.QtWidgets import QFileDialog

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a, **k: ("/tmp/x.txt", "")))
    with qtbot.waitSignal(p.compute_requested, timeout=60_000) as sig:
        p.compute_button.click()
    assert sig.args == ["/tmp/x.txt", 512]


@pytest.fixture
def session():
    path = model_path(SMOLLM2_FILE)
    if path is None:
        pytest.skip(f"model {SMOLLM2_FILE} not found")
    from engine.model import load_model

    s = Session(context_limit=256)
    s.model = load_model(path, warm=False)
    s.fresh_cache()
    yield s
    s.model.close()


def test_imatrix_jobs_on_a_session(session: Session, tmp_path: Path) -> None:
    from app.data.overrides import OverrideSpec
    from app.jobs.quant import requantizer

    fixture = FIXTURES / "smollm2.short.imatrix.gguf"
    if not fixture.is_file():
        pytest.skip("imatrix fixtures not made (tools/make_imatrix_fixtures.py)")
    _, rec = _run(imatrix_load_job(session, str(fixture), threading.Event(), lambda item: None))
    assert isinstance(rec, ImatrixRecord) and rec.matched == len(rec.importance) == 210
    assert requantizer(session).imatrix is not None
    _, applied = _run(apply_job(session, OverrideSpec(None, ("blk\\.0\\.ffn_down=Q4_K",)), threading.Event(),
                                lambda item: None))
    assert applied.types["blk.0.ffn_down.weight"] == "Q4_K"
    _, none = _run(imatrix_clear_job(session, threading.Event(), lambda item: None))
    assert none is None and requantizer(session).imatrix is None
    text = tmp_path / "short.txt"
    text.write_text("A short text.")
    with pytest.raises(Exception, match="at least 2 chunks"):
        _run(imatrix_compute_job(session, str(text), 128, threading.Event(), lambda item: None))
    text.write_text(Path(__file__).resolve().parents[4].joinpath("assets", "imatrix_calibration.txt").read_text())
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(Exception, match="cancelled"):
        _run(imatrix_compute_job(session, str(text), 64, cancel, lambda item: None))
    text.write_text(text.read_text()[:600])  # about 130 tokens: 4 chunks of 32
    progress: list[object] = []
    _, rec = _run(imatrix_compute_job(session, str(text), 32, threading.Event(), progress.append))
    assert rec is not None and rec.chunk_size == 32 and rec.chunk_count >= 2 and rec.matched == 210
    assert any(getattr(p, "task", "") == "imatrix" and p.fraction > 0 for p in progress)
