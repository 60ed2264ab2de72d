"""The preset sweep's budget: one requantized copy at a time, the comparison's reference run reused, progress with
the time left. On a tiny llama built in code (benchmarks/sweep_memory.py measures the catalog models)."""
from __future__ import annotations

import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine.quality.requantize as requantize
from app.data.overrides import OverrideSpec
from app.jobs import reference as jobs
from app.jobs.compare import CompareWorkspace, compare_job
from app.jobs.reference import Reference
from app.jobs.sweep import TimeLeft, sweep_job
from app.records.compare import CompareOptions, SweepDone, SweepPoint, TaskProgress
from engine.errors import LensError
from engine.model import load_model
from tests.tiny_models import make_tiny_llama

TEXT = "the cat sat on the mat and the dog sat on the log, while 12 birds sang in the old tree by the river " * 3
PRESETS = ("Q8_0", "Q5_1", "Q4_0", "Q2_K")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # rows of 256 take the k-quants themselves; two layers keep each forward pass to milliseconds
    return make_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf", dim=256, n_heads=4, n_kv_heads=2,
                           hidden=512, n_ctx=512, tied=False)


@pytest.fixture(autouse=True)
def no_shared_references() -> Any:
    jobs.forget_references()
    yield
    jobs.forget_references()


class Counting:
    """A CompareWorkspace loader whose models count the tokens their forward passes run."""

    def __init__(self) -> None:
        self.tokens = 0

    def __call__(self, path: str, **kw: Any) -> Any:
        model = load_model(path, **kw)
        real = model.forward

        def forward(tokens: Any, *args: Any, **kwargs: Any) -> np.ndarray:
            self.tokens += len(np.asarray(tokens).reshape(-1))
            return real(tokens, *args, **kwargs)

        model.forward = forward
        return model


def run(job: Any) -> tuple[list[object], list[TaskProgress]]:
    items = list(job)
    return [i for i in items if not isinstance(i, TaskProgress)], [i for i in items if isinstance(i, TaskProgress)]


def sweep(ws: CompareWorkspace, tiny: Path, progress: list[TaskProgress] | None = None) -> list[SweepPoint]:
    emit = progress.append if progress is not None else (lambda item: None)
    items, _ = run(sweep_job(ws, str(tiny), TEXT, OverrideSpec(), threading.Event(), emit, presets=PRESETS,
                             max_tokens=64))
    assert isinstance(items[-1], SweepDone) and items[-1].n_points == len(PRESETS) and not items[-1].cancelled
    return [p for p in items if isinstance(p, SweepPoint)]


def test_the_sweep_reuses_the_comparisons_reference_run(tiny: Path) -> None:
    """Compare (A with an F32 cache) then sweep, as the app's two workspaces do: the sweep runs no reference pass,
    and its points equal a cold sweep's (which runs the file itself) exactly."""
    compare_loads, sweep_loads, cold_loads = Counting(), Counting(), Counting()
    compare_ws, sweep_ws, cold_ws = CompareWorkspace(compare_loads), CompareWorkspace(sweep_loads), CompareWorkspace(cold_loads)
    try:
        opts = CompareOptions(b_source="preset", b_preset="Q4_0", text=TEXT, max_tokens=64)
        items, _ = run(compare_job(compare_ws, str(tiny), opts, None, threading.Event(), lambda item: None))
        n = items[0].n_tokens
        assert n == 64
        warm = sweep(sweep_ws, tiny)
        assert sweep_loads.tokens == len(PRESETS) * n  # every preset once, the file never
        jobs.forget_references()
        cold = sweep(cold_ws, tiny)
        assert cold_loads.tokens == (len(PRESETS) + 1) * n  # the reference pass, then every preset
        assert [(p.name, p.kld_mean, p.kld_p99, p.same_top_pct, p.ppl_ratio) for p in warm] == \
               [(p.name, p.kld_mean, p.kld_p99, p.same_top_pct, p.ppl_ratio) for p in cold]
        assert warm[0].kld_mean < warm[-1].kld_mean  # Q8_0 is closer to the file than Q2_K
        before = cold_loads.tokens
        again = sweep(cold_ws, tiny)  # a second sweep reuses its own reference too
        assert cold_loads.tokens - before == len(PRESETS) * n and again == cold
    finally:
        for ws in (compare_ws, sweep_ws, cold_ws):
            ws.close()


