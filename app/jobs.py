"""Worker jobs as plain generators (no Qt): fetch, load, generate, lens. app/workers.py runs them on threads."""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from app.kv_info import KVInfo
from app.replies import GenerationRequest, PrefillProgress, Prepared, ReplyDone, TokenStep, fit_context, token_record
from app.summary import ModelInfo, make_model_info
from engine.errors import FetchError, LensError

if TYPE_CHECKING:
    from app.workers import Session

log = logging.getLogger(__name__)

Emit = Callable[[object], None]
ATTENTION_MAX_ROWS = 256  # query rows the after-reply attention overview computes


@dataclass(frozen=True)
class LoadProgress:
    what: str
    fraction: float


@dataclass(frozen=True)
class Loaded:
    """A model is loaded and in use: its description for the Model lens and the lens record."""

    info: ModelInfo
    record: Any  # app.records.ModelRecord, or None when the lens module is not there
    source: str  # what to remember as the last model (a catalog name or a path)
    n_ctx: int


@dataclass(frozen=True)
class LensResult:
    """A lens computation's record, tagged with what the view asked for."""

    kind: str
    record: Any


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
    model = load_model(source, backend=session.backend, progress=lambda what, frac: emit(LoadProgress(what, frac)))
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
    except BaseException:
        if session.model is not model:
            model.close()
        raise
    if old is not None:
        old.close()
    return Loaded(info, record, remember, n_ctx)


def _model_record(model: Any) -> Any:
    try:
        from app.records import make_model_record  # noqa: PLC0415
    except ImportError as exc:
        log.warning("lens records unavailable: %s", exc)
        return None
    try:
        return make_model_record(model)
    except Exception:  # noqa: BLE001 - the chat works without the lenses
        log.exception("make_model_record failed")
        return None


def generate_job(session: Session, req: GenerationRequest, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Build the prompt, stream TokenSteps, finish with ReplyDone; marks the session as generating meanwhile."""
    session.generating.set()
    try:
        result = yield from _generate(session, req, cancel, emit)
    finally:
        session.generating.clear()
    return result


def _generate(session: Session, req: GenerationRequest, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    from engine.generate import GenerationConfig, generate  # noqa: PLC0415
    from engine.sampler import SamplerSettings  # noqa: PLC0415

    t0 = time.perf_counter()
    sampler = SamplerSettings(req.temperature, req.top_k, req.top_p, req.min_p, req.repeat_penalty, 64, req.seed)
    config = GenerationConfig(max_tokens=req.max_tokens, sampler=sampler, top_logprobs=10, chunk_size=req.chunk_size).check()
    with session.lock:
        model = session.model
        if model is None:
            raise LensError("no model is loaded; open a .gguf file or pick one from the catalog")
        if (session.cache is None or session.cache.n_ctx != session.n_ctx()
                or getattr(session.cache, "cache_type", "F32") != session.cache_type):
            session.fresh_cache()
        cache, recorder = session.cache, session.recorder
        ids, dropped, warning = fit_context(model, req, cache.n_ctx)
    yield Prepared(len(ids), cache.n_ctx, dropped, warning)
    tok = model.tokenizer
    paths: list[str] = []  # the attention path each prefill chunk took

    def progress(done: int, total: int) -> None:
        if done:
            paths.append(str(getattr(getattr(model, "net", None), "attention_path", "") or ""))
        emit(PrefillProgress(done, total))

    steps = generate(model, ids, config, cache=cache, recorder=recorder, cancel=cancel, progress=progress)
    last = None
    n = 0
    while True:
        with session.lock:
            step = next(steps, None)
            info = kv_info(cache, paths) if last is None else None  # the prefill has just run
        if step is None:
            break
        if info is not None:
            yield info
        last = step
        rec = None
        if step.token_id >= 0 and step.finish_reason != "eos":
            rec = token_record(tok, step.token_id, step.logprob, step.top)
            n += 1
        if rec is not None or step.text:
            yield TokenStep(rec, step.text, step.index, time.perf_counter() - t0, step.gen_tok_s)
    with session.lock:
        ctx_used, kv_bytes, n_ctx = cache.length, cache.nbytes, cache.n_ctx
    reason = last.finish_reason if last is not None and last.finish_reason else "cancelled"
    yield ReplyDone(
        reason, n, last.prompt_tokens if last else len(ids), last.prefilled_tokens if last else 0,
        last.prompt_tok_s if last else 0.0, last.gen_tok_s if last else 0.0,
        time.perf_counter() - t0, ctx_used, n_ctx, kv_bytes,
    )
    return None


def kv_info(cache: Any, paths: list[str]) -> KVInfo:
    """The cache's type and bytes now and at its full context, and the prefill chunks' attention paths."""
    return KVInfo(str(getattr(cache, "cache_type", "F32")), int(cache.nbytes), int(cache.bytes_for(cache.n_ctx)),
                  int(cache.length), int(cache.n_ctx), tuple(p for p in paths if p))


def lens_job(session: Session, kind: str, compute: Callable[..., Any], emit: Emit) -> Iterator[object]:
    """Run compute(model, recorder, cache, token_texts) under the session lock (between tokens)."""
    with session.lock:
        if session.model is None:
            raise LensError("no model is loaded")
        record = compute(session.model, session.recorder, session.cache, session.token_texts())
    yield LensResult(kind, record)
