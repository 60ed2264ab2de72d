"""The backend choice (issue 6): a setting the next model load uses; without a GPU the app says so once."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from app.data.store import Settings
from app.records.kv import backend_setting, numerics_setting
from app.state import AppState
from app.views.chat.sampling import SamplingPanel
from tests.app.test_reliability_app import close, open_window
from tests.tiny_models import make_tiny_llama


def test_setting_round_trip(qtbot: Any) -> None:
    assert backend_setting(Settings()) == "auto"
    assert backend_setting(dataclasses.replace(Settings(), extra={"backend": "tpu"})) == "auto"
    state = AppState(Settings())
    panel = SamplingPanel(state)
    qtbot.addWidget(panel)
    panel.backend.setCurrentIndex(panel.backend.findData("numpy"))
    assert backend_setting(state.settings) == "numpy"
    state.settings = dataclasses.replace(state.settings, extra={"backend": "cupy"})
    assert panel.backend.currentText() == "cupy"


def test_next_load_uses_the_choice_and_auto_says_why_it_runs_on_the_cpu(qtbot: Any, tmp_path: Path, data_dir: Path) -> None:
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed: the CPU fallback note is not expected here")
    except ImportError:
        pass
    path = make_tiny_llama(tmp_path / "m.gguf", n_ctx=128)
    w = open_window(qtbot, path, data_dir)
    assert w.engine.session.backend == "auto"
    model = w.engine.session.model
    assert model.backend.name == "numpy"
    assert any("running on the CPU" in note for note in model.warnings)
    w.state.settings = dataclasses.replace(w.state.settings, extra={**w.state.settings.extra, "backend": "numpy"})
    assert w.engine.session.backend == "numpy"
    close(w)


def test_numerics_setting_round_trip_and_next_load(qtbot: Any, tmp_path: Path, data_dir: Path) -> None:
    assert numerics_setting(Settings()) == "ggml"
    assert numerics_setting(dataclasses.replace(Settings(), extra={"numerics": "float64"})) == "ggml"
    state = AppState(Settings())
    panel = SamplingPanel(state)
    qtbot.addWidget(panel)
    panel.numerics.setCurrentIndex(panel.numerics.findData("float32"))
    assert numerics_setting(state.settings) == "float32"
    path = make_tiny_llama(tmp_path / "m.gguf", n_ctx=128)
    w = open_window(qtbot, path, data_dir)
    assert w.engine.session.numerics == "ggml" and w.engine.session.model.numerics == "ggml"
    w.state.settings = dataclasses.replace(w.state.settings, extra={**w.state.settings.extra, "numerics": "float32"})
    assert w.engine.session.numerics == "float32"
    close(w)