def test_the_sweep_holds_one_requantized_copy_at_a_time(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block array the requantizer makes is watched through a weakref: whenever a new one is made, the live
    ones all belong to the plan being applied (the previous preset's blocks went first), so they never add up to
    more than one copy of the model."""
    live: list[tuple[weakref.ref, str, int]] = []  # (the blocks, tensor name, bytes)
    worst: list[tuple[int, int]] = []  # (live bytes, the current plan's requantized bytes) at each new tensor
    current: dict[str, int] = {}  # the plan being applied: its requantized tensors and their bytes
    names: list[str] = []  # the jobs' tensors, in the order requantize_rows gets them (last first)
    real_apply, real_jobs, real_rows = requantize.Requantizer.apply, requantize._run_jobs, requantize.requantize_rows

    def apply(self: Any, plan: Any, **kw: Any) -> bool:
        current.clear()
        current.update({tp.name: tp.new_bytes for tp in plan.changed})
        return real_apply(self, plan, **kw)

    def run_jobs(jobs_: list, *args: Any, **kw: Any) -> Any:
        names[:] = [tp.name for tp, _, _ in reversed(jobs_)]
        return real_jobs(jobs_, *args, **kw)

    def requantize_rows(rows: np.ndarray, old: Any, new: Any, **kw: Any) -> Any:
        out = real_rows(rows, old, new, **kw)
        name = names.pop()
        # no gc.collect(): blocks only a garbage cycle still holds would stay resident until the collector runs,
        # so they count (and a full collection per tensor costs seconds in a process that holds the whole suite)
        alive = [(n, size) for ref, n, size in live if ref() is not None]
        assert {n for n, _ in alive} <= set(current), "blocks of another plan's tensors are still alive"
        live.append((weakref.ref(out), name, out.nbytes))
        worst.append((sum(size for _, size in alive) + out.nbytes, sum(current.values())))
        return out

    monkeypatch.setattr(requantize.Requantizer, "apply", apply)
    monkeypatch.setattr(requantize, "_run_jobs", run_jobs)
    monkeypatch.setattr(requantize, "requantize_rows", requantize_rows)
    ws = CompareWorkspace()
    try:
        points = sweep(ws, tiny)
    finally:
        ws.close()
    assert len(points) == len(PRESETS) and len(worst) > len(PRESETS)
    for held, one_copy in worst:
        assert held <= one_copy, f"{held} bytes of requantized blocks alive, one copy is {one_copy}"


def test_the_sweep_tells_which_preset_and_the_time_left(tiny: Path) -> None:
    progress: list[TaskProgress] = []
    ws = CompareWorkspace()
    try:
        sweep(ws, tiny, progress)
    finally:
        ws.close()
    texts = [p.what for p in progress]
    assert all(p.task == "sweep" for p in progress)
    fractions = [p.fraction for p in progress]
    assert fractions == sorted(fractions) and 0.0 <= fractions[0] and fractions[-1] <= 1.0  # never backwards
    for i, name in enumerate(PRESETS):
        assert any(t.startswith(f"{name} ({i + 1} of {len(PRESETS)}): requantizing") for t in texts), name
        assert any(t.startswith(f"{name} ({i + 1} of {len(PRESETS)}): running") for t in texts), name
    assert any("running the file" in t for t in texts)  # no comparison before: the reference runs here, once
    assert all(" · " in t and ("left" in t or t.endswith("finishing")) for t in texts)


def test_time_left_from_the_pace_so_far() -> None:
    now = [100.0]
    left = TimeLeft(clock=lambda: now[0])
    assert left(0.0) == "estimating the time left"
    now[0] += 30.0
    assert left(0.5) == "about 30 s left"
    now[0] += 90.0  # 2 minutes for a quarter... of the whole
    assert left(0.25) == "about 6 min left"
    now[0] += 3600.0
    assert left(0.5) == "about 1 h 2 min left"
    assert left(1.0) == "finishing"


def test_a_reference_spills_its_rows_and_reads_them_back() -> None:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((10, 33)).astype(np.float32)
    ref = Reference(("x",), list(range(10)), 33)
    ref.append(rows[:4])
    assert not ref.complete
    ref.append(rows[4:])
    assert ref.complete
    np.testing.assert_array_equal(ref.rows(0, 10), rows)
    np.testing.assert_array_equal(ref.rows(3, 7), rows[3:7])
    with pytest.raises(LensError):
        ref.rows(5, 11)
    ref.close()
