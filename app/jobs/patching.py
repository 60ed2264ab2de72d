"""The activation patching jobs on the chat's model, two prompts: the map (engine.intervene.patching) and the effect of
one of its cells patched alone (engine.intervene.hooks) on the corrupted prompt's next token, each on a worker."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from app.jobs.interventions import kld_per_position, top_tokens
from app.jobs.quant import _wait_for_reply
from app.records.compare import TaskProgress
from app.records.patching import PatchEffect, PatchRecord
from engine.errors import LensError, SettingError

if TYPE_CHECKING:
    from app.jobs.session import Emit, Session

EFFECT = "patching-effect"
_KEPT: OrderedDict[tuple, PatchRecord] = OrderedDict()  # finished maps, by model, interventions, prompts and kind
KEEP = 8
_EFFECTS: OrderedDict[tuple, PatchEffect] = OrderedDict()  # measured cells, by the map's key, layer, cell and tag
KEEP_EFFECTS = 256  # a few hundred floats each: every cell of several maps
Say = Callable[[str, float], None]  # what runs, 0..1


def _key(model: object, a: list[int], b: list[int], kind: str) -> tuple:
    """What a map depends on: the model's weights (a requantized tensor is a new object), what is set on it, the two
    token lists, the kind."""
    from engine.intervene import ablation, control_vector, lora  # noqa: PLC0415

    vec = control_vector.current(model)
    on = (ablation.current(model).describe(), vec.describe() if vec is not None else "",
          lora.describe(lora.current(model)))
    weights = tuple(id(lin.weight) for lin in model.net.linears().values())  # type: ignore[attr-defined]
    return id(model), hash(weights), on, tuple(a), tuple(b), kind


def _keep(memo: OrderedDict[tuple, Any], key: tuple, value: object, most: int) -> None:
    memo[key] = value
    while len(memo) > most:
        memo.popitem(last=False)


def _model_and_tokens(session: Session, clean: str, corrupt: str) -> tuple[Any, list[int], list[int]]:
    """The chat's model (checked) and both prompts as plain text, no template. Call under the session's lock."""
    model = session.model
    if model is None:
        raise SettingError("no model is loaded")
    model.gguf.check_unchanged()  # its weights are read through the memory map
    tok = model.tokenizer
    return (model, tok.encode(clean, add_special=True, parse_special=False),
            tok.encode(corrupt, add_special=True, parse_special=False))


def patching_job(session: Session, clean: str, corrupt: str, kind: str, cancel: threading.Event,
                 emit: Emit) -> Iterator[object]:
    """Tokenize both prompts (as plain text, no template), patch, return a PatchRecord; cancelling returns the cells
    done so far."""
    from engine.intervene.patching import PatchingCancelled, patch  # noqa: PLC0415

    yield from _wait_for_reply(session, "patching", cancel)
    t0 = time.perf_counter()
    yield TaskProgress("patching", "the clean and corrupted runs", 0.0)
    with session.lock:
        model, a, b = _model_and_tokens(session, clean, corrupt)
        tok = model.tokenizer
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
                          result.clean_diff, result.corrupt_diff, kind, time.perf_counter() - t0, complete,
                          prompts=(clean, corrupt))
        if complete:
            _keep(_KEPT, key, rec, KEEP)
        return rec


# ---- one cell's effect: the corrupted prompt's next-token distribution without and with that cell patched

def cell_effect(model: Any, clean_ids: list[int], corrupt_ids: list[int], kind: str, layer: int, cell: int,
                cancel: threading.Event, say: Say) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None:
    """log p of the next token at every corrupted position (T, n_vocab), before and after patching the map's cell
    (layer, cell) from the clean run, as engine.intervene.patching patches it; None if cancelled."""
    from engine.intervene.ablation import heads_in  # noqa: PLC0415
    from engine.intervene.hooks import hooked, run_with_cache  # noqa: PLC0415
    from engine.intervene.patching import KINDS  # noqa: PLC0415
    from engine.quality.compare import log_softmax_rows  # noqa: PLC0415

    if len(clean_ids) != len(corrupt_ids):  # the map refused them too: a cell of no map
        raise SettingError(f"the prompts are {len(clean_ids)} and {len(corrupt_ids)} tokens long: a cell is patched "
                           "between prompts of the same length")
    n_layers, heads = model.args.n_layers, kind == "heads"
    if not 0 <= layer < n_layers:
        raise SettingError(f"layer {layer} out of range (the model has {n_layers})")
    n_cells = heads_in(model.net, layer) if heads else len(corrupt_ids)
    if not 0 <= cell < n_cells:
        raise SettingError(f"{'head' if heads else 'position'} {cell} out of range (layer {layer} has {n_cells})")
    name = f"blocks.{layer}.{KINDS[kind]}"
    at = (slice(None), cell) if heads else (cell,)  # a head at every position, or every channel at a position
    say("the clean run", 0.0)
    source = run_with_cache(model, clean_ids, [name])[1][name][at]

    def put(value: np.ndarray, _name: str) -> np.ndarray:
        value = value.copy()
        value[at] = source
        return value

    runs = []
    for what, hooks in (("the corrupted run", []), ("the corrupted run patched", [(name, put)])):
        if cancel.is_set():
            return None
        say(what, (1 + len(runs)) / 3)
        with hooked(model, hooks):
            logits = model.net.forward(list(corrupt_ids), model.new_cache(len(corrupt_ids)), all_logits=True)
        runs.append(log_softmax_rows(logits, out=logits))
    return runs[0], runs[1]


def patch_effect_job(session: Session, clean: str, corrupt: str, kind: str, layer: int, cell: int,
                     cancel: threading.Event, emit: Emit, tag: tuple[object, ...] = ()) -> Iterator[object]:
    """The PatchEffect of the map's cell (layer, cell): kept per prompts, kind, cell, model and `tag`, so asking again
    returns the same record without running; Stop raises (nothing is kept)."""
    yield from _wait_for_reply(session, "patching", cancel)
    t0 = time.perf_counter()
    with session.lock:
        model, a, b = _model_and_tokens(session, clean, corrupt)
        key = (*_key(model, a, b, kind), layer, cell, tag)
        if key in _EFFECTS:
            _EFFECTS.move_to_end(key)
            return _EFFECTS[key]
        say = lambda what, frac: emit(TaskProgress(EFFECT, what, frac))  # noqa: E731
        runs = cell_effect(model, a, b, kind, layer, cell, cancel, say)
        if runs is None:
            raise LensError("stopped: the cell's effect was not measured")
        before, after = runs
        tok = model.tokenizer
        eff = PatchEffect((clean, corrupt), kind, layer, cell, kld_per_position(before, after),
                          tuple(tok.token_text(t) for t in b), top_tokens(tok, before[-1]), top_tokens(tok, after[-1]),
                          time.perf_counter() - t0, tag)
        _keep(_EFFECTS, key, eff, KEEP_EFFECTS)
        return eff


def forget_effects() -> None:
    """Drop every kept cell effect (a model was loaded: they are of the one before)."""
    _EFFECTS.clear()
