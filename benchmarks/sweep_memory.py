"""The Compare lens's preset sweep, headless: wall time and peak resident memory against the file's size.

    .venv/bin/python benchmarks/sweep_memory.py [MODEL] [--presets Q8_0,Q4_K_M | all] [--tokens 512]
                                                [--no-compare] [--progress]

MODEL is a catalog name or a .gguf path (default smollm2-135m-instruct). As in the app, a comparison runs
first (the file against its Q4_K_M preset, on the evaluation text, in the Compare view's own workspace),
then the sweep runs in its own workspace (the controller keeps the two apart), both as plain generators
(app/jobs, no Qt). --no-compare starts the sweep cold (it then makes the reference run itself).

Resident memory is sampled from /proc/self/status (VmRSS) every 20 ms in a thread, and VmHWM (the
kernel's own peak) is read at the end. Printed as one JSON object:

  presets           the presets swept
  points            the sweep's points (preset, KLD mean, same top %, size)
  compare_s         the comparison's wall seconds (0 with --no-compare)
  sweep_s           the sweep's wall seconds
  file_bytes        the GGUF file's size
  rss_app           resident bytes before the sweep's job starts: the "app's own" (interpreter, NumPy,
                    the kernels, and whatever the comparison left loaded)
  rss_start         resident bytes before anything was loaded (interpreter, imports, kernels)
  peak_rss          the highest resident bytes sampled while the sweep ran
  vm_hwm            the kernel's peak resident bytes of the whole process (compare included)
  sweep_ratio       (peak_rss - rss_app) / file_bytes: what the sweep adds, in files
  total_ratio       (peak_rss - rss_start) / file_bytes: everything the models hold, in files
  progress          with --progress: every progress message the view would show (else the last 5)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
T0 = time.perf_counter()
sys.path.insert(0, str(ROOT))


def _status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def rss() -> int:
    return _status_kib("VmRSS")


class Sampler:
    """The highest VmRSS seen, sampled every `every` seconds in a daemon thread."""

    def __init__(self, every: float = 0.02):
        self.every = every
        self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss())
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def drain(job, emit_log: list[str]) -> list[object]:
    items = []
    for item in job:
        name = type(item).__name__
        if name == "TaskProgress":
            emit_log.append(f"{time.perf_counter() - T0:7.1f}s {item.fraction:6.1%} {item.what}")
        else:
            items.append(item)
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("--presets", default="all", help="comma-separated presets, or 'all' (the sweep's 14)")
    ap.add_argument("--tokens", type=int, default=512, help="max tokens of the evaluation text (the app: 512)")
    ap.add_argument("--no-compare", action="store_true", help="run the sweep without a comparison before it")
    ap.add_argument("--progress", action="store_true", help="print every progress message")
    args = ap.parse_args(argv)

    from app.data.overrides import OverrideSpec, eval_text
    from app.jobs.compare import CompareWorkspace, compare_job
    from app.jobs.sweep import SWEEP_PRESETS, sweep_job
    from app.records.compare import CompareOptions, SweepPoint
    from engine.catalog import resolve_model
    from engine.kernels.dispatch import warm_up
    from engine.quant.types import GGMLType

    path = str(resolve_model(args.model))
    presets = tuple(SWEEP_PRESETS) if args.presets == "all" else tuple(p.strip() for p in args.presets.split(",") if p)
    text = eval_text()
    # the kernels the presets' types use, compiled (or loaded from numba's cache) before anything is measured
    warm_up([GGMLType[t] for t in ("F32", "F16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                                   "Q6_K")])
    rss_start = rss()
    cancel = threading.Event()
    log: list[str] = []

    def emit(item: object) -> None:
        if type(item).__name__ == "TaskProgress":
            log.append(f"{time.perf_counter() - T0:7.1f}s {item.fraction:6.1%} {item.what}")

    compare_ws = CompareWorkspace()
    compare_s = 0.0
    if not args.no_compare:
        t0 = time.perf_counter()
        opts = CompareOptions(b_source="preset", b_preset="Q4_K_M", text=text, max_tokens=args.tokens)
        drain(compare_job(compare_ws, path, opts, OverrideSpec(), cancel, emit), log)
        compare_s = time.perf_counter() - t0
    rss_app = rss()
    sweep_ws = CompareWorkspace()
    t0 = time.perf_counter()
    with Sampler() as sampler:
        items = drain(sweep_job(sweep_ws, path, text, OverrideSpec(), cancel, emit, presets=presets,
                                max_tokens=args.tokens), log)
    sweep_s = time.perf_counter() - t0
    file_bytes = os.path.getsize(path)
    points = [p for p in items if isinstance(p, SweepPoint)]
    out = {
        "model": Path(path).name,
        "presets": list(presets),
        "tokens": args.tokens,
        "points": [{"name": p.name, "kld_mean": round(p.kld_mean, 6), "same_top_pct": round(p.same_top_pct, 2),
                    "mib": round(p.nbytes / 2**20, 1)} for p in points],
        "compare_s": round(compare_s, 1),
        "sweep_s": round(sweep_s, 1),
        "file_bytes": file_bytes,
        "rss_start": rss_start,
        "rss_app": rss_app,
        "peak_rss": sampler.peak,
        "vm_hwm": _status_kib("VmHWM"),
        "sweep_ratio": round((sampler.peak - rss_app) / file_bytes, 2),
        "total_ratio": round((sampler.peak - rss_start) / file_bytes, 2),
        "progress": log if args.progress else log[-5:],
    }
    print(json.dumps(out, indent=1))
    compare_ws.close()
    sweep_ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
