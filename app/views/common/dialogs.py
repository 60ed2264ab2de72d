"""Where the app's file dialogs start: the folder of the last file chosen in one (models, adapters, control vectors,
importance matrices, texts: one memory for the session), else the model cache (engine.catalog.models_dir), never the
folder the app was started from."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

_LAST: list[str] = []  # the folder of the last file chosen


def start_dir() -> str:
    """The folder a file dialog opens in."""
    if _LAST and Path(_LAST[0]).is_dir():
        return _LAST[0]
    from engine.catalog import models_dir  # noqa: PLC0415 - a path only

    folder = models_dir()
    return str(folder) if folder.is_dir() else str(Path.home())


def remember(path: str) -> None:
    """A file was chosen: the next dialog starts in its folder."""
    if path:
        _LAST[:] = [str(Path(path).parent)]


def open_file(parent: QWidget | None, title: str, filters: str) -> str:
    """QFileDialog.getOpenFileName starting in `start_dir()`; the chosen path ('' when cancelled), remembered."""
    path, _ = QFileDialog.getOpenFileName(parent, title, start_dir(), filters)
    remember(path)
    return path
