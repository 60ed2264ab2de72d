"""File dialogs start in the model cache, then in the folder of the last file chosen, never where the app started."""
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QFileDialog

from app.views.common import dialogs
from app.views.interventions import InterventionsPanel


def test_dialogs_start_in_the_models_folder_then_the_last_one(qtbot, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "models"
    models.mkdir()
    monkeypatch.setenv("GGUF_LENS_MODELS_DIR", str(models))
    monkeypatch.setattr(dialogs, "_LAST", [])
    monkeypatch.chdir(tmp_path)
    asked: list[str] = []
    chosen = tmp_path / "adapters" / "style.gguf"
    chosen.parent.mkdir()
    chosen.write_bytes(b"")
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda parent, title, start, filters: (asked.append(start), (str(chosen), ""))[1]))
    panel = InterventionsPanel()
    qtbot.addWidget(panel)
    panel.lora._browse()
    assert asked[-1] == str(models) and panel.lora.path.text() == str(chosen)
    panel.cvec._browse()  # the next dialog opens where the last file was
    assert asked[-1] == str(chosen.parent)
    assert asked[-1] != str(tmp_path)
