"""The preset sweep as a plain generator (no Qt): every preset of llama-quantize measured against the file's reference.

Only one model is loaded (B, a copy of the file, in the sweep's own CompareWorkspace), holding one variant
at a time (Requantizer.apply(replace_first)); every variant is compared with the file's Reference
(app.jobs.reference: the comparison's A when it read the same tokens, else run once here) a chunk of rows at
a time. When the sweep ends its model is closed (the reference stays in its scratch file): the app's memory
comes back to what it was before the sweep.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterator, Sequence

from app.data.overrides import OverrideSpec
from app.jobs.workspace import CompareWorkspace, Say, early_paths, encode
from app.jobs.reference import Reference, find_reference, keep_reference, make_reference, measure_against
from app.jobs.session import Emit
from app.records.compare import SweepDone, SweepPoint, TaskProgress
from engine.errors import LensError
from engine.kernels.pages import trim_heap

SWEEP_PRESETS = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_1", "Q4_0",
                 "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q2_K")


def file_reference(ws: CompareWorkspace, ids: Sequence[int], cancel: threading.Event, say: Say) -> Reference:
    """The file's reference on `ids`: the one a comparison (or an earlier sweep) made, else B reset to the file's
    weights runs it once."""
    b = ws.load_b(say)
    ref = find_reference(b, ids)
    if ref is None:
        ws.model_b(OverrideSpec(), lambda what, frac: say(what, 0.0), cancel, prefix="the file: ", replace_first=True)
        ref = make_reference(b, ids, cancel, say, f"running the file on {len(ids)} tokens")
        keep_reference(ref)
    return ref


def _duration(seconds: float) -> str:
    if seconds < 55:
        return f"{max(5, 5 * round(seconds / 5))} s"
    if seconds < 3570:
        return f"{max(1, round(seconds / 60))} min"
    return f"{int(seconds // 3600)} h {round(seconds % 3600 / 60)} min"


class TimeLeft:
    """'about 3 min left' from the time so far and the fraction done (nothing until there is something to go on)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.t0 = clock()

    def __call__(self, fraction: float) -> str:
        elapsed = self.clock() - self.t0
        if fraction < 0.02 or elapsed < 1.0:
            return "estimating the time left"
        if fraction >= 1.0:
            return "finishing"
        return f"about {_duration(elapsed * (1.0 - fraction) / fraction)} left"


def sweep_job(ws: CompareWorkspace, path: str, text: str, spec: OverrideSpec | None, cancel: threading.Event,
              emit: Emit, presets: Sequence[str] = SWEEP_PRESETS, max_tokens: int = 512) -> Iterator[object]:
    """For the overrides (when set) and each preset: requantize B, run it on the text, yield a SweepPoint.

    Only one model is loaded (B, a copy of the file), holding one variant at a time: each variant's blocks
    replace the previous one's (Requantizer.apply(replace_first=True)). Every variant is compared with the
    file's reference run (file_reference: the comparison's A when it read the same tokens, else run once
    here) a chunk of rows at a time. Progress says which variant of how many and the time left. B is closed when
    the sweep ends, however it ends.
    """
    same_as_preset = spec is not None and not spec.rules and spec.preset in presets
    variants = ([("overrides", spec)] if spec is not None and not spec.empty and not same_as_preset else [])
    variants += [("preset", OverrideSpec(p)) for p in presets]
    left = TimeLeft()
    steps = [len(variants) + 1, 0]  # (steps: the reference run when one is needed, then each variant; current)

    def say(what: str, frac: float) -> None:
        done = (steps[1] + min(1.0, max(0.0, frac))) / steps[0]
        emit(TaskProgress("sweep", f"{what} · {left(done)}", done))

    ws.use(path)
    try:
        with early_paths():
            return (yield from _sweep(ws, text, variants, steps, say, cancel, max_tokens))
    finally:  # B and its variant's blocks go (the next sweep loads the file again: seconds, against minutes)
        ws.release()


def _sweep(ws: CompareWorkspace, text: str, variants: list[tuple[str, OverrideSpec]], steps: list[int], say: Say,
           cancel: threading.Event, max_tokens: int) -> Iterator[object]:
    """sweep_job's measuring: the reference, then each variant's SweepPoint, then SweepDone."""
    b = ws.load_b(say)
    ids = encode(b, text, max_tokens)
    reuse = find_reference(b, ids) is not None
    if reuse:
        steps[0] = len(variants)
    try:
        ref = file_reference(ws, ids, cancel, say)
    except LensError:
        if not cancel.is_set():
            raise
        yield SweepDone(0, True)
        return 0
    done = 0
    for i, (kind, s) in enumerate(variants):
        steps[1] = i + (not reuse)
        name = s.label() if kind == "overrides" else str(s.preset)
        head = f"{name} ({i + 1} of {len(variants)})"
        try:
            b, plan = ws.model_b(s, lambda what, frac, h=head: say(f"{h}: {what}", 0.5 * frac), cancel,
                                 prefix="", replace_first=True)
            trim_heap()
            st = measure_against(b, ids, ref, cancel, lambda what, frac, h=head: say(f"{h}: {what}", 0.5 + 0.5 * frac),
                                 f"running on {len(ids)} tokens")
        except LensError:
            if cancel.is_set():
                break
            raise
        done += 1
        yield SweepPoint(name, kind, plan.new_bytes, plan.new_bpw, float(st["kld_mean"]), float(st["kld_p99"]),
                         float(st["same_top_pct"]), float(st["ppl_ratio"]), len(ids))
    yield SweepDone(done, cancel.is_set())
    return done
