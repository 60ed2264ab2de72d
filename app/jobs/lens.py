"""The lens job as a plain generator (no Qt): a lens computation run on the session between tokens."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

from app.jobs.session import Emit, Session
from engine.errors import LensError

ATTENTION_MAX_ROWS = 256  # query rows the after-reply attention overview computes


@dataclass(frozen=True)
class LensResult:
    """A lens computation's record, tagged with what the view asked for."""

    kind: str
    record: Any


def lens_job(session: Session, kind: str, compute: Callable[..., Any], emit: Emit) -> Iterator[object]:
    """Run compute(model, recorder, cache, token_texts) under the session lock (between tokens)."""
    with session.lock:
        if session.model is None:
            raise LensError("no model is loaded")
        record = compute(session.model, session.recorder, session.cache, session.token_texts())
    yield LensResult(kind, record)
