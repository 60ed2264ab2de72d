"""The encoder-decoder lenses' computations (no Qt), run by the engine's lens job between tokens like the others:
the three attention kinds of the last input and output, one cross-attention cell, the position bias tables.

They read the session's cache as it is (the encoding it holds and the decoder tokens run against it): the
conversation-following of the decoder-only lenses (app.jobs.lens.in_context) would prefill the decoder with a
conversation, which an encoder-decoder model does not read.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.records import seq2seq as rec
from engine.errors import LensError

Compute = Callable[[Any, Any, Any, list[str]], Any]


def _check(model: Any) -> None:
    if not getattr(getattr(model, "net", None), "is_encoder_decoder", False):
        raise LensError(f"{getattr(model, 'arch', 'this model')} is not an encoder-decoder model")


def seq2seq_maps() -> Compute:
    """The Seq2SeqRecord of the last input and output (None before anything was written)."""

    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        _check(model)
        run = rec.last_run(cache)
        return None if run is None else rec.make_seq2seq_record(model, *run)

    return compute


def cross_step(layer: int, head: int, query: int) -> Compute:
    """One cross-attention cell of the last output, step by step."""

    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        _check(model)
        run = rec.last_run(cache)
        return None if run is None else rec.make_cross_step(model, *run, layer, head, query)

    return compute


def position_tables() -> Compute:
    """The model's learned position bias against distance (no reply needed)."""

    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        _check(model)
        return rec.make_position_tables(model)

    return compute
