"""Requantize jobs on the chat's model as plain generators (no Qt): apply overrides, reset to the file, save a GGUF.

Apply waits for a running reply to end, then holds the session lock while it requantizes (the next
reply waits) and starts a fresh KV cache, since keys and values computed with the old weights no
longer match the model.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from app.data.overrides import OverrideSpec, plan_summary
from app.jobs.session import Emit, Session
from app.records.compare import TaskProgress
from engine.errors import LensError


@dataclass(frozen=True)
class Applied:
    """What the chat's model holds now: the overrides applied (empty: the file) and every tensor's type name."""

    spec: OverrideSpec
    types: dict[str, str]  # tensor name -> ggml type name in memory
    summary: str


@dataclass(frozen=True)
class Saved:
    path: str
    summary: str
    elapsed_s: float


def requantizer(session: Session) -> Any:
    """The session model's Requantizer, made when the model is new (call under the session lock)."""
    from engine.quality.requantize import Requantizer  # noqa: PLC0415

    if session.model is None:
        raise LensError("no model is loaded")
    rq = getattr(session, "requantizer", None)
    if rq is None or rq.model is not session.model:
        rq = Requantizer(session.model)
        session.requantizer = rq
    return rq


def _wait_for_reply(session: Session, task: str, cancel: threading.Event) -> Iterator[object]:
    if session.generating.is_set():
        yield TaskProgress(task, "waiting for the reply to end", 0.0)
    while session.generating.is_set():
        if cancel.is_set():
            raise LensError(f"{task} cancelled")
        time.sleep(0.05)


def apply_job(session: Session, spec: OverrideSpec, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Requantize the chat's model to the overrides; all or nothing (cancel leaves it as it was)."""
    yield from _wait_for_reply(session, "apply", cancel)
    yield TaskProgress("apply", "planning", 0.0)
    with session.lock:
        rq = requantizer(session)
        preset, rules = spec.parsed()
        plan = rq.plan(preset, rules)
        ok = rq.apply(plan, progress=lambda what, frac: emit(TaskProgress("apply", what, frac)), cancel=cancel)
        if not ok:
            raise LensError("requantizing cancelled; the model is unchanged")
        session.fresh_cache()
        types = {n: t.name for n, t in rq.current_types().items()}
    return Applied(spec, types, plan_summary(plan))


def reset_job(session: Session, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Give the chat's model its file's blocks back."""
    yield from _wait_for_reply(session, "reset", cancel)
    yield TaskProgress("reset", "restoring the file's weights", 0.0)
    with session.lock:
        rq = requantizer(session)
        rq.reset()
        session.fresh_cache()
        types = {n: t.name for n, t in rq.current_types().items()}
    return Applied(OverrideSpec(), types, "the file's own types")


def save_job(session: Session, spec: OverrideSpec, path: str, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Write the overrides as a GGUF llama.cpp loads (reusing the applied blocks when they match)."""
    from engine.quality.requantize import check_output_path, quantize_file  # noqa: PLC0415

    t0 = time.perf_counter()
    say = lambda what, frac: emit(TaskProgress("save", what, frac))  # noqa: E731
    yield TaskProgress("save", "planning", 0.0)
    with session.lock:
        rq = requantizer(session)
        src = str(rq.model.path)
        preset, rules = spec.parsed()
        plan = rq.plan(preset, rules)
        applied = rq.applied.types() if rq.applied is not None else {}
        same = plan.types() == applied or (not plan.changed and not applied)
    check_output_path(src, path)
    if same:  # the serialized lane runs no apply meanwhile, so the held blocks stay as planned
        ok = rq.save(path, progress=say, cancel=cancel)
    else:
        ok = quantize_file(src, path, preset, rules, progress=say, cancel=cancel, imatrix=rq.imatrix,
                           imatrix_file=rq.imatrix_file) is not None
    if not ok:
        Path(path).unlink(missing_ok=True)
        raise LensError("saving cancelled")
    return Saved(path, plan_summary(plan), time.perf_counter() - t0)


def _use_imatrix(session: Session, im: Any, label: str, source: str) -> Any:
    """Give the requantizer the matrix (the next Apply and Save use it); the record the lens draws."""
    from app.records.imatrix import make_record  # noqa: PLC0415

    with session.lock:
        rq = requantizer(session)
        rq.set_imatrix(im, label)
        names = set(rq.gguf.tensors)
    return make_record(im, source, names)


def imatrix_load_job(session: Session, path: str, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Read an imatrix file (GGUF or legacy .dat) for the overrides to quantize with."""
    from engine.quality.imatrix import read_imatrix  # noqa: PLC0415

    yield TaskProgress("imatrix", f"reading {Path(path).name}", 0.0)
    im = read_imatrix(path)
    return _use_imatrix(session, im, path, Path(path).name)


def imatrix_compute_job(session: Session, text_path: str, n_ctx: int, cancel: threading.Event,
                        emit: Emit) -> Iterator[object]:
    """Compute an importance matrix of the chat's model over a text, as llama-imatrix does (cancellable)."""
    from engine.cli.options import read_text_file  # noqa: PLC0415
    from engine.quality.imatrix_collect import compute_imatrix  # noqa: PLC0415

    text = read_text_file(text_path, "calibration text")
    yield from _wait_for_reply(session, "imatrix", cancel)
    say = lambda what, frac: emit(TaskProgress("imatrix", what, frac))  # noqa: E731
    with session.lock:
        if session.model is None:
            raise LensError("no model is loaded")
        im = compute_imatrix(session.model, text, n_ctx=n_ctx, dataset=Path(text_path).name, progress=say,
                             cancel=cancel)
        session.fresh_cache()
    if im is None:
        raise LensError("computing the importance matrix cancelled")
    return _use_imatrix(session, im, f"computed on {Path(text_path).name}", f"computed on {Path(text_path).name}")


def imatrix_clear_job(session: Session, cancel: threading.Event, emit: Emit) -> Iterator[object]:
    """Quantize without an importance matrix again."""
    yield TaskProgress("imatrix", "clearing", 0.0)
    with session.lock:
        requantizer(session).set_imatrix(None)
    return None
