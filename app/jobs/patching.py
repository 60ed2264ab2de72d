"""The activation patching job: the chat's model, two prompts, the map (engine.intervene.patching) on a worker."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from app.jobs.quant import _wait_for_reply
from app.records.compare import TaskProgress
from app.records.patching import PatchRecord
from engine.errors import SettingError

if TYPE_CHECKING:
    from app.jobs.session import Emit, Session


def patching_job(session: Session, clean: str, corrupt: str, kind: str, cancel: threading.Event,
                 emit: Emit) -> Iterator[object]:
    """Tokenize both prompts (as plain text, no template), patch, return a PatchRecord; cancelling returns the cells
    done so far."""
    from engine.intervene.patching import PatchingCancelled, patch  # noqa: PLC0415

    yield from _wait_for_reply(session, "patching", cancel)
    t0 = time.perf_counter()
    yield TaskProgress("patching", "the clean and corrupted runs", 0.0)
    with session.lock:
        model = session.model
        if model is None:
            raise SettingError("no model is loaded")
        model.gguf.check_unchanged()  # its weights are read through the memory map
        tok = model.tokenizer
        a = tok.encode(clean, add_special=True, parse_special=False)
        b = tok.encode(corrupt, add_special=True, parse_special=False)
        progress = lambda frac: emit(TaskProgress("patching", "patching layer by layer", frac))  # noqa: E731
        try:
            result = patch(model, a, b, kind=kind, progress=progress, cancel=cancel.is_set)
            complete = True
        except PatchingCancelled as stop:
            result, complete = stop.partial, False
        texts = lambda ids: tuple(tok.token_text(t) for t in ids)  # noqa: E731
        return PatchRecord(result.scores, texts(a), texts(b), tok.token_text(result.answer), tok.token_text(result.wrong),
                           result.clean_diff, result.corrupt_diff, kind, time.perf_counter() - t0, complete)
