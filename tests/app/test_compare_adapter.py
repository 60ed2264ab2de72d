"""Compare with B = the file plus a LoRA adapter (what the fine-tune changes, by layer and token), on SmolLM2.

The adapter is tools/make_lora_fixtures.py's adapter 'a' (held to llama.cpp's logits in tests/engine/intervene). The
job's per-position KLD equals one computed here from the engine's own runs with and without the adapter; at scale 0
nothing changes; an adapter for another model is refused with its reason; the view asks for the adapter as B.
"""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from app.jobs.compare import CompareWorkspace, compare_job
from app.records.compare import CompareOptions, CompareRecord, TaskProgress
from app.views.compare.view import CompareView
from engine.errors import LensError
from engine.intervene import lora
from engine.model import load_model
from tools.make_lora_fixtures import write_lora

TEXT = "A fine-tune changes some layers more than others, and some tokens more than others. " * 2


def _compare(ws: CompareWorkspace, path: Path, adapter: Path, scale: float) -> CompareRecord:
    opts = CompareOptions(b_source="adapter", b_path=str(adapter), b_scale=scale, text=TEXT, max_tokens=40)
    items = list(compare_job(ws, str(path), opts, None, threading.Event(), lambda item: None))
    return next(i for i in items if isinstance(i, CompareRecord) and not isinstance(i, TaskProgress))


def _logp(path: Path, ids: list[int], adapter: Path | None) -> np.ndarray:
    model = load_model(path)
    try:
        if adapter is not None:
            lora.apply(model, [lora.load(model, adapter, 1.0)])
        x = model.net.forward(ids, model.new_cache(len(ids), "F32"), all_logits=True).astype(np.float64)
        return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)
    finally:
        model.close()


def test_b_is_the_file_with_an_adapter(smollm2_path: Path, tmp_path: Path) -> None:
    adapter = write_lora(tmp_path, "a")
    ws = CompareWorkspace()
    try:
        rec = _compare(ws, smollm2_path, adapter, 1.0)
        assert rec.b_label == f"file + LoRA {adapter.name} x1" and rec.a_label.endswith("(file)")
        ids = [int(i) for i in rec.token_ids]
        p, q = _logp(smollm2_path, ids, None), _logp(smollm2_path, ids, adapter)
        want = (np.exp(p) * (p - q)).sum(-1)
        assert rec.kld.shape == want.shape and np.allclose(rec.kld, want, rtol=1e-3, atol=1e-6)
        assert float(rec.kld.mean()) > 1e-3  # the adapter did something
        assert float(np.abs(_compare(ws, smollm2_path, adapter, 0.0).kld).max()) < 1e-9  # scale 0: the file
        other = tmp_path / "not-an-adapter.gguf"
        other.write_bytes(smollm2_path.read_bytes()[: 1 << 20])
        with pytest.raises(LensError):
            _compare(ws, smollm2_path, other, 1.0)
        again = _compare(ws, smollm2_path, adapter, 1.0)  # the refused file left B as it was
        assert np.array_equal(again.kld, rec.kld)
    finally:
        ws.close()


def test_the_view_asks_for_the_adapter(qtbot, tmp_path: Path) -> None:
    view = CompareView()
    qtbot.addWidget(view)
    view.set_adapter(str(tmp_path / "style.gguf"))
    view.b_scale.setValue(0.5)
    opts = view.options()
    assert (opts.b_source, opts.b_path, opts.b_scale) == ("adapter", str(tmp_path / "style.gguf"), 0.5)
    assert view.source.currentText() == "file + LoRA style.gguf" and not view.b_scale.isHidden()
    view.source.setCurrentIndex(view.source.findData("preset"))
    view._source_changed()
    assert view.b_scale.isHidden() and view.options().b_source == "preset"


def test_an_encoder_decoder_model_is_not_compared(t5_q8_path: Path) -> None:
    ws = CompareWorkspace()
    try:
        with pytest.raises(LensError, match="encoder-decoder \\(T5\\) model is not compared yet"):
            list(compare_job(ws, str(t5_q8_path), CompareOptions(b_source="numerics", text=TEXT, max_tokens=16), None,
                             threading.Event(), lambda item: None))
    finally:
        ws.close()
