"""Fetch and load jobs as plain generators (no Qt): download a catalog model, load a file and swap it into the session."""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from app.jobs.session import Emit, Session
from app.records.model_kind import INSTRUCT, ModelKind, model_kind
from app.records.model_info import ModelInfo, make_model_info
from engine.errors import FetchError, LensError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadProgress:
    what: str
    fraction: float


@dataclass(frozen=True)
class Loaded:
    """A model is loaded and in use: its description for the Model lens and the lens record."""

    info: ModelInfo
    record: Any  # app.records.model.ModelRecord, or None when the lens module is not there
    source: str  # what to remember as the last model (a catalog name or a path)
    n_ctx: int
    kind: ModelKind = INSTRUCT  # base or instruct, and the file's quantization
    backend_note: str = ""  # why this backend runs, when that is the ordinary case (no CuPy): for the status bar


def fetch_job(name: str, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Download a catalog model (cancellable); returns its path."""
    from engine.catalog import fetch  # noqa: PLC0415

    yield LoadProgress(f"{name}: checking", 0.0)
    try:
        path = fetch(name, progress=lambda what, frac: emit(LoadProgress(f"{name}: {what}", frac)), cancel=cancel)
    except FetchError:
        if cancel.is_set():
            raise FetchError(f"download of {name} cancelled") from None
        raise
    return path


def load_job(session: Session, source: str, remember: str, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Load a model file, then swap it into the session once no reply is running; returns Loaded."""
    from engine.model import load_model  # noqa: PLC0415

    yield LoadProgress(f"opening {Path(source).name}", 0.0)
    model = load_model(source, backend=session.backend, numerics=session.numerics,
                       progress=lambda what, frac: emit(LoadProgress(what, frac)))
    try:
        if cancel.is_set():
            raise LensError("loading cancelled")
        record = _model_record(model)
        while session.generating.is_set():  # the window stops the reply first; wait for it to end
            time.sleep(0.02)
        with session.lock:
            old = session.model
            session.model = model
            session.fresh_cache()
            n_ctx = session.cache.n_ctx
        info = make_model_info(model, n_ctx)
        info, note = _quiet_backend_note(info, model.backend)
        kind = _kind(model)
    except BaseException:
        if session.model is not model:
            model.close()
        raise
    if old is not None:
        old.close()
    return Loaded(info, record, remember, n_ctx, kind, note)


def _quiet_backend_note(info: ModelInfo, backend: Any) -> tuple[ModelInfo, str]:
    """Take an ordinary backend note (auto without CuPy: the CPU, as expected) out of the warnings."""
    note = str(getattr(backend, "note", "") or "")
    if not note or not getattr(backend, "quiet", False):
        return info, ""
    from app.records.model_info import escape_text  # noqa: PLC0415

    shown = escape_text(note, 500)
    return dataclasses.replace(info, warnings=tuple(w for w in info.warnings if w != shown)), note


def _kind(model: Any) -> ModelKind:
    from engine.catalog import entry_for_file  # noqa: PLC0415

    e = entry_for_file(model.path)
    return model_kind(str(model.path), model.gguf.metadata, None if e is None else e.instruct)


def _model_record(model: Any) -> Any:
    try:
        from app.records.model import make_model_record  # noqa: PLC0415
    except ImportError as exc:
        log.warning("lens records unavailable: %s", exc)
        return None
    try:
        return make_model_record(model)
    except Exception:  # noqa: BLE001 - the chat works without the lenses
        log.exception("make_model_record failed")
        return None
