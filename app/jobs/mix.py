"""The mix search as a plain generator (no Qt): find the best per-tensor mix under a size, then measure it like a preset.

It runs on the sweep's lane and workspace (B, a copy of the file): the sensitivities are measured on
the calibration text (assets/calibration_text.txt) and kept in the user cache per model file, text
and importance matrix, so a cancelled search resumes where it stopped; the mix found is then run on
the evaluation text, as every preset of the sweep is, and comes back as a SweepPoint of kind 'mix'
with its rules. With the Quantization lens's importance matrix (loaded or computed there) the search
measures and quantizes with it, and B is quantized with it too, as Apply and Save then will.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.data.overrides import OverrideSpec
from app.jobs.reference import measure_against
from app.jobs.sweep import file_reference
from app.jobs.workspace import CompareWorkspace, early_paths, encode
from app.jobs.session import Emit
from app.records.compare import SweepDone, SweepPoint, TaskProgress
from engine.errors import InferenceError, LensError

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION_PATH = ROOT / "assets" / "calibration_text.txt"
CALIBRATION_TOKENS = 64  # as the command line's default (engine/cli/mix.py)


def calibration_text() -> str:
    """The bundled calibration text (not the evaluation text: the mix is judged on text it was not chosen on)."""
    try:
        return CALIBRATION_PATH.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ("At the edge of the old town there is a workshop where clocks are repaired by hand. "
                "Most faults are dirt and old oil; a clock is only many simple things that must all agree.")


def check_search_memory(model: object, n_tokens: int) -> None:
    """Refuse a search that would not fit: the model's run, the layers' inputs, a tensor's float copies."""
    from engine.memory import check_memory, gib

    est = check_memory(model.gguf, model.args, n_ctx=max(16, n_tokens), all_logits=True)  # type: ignore[attr-defined]
    args = model.args  # type: ignore[attr-defined]
    largest = max(int(t.n_elements) for t in model.gguf.tensors.values())  # type: ignore[attr-defined]
    extra = 4 * n_tokens * int(args.dim) * (int(args.n_layers) + 1) + 16 * largest + 8 * n_tokens * int(args.n_vocab)
    if est.available is not None and est.required + extra > est.available:
        raise InferenceError(f"the mix search needs about {gib(est.required + extra)} GiB, {gib(est.available)} GiB "
                             "available; close other programs or use the command line on a bigger machine")


def session_imatrix(session: object, path: str) -> tuple[Any, str] | None:
    """(the importance matrix the Quantization lens uses for this file, its label), or None.

    Read without the session lock (a reply may hold it for long): set_imatrix replaces the reference whole."""
    rq = getattr(session, "requantizer", None)
    im = getattr(rq, "imatrix", None)
    if rq is None or im is None or str(getattr(rq.model, "path", "")) != str(path):
        return None
    return im, str(getattr(rq, "imatrix_file", "") or "imatrix")


def mix_job(ws: CompareWorkspace, path: str, budget_bpw: float, eval_text: str, cancel: threading.Event, emit: Emit,
            calib_text: str | None = None, max_tokens: int = 512,
            imatrix: tuple[Any, str] | None = None) -> Iterator[object]:
    """Search the mix for budget_bpw, then measure it on the evaluation text; yields progress, the SweepPoint, SweepDone.

    `imatrix` (an engine ImportanceMatrix and its label) weights the search's errors and quantizers and B's
    requantization; None: without one. B is closed when the search ends, however it ends."""
    try:
        with early_paths():
            return (yield from _search(ws, path, budget_bpw, eval_text, cancel, emit, calib_text, max_tokens, imatrix))
    finally:
        ws.release()


def _search(ws: CompareWorkspace, path: str, budget_bpw: float, eval_text: str, cancel: threading.Event, emit: Emit,
            calib_text: str | None, max_tokens: int, imatrix: tuple[Any, str] | None) -> Iterator[object]:
    """mix_job's search and measurement."""
    from engine.quality.mix_search import find_mix
    from engine.quality.sensitivity_cache import SensitivityCache, cache_key

    phase = [0.0, 0.05]

    def say(what: str, frac: float) -> None:
        emit(TaskProgress("mix", what, phase[0] + phase[1] * min(1.0, max(0.0, frac))))

    ws.use(path)
    yield TaskProgress("mix", "loading a copy of the model", 0.0)
    b, _ = ws.model_b(OverrideSpec(), say, cancel, replace_first=True)  # the file's weights
    ids = encode(b, calib_text or calibration_text(), CALIBRATION_TOKENS)
    eval_ids = encode(b, eval_text, max_tokens)
    check_search_memory(b, max(len(ids), len(eval_ids)))
    importance = imatrix[0].quant_weights() if imatrix is not None else None
    with_im = f" with {Path(imatrix[1]).name}" if imatrix is not None else ""
    cache = SensitivityCache(cache_key(path, ids, b.numerics, importance),
                             label=f"{Path(path).name} on the calibration text{with_im}")
    phase[:] = [0.05, 0.8]
    result = find_mix(b, ids, budget_bpw, importance=importance, cache=cache, progress=say, cancel=cancel)
    if result is None or cancel.is_set():
        yield SweepDone(0, True)
        return 0
    mix = result.plan
    phase[:] = [0.85, 0.05]
    try:
        ref = file_reference(ws, eval_ids, cancel, say)  # the comparison's or the sweep's, else run here once
    except LensError:
        if cancel.is_set():
            yield SweepDone(0, True)
            return 0
        raise
    phase[:] = [0.9, 0.1]
    rules = tuple(mix.rules())
    rq = ws.rq
    before = (rq.imatrix, rq.imatrix_file)
    try:
        if imatrix is not None:
            rq.set_imatrix(*imatrix)  # B quantized as the search measured (the sweep's presets stay without)
        b, plan = ws.model_b(OverrideSpec(None, rules), lambda what, frac: say(f"mix: {what}", 0.5 * frac), cancel,
                             prefix="", replace_first=True)
        st = measure_against(b, eval_ids, ref, cancel, lambda what, frac: say(f"mix: {what}", 0.5 + 0.5 * frac),
                             "running the mix")
    except LensError:
        if cancel.is_set():
            yield SweepDone(0, True)
            return 0
        raise
    finally:
        rq.set_imatrix(*before)
    sens = result.sensitivities
    resumed = f", {sens.resumed} of {len(sens.tensors)} tensors from the cache" if sens is not None and sens.resumed else ""
    notes = f" ({'; '.join(sens.notes)})" if sens is not None and sens.notes else ""
    detail = f"{mix.summary()} on {len(ids)} calibration tokens{with_im}{resumed}{notes}"
    yield SweepPoint(f"mix ≤ {budget_bpw:.2f} bpw" + (" (imatrix)" if imatrix is not None else ""), "mix", plan.new_bytes, plan.new_bpw, float(st["kld_mean"]),
                     float(st["kld_p99"]), float(st["same_top_pct"]), float(st["ppl_ratio"]), len(eval_ids),
                     rules=rules, detail=detail)
    yield SweepDone(1, False)
    return 1
