"""The lens job as a plain generator (no Qt): a lens computation run on the session between tokens, on the
conversation shown (`in_context`)."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from app.jobs.chat import fit_context as _fit_context  # bound here: what the lenses read is not a reply's prompt
from app.jobs.session import Emit, Session
from app.records.reply import GenerationRequest
from engine.errors import LensError

ATTENTION_MAX_ROWS = 256  # query rows the after-reply attention overview computes


@dataclass(frozen=True)
class LensResult:
    """A lens computation's record, tagged with what the view asked for."""

    kind: str
    record: Any


@dataclass(frozen=True)
class LensProgress:
    """How far a lens job is (reading a chat runs its tokens first): shown with a Stop while it takes long."""

    kind: str
    what: str
    fraction: float


_JOB = threading.local()  # the running lens job's cancel event and emit (each lens job has its own thread)


def lens_job(session: Session, kind: str, compute: Callable[..., Any], emit: Emit,
             cancel: threading.Event | None = None) -> Iterator[object]:
    """Run compute(model, recorder, cache, token_texts) under the session lock (between tokens). `cancel` stops
    it where it runs tokens (reading a conversation: `ensure_context`), which also reports LensProgress."""
    _JOB.cancel, _JOB.emit, _JOB.kind = cancel, emit, kind
    try:
        with session.lock:
            if session.model is None:
                raise LensError("no model is loaded")
            gguf = getattr(session.model, "gguf", None)
            if gguf is not None:  # a file truncated or replaced under the app would fault where the lens reads it
                gguf.check_unchanged()
            record = compute(session.model, session.recorder, session.cache, session.token_texts())
    finally:
        _JOB.cancel = _JOB.emit = None
    yield LensResult(kind, record)


def job_cancel() -> threading.Event | None:
    """The running lens job's cancel event (None outside a lens job)."""
    return getattr(_JOB, "cancel", None)


def job_progress(what: str, unit: str = "tokens") -> Callable[[int, int], None]:
    """A progress callback that reports LensProgress of the running lens job as '<what>: i of n <unit>' (a
    prefill's tokens, an attribution's passes)."""

    def report(done: int, total: int) -> None:
        emit = getattr(_JOB, "emit", None)
        if emit is not None and total:
            emit(LensProgress(str(getattr(_JOB, "kind", "")), f"{what}: {done} of {total} {unit}", done / total))

    return report


_progress = job_progress("reading the chat")


@dataclass(frozen=True)
class InContext:
    """A lens record and the conversation it was computed on (see `in_context`)."""

    record: Any
    context: GenerationRequest
    n_tokens: int = 0  # what the cache holds after it (the status bar's context and KV bytes)
    kv_bytes: int = 0


def in_context(compute: Callable[..., Any], context: GenerationRequest, memo: dict[str, Any],
               generating: Callable[[], bool] = lambda: False,
               wanted: Callable[[GenerationRequest], bool] = lambda _c: True) -> Callable[..., Any]:
    """`compute`, run on the cache holding `context` (the conversation on screen): one prefill first when the
    cache holds another (another version of a reply, a chat reopened after a restart, another chat). Returns
    InContext(record, context), so the GUI can tell a record of the conversation shown from a stale one.

    Never while a reply is being generated (its cache is in use between tokens): then the cache is read as it is.
    Nor when the request is stale by the time it runs (`wanted(context)` False: the screen moved on, or a reply
    started after it was asked): then nothing runs and the record is None, so a late request for an old
    conversation never replaces the cache a newer reply left behind.
    `memo` (kept by the caller, touched on the worker only) remembers the context the cache was last brought to,
    so the lens requests that follow cost no tokenizing.
    """

    def run(model: Any, recorder: Any, cache: Any, texts: list[str]) -> Any:
        if not wanted(context):
            return InContext(None, context)
        if cache is not None and recorder is not None and not generating() and ensure_context(
                model, recorder, cache, context, memo):
            texts = [model.tokenizer.token_text(t) for t in cache.tokens]
        record = compute(model, recorder, cache, texts)
        held = (int(cache.length), int(cache.nbytes)) if cache is not None else (0, 0)
        return InContext(record, context, *held)

    return run


def ensure_context(model: Any, recorder: Any, cache: Any, context: GenerationRequest, memo: dict[str, Any]) -> bool:
    """Bring the cache (and the recorder) to the tokens of `context`; True when it ran anything (call under lock).

    A cache that holds the context is left as it is; otherwise the common prefix is kept and the rest prefilled
    (engine.generate.prefill). A reply's last token is sampled, never run: it is run here, so a chat reads the same
    tokens (and scores the same) right after its reply as when it is reopened (unless the context is full).
    """
    from engine.generate import prefill  # noqa: PLC0415

    held = list(cache.tokens)
    if memo.get("context") == context and memo.get("cache") == id(cache) and memo.get("tokens") == held:
        return False
    ids, _dropped, _warning = _fit_context(model, context, cache.n_ctx)
    ran = False
    if held != ids and not (len(ids) > cache.n_ctx and ids[:-1] == held):
        if prefill(model, ids, cache, recorder=recorder, cancel=getattr(_JOB, "cancel", None),
                   progress=_progress) is None:
            raise LensError("reading the conversation was stopped")
        ran = True
    memo.clear()
    memo.update(context=context, cache=id(cache), tokens=list(cache.tokens))
    return ran
