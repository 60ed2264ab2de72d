"""The logit-lens jobs (no Qt): the chat's context, or A and B of the last comparison, decoded layer by layer."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from app.jobs.compare import CompareWorkspace, last_models
from app.records.logit_lens import LogitLensPair, make_logit_lens_record
from engine.errors import LensError


def logit_pair_job(ws: CompareWorkspace, position: int, width: int) -> Iterator[object]:
    """Yield the LogitLensPair of A and B of the last comparison around token `position`."""
    last = ws.last
    if last is None:
        raise LensError("run a comparison first")
    ids: list[Any] = list(last.a.cache.tokens)
    model_a, model_b = last_models(ws)  # closed when the comparison ended: loaded again, and closed again after
    try:
        a = make_logit_lens_record(model_a, ids, position, width=width, label="A")
        b = make_logit_lens_record(model_b, ids, position, width=width, label="B")
    finally:
        ws.release()
    if a is None or b is None:
        raise LensError("the comparison has no tokens")
    yield LogitLensPair(a, b)
