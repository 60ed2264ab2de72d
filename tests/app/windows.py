"""The real window opened on a model file for the lens tests: 1280x800, loaded, greedy sampling and short replies."""
from __future__ import annotations

import dataclasses
from pathlib import Path

from app.data.store import Store
from app.main_window import MainWindow

LOAD_MS = 60_000  # a hang guard, not a speed: a first start compiles kernels on a loaded machine


def greedy_window(qtbot, path: Path, data_dir: Path, max_tokens: int = 8) -> MainWindow:  # noqa: ANN001 - pytest-qt
    w = MainWindow(model=str(path), store=Store(data_dir))
    qtbot.addWidget(w)
    w.resize(1280, 800)
    w.show()
    qtbot.waitUntil(lambda: w.state.model is not None, timeout=LOAD_MS)
    w.state.settings = dataclasses.replace(w.state.settings, temperature=0.0, max_tokens=max_tokens, seed=1)
    return w
