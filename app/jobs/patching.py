"""The activation patching job: the chat's model, two prompts, the map (engine.intervene.patching) on a worker."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING

from app.jobs.quant import _wait_for_reply
from app.records.compare import TaskProgress
from app.records.patching import PatchRecord
from engine.errors import SettingError

if TYPE_CHECKING:
    from app.jobs.session import Emit, Session

_KEPT: OrderedDict[tuple, PatchRecord] = OrderedDict()  # finished maps, by model, interventions, prompts and kind
KEEP = 8


def _key(model: object, a: list[int], b: list[int], kind: str) -> tuple:
    """What a map depends on: the model's weights (a requantized tensor is a new object), what is set on it, the two
    token lists, the kind."""
    from engine.intervene import ablation, control_vector, lora  # noqa: PLC0415

    vec = control_vector.current(model)
    on = (ablation.current(model).describe(), vec.describe() if vec is not None else "",
          lora.describe(lora.current(model)))
    weights = tuple(id(lin.weight) for lin in model.net.linears().values())  # type: ignore[attr-defined]
    return id(model), hash(weights), on, tuple(a), tuple(b), kind


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
        key = _key(model, a, b, kind)
        if key in _KEPT:  # the same map on the same model: shown again, not run again
            _KEPT.move_to_end(key)
            return dataclasses.replace(_KEPT[key], cached=True)
        progress = lambda frac: emit(TaskProgress("patching", "patching layer by layer", frac))  # noqa: E731
        try:
            result = patch(model, a, b, kind=kind, progress=progress, cancel=cancel.is_set)
            complete = True
        except PatchingCancelled as stop:
            result, complete = stop.partial, False
        texts = lambda ids: tuple(tok.token_text(t) for t in ids)  # noqa: E731
        rec = PatchRecord(result.scores, texts(a), texts(b), tok.token_text(result.answer), tok.token_text(result.wrong),
                          result.clean_diff, result.corrupt_diff, kind, time.perf_counter() - t0, complete)
        if complete:
            _KEPT[key] = rec
            while len(_KEPT) > KEEP:
                _KEPT.popitem(last=False)
        return rec
