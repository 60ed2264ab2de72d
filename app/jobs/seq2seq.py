"""The encoder-decoder lenses' computations (no Qt), run by the engine's lens job between tokens like the others:
the three attention kinds of the last input and output, one cross-attention cell, the position bias tables.

They read the conversation on screen (its last input and reply: app.records.seq2seq.chat_run), or the session's
cache as it is while a reply is being written (context None: the encoding it holds and the decoder tokens run
against it). The conversation-following of the decoder-only lenses (app.jobs.lens.in_context) would prefill the
decoder with a conversation, which an encoder-decoder model does not read.
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


def _run(model: Any, cache: Any, context: Any) -> tuple[list[int], list[int]] | None:
    """The input and output to draw: the conversation's (context), else the cache's."""
    return rec.chat_run(model, context) if context is not None else rec.last_run(cache)


def seq2seq_maps(context: Any = None) -> Compute:
    """The Seq2SeqRecord of the last input and output (None before anything was written)."""

    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        _check(model)
        run = _run(model, cache, context)
        return None if run is None else rec.make_seq2seq_record(model, *run)

    return compute


def cross_step(layer: int, head: int, query: int, context: Any = None) -> Compute:
    """One cross-attention cell of the last output, step by step."""

    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        _check(model)
        run = _run(model, cache, context)
        return None if run is None else rec.make_cross_step(model, *run, layer, head, query)

    return compute


def position_tables() -> Compute:
    """The model's learned position bias against distance (no reply needed)."""

    def compute(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        _check(model)
        return rec.make_position_tables(model)

    return compute
