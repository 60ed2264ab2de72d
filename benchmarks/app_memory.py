"""An hour's worth of the app's jobs on one model, offscreen: resident memory before and after each, and the peak.

    .venv/bin/python benchmarks/app_memory.py [MODEL] [--rounds 6] [--tokens 512] [--presets Q8_0,Q4_K_M,Q2_K]
                                              [--jobs compare,sweep,apply,clear,patching,probe] [--settle 1]
    .venv/bin/python benchmarks/app_memory.py [MODEL] --headless-compare [--tokens 1024] [--cache F16]

MODEL is a catalog name or a .gguf path (default smollm2-135m-instruct). The real window opens on it
(QT_QPA_PLATFORM=offscreen, a scratch data folder), a chat message is answered (the Experiments' Apply
measures its effect on the chat), then each round runs every job once, as its view starts it
(benchmarks/app_session.py): Compare (the file against its FFNs at Q4_0, on the evaluation text, --tokens),
the preset sweep (--presets), an ablation Apply (heads 0:0 and 1:1) and its Clear, activation patching (a
new kind each round) and the head-roles induction probe. The default six rounds are about an hour of a
session's measuring on a 1B-class model.

Printed as JSON lines: one per job (round, job, rss_before_mib, rss_after_mib, peak_mib, grew_mib, seconds;
error when it failed), then a summary: the model, its file size, the CPU, the resident memory once loaded
and at the end, the largest growth over one job, the peak of each job kind and VmHWM (the kernel's peak).

--headless-compare runs only Compare's job (app.jobs.compare.compare_job, B the file with its FFNs at Q4_0, as
the view starts it) in this process with no window, and prints its peak (VmHWM) against issue 43.4's target:
both models' tensors + 512 MiB (Gemma 3 270m on 1,024 tokens: 860 MiB, was 1,212-1,358).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


def _vm_hwm() -> int:
    with open("/proc/self/status") as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")), 0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("--rounds", type=int, default=6, help="times every job runs (6: about an hour on a 1B model)")
    ap.add_argument("--tokens", type=int, default=512, help="tokens of the evaluation text (the app's default: 512)")
    ap.add_argument("--presets", default="Q8_0,Q4_K_M,Q2_K", help="the sweep's presets, comma separated")
    ap.add_argument("--jobs", default="compare,sweep,apply,clear,patching,probe", help="the jobs of a round, in order")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds the window idles before and after each job")
    ap.add_argument("--headless-compare", action="store_true", help="only Compare's job, no window: its peak")
    ap.add_argument("--cache", default="F16", help="--headless-compare's KV cache type of both sides (the chat's "
                    "default F16, as Compare takes it; F32, Q8_0, Q4_0)")
    args = ap.parse_args(argv)
    if args.headless_compare:
        return headless_compare(args.model, args.tokens, args.cache.upper())

    from engine.kernels.pages import limit_arenas

    limit_arenas()  # as app.__main__ does before the window's threads start
    from engine.runtime.warmup import APART_ENV

    os.environ.setdefault(APART_ENV, "1")  # as app.__main__: new types' kernels compile in a helper process
    from PySide6.QtWidgets import QApplication

    from app.data.overrides import eval_text
    from app.data.store import Store
    from app.main_window import MainWindow
    from benchmarks.app_session import JOBS, MIB, SessionDriver, cpu_model, file_mib, rss, wait_until
    from engine.catalog import resolve_model

    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    bad = [j for j in jobs if j not in JOBS]
    if bad:
        ap.error(f"unknown job {bad[0]!r}: the jobs are {', '.join(JOBS)}")
    path = str(resolve_model(args.model))
    text = eval_text()
    while len(text) < 8 * args.tokens:  # enough text for --tokens (the bundled one is ~500 tokens)
        text = f"{text}\n\n{eval_text()}"
    app = QApplication.instance() or QApplication(sys.argv[:1])
    rss_start = rss()
    with tempfile.TemporaryDirectory(prefix="app-memory-") as data:
        t0 = time.perf_counter()
        w = MainWindow(model=path, store=Store(Path(data)))
        w.resize(1280, 800)
        w.show()
        wait_until(lambda: w.state.model is not None, 600.0)
        load_s = time.perf_counter() - t0
        driver = SessionDriver(w, text, tokens=args.tokens, presets=tuple(p for p in args.presets.split(",") if p),
                               settle_s=args.settle)
        driver.chat()
        rss_loaded = rss()
        results = []
        for r in range(args.rounds):
            for job in jobs:
                m = driver.run(job, r)
                results.append(m)
                print(json.dumps(m.as_dict()), flush=True)
        rss_end = rss()
        worst = max(results, key=lambda m: m.after - m.before)
        peaks: dict[str, float] = {}
        for m in results:
            peaks[m.job] = max(peaks.get(m.job, 0.0), round(m.peak / MIB, 1))
        print(json.dumps({
            "summary": True, "model": Path(path).name, "file_mib": file_mib(path), "cpu": cpu_model(),
            "rounds": args.rounds, "tokens": args.tokens, "load_s": round(load_s, 1),
            "rss_start_mib": round(rss_start / MIB, 1), "rss_loaded_mib": round(rss_loaded / MIB, 1),
            "rss_end_mib": round(rss_end / MIB, 1), "grew_mib": round((rss_end - rss_loaded) / MIB, 1),
            "worst_job": worst.as_dict(), "peak_mib_by_job": peaks, "vm_hwm_mib": round(_vm_hwm() / MIB, 1),
            "errors": [m.as_dict() for m in results if m.error],
        }), flush=True)
        w.close()
        app.processEvents()
    return 0


def headless_compare(model: str, tokens: int, cache: str = "F16") -> int:
    """Compare's job as QuantBridge.run_compare starts it, on `tokens` tokens of the evaluation text; its peak."""
    import threading  # noqa: PLC0415

    from app.data.overrides import eval_text  # noqa: PLC0415
    from app.jobs.compare import CompareWorkspace, compare_job  # noqa: PLC0415
    from app.records.compare import CompareOptions, CompareRecord  # noqa: PLC0415
    from benchmarks.app_session import B_RULES, MIB, cpu_model, file_mib, rss  # noqa: PLC0415
    from engine.catalog import resolve_model  # noqa: PLC0415

    path = str(resolve_model(model))
    text = eval_text()
    while len(text) < 8 * tokens:
        text = f"{text}\n\n{eval_text()}"
    opts = CompareOptions(b_source="mix", b_rules=B_RULES, b_name="FFNs at Q4_0", text=text, max_tokens=tokens,
                          a_cache=cache, b_cache=cache)
    before, t0 = rss(), time.perf_counter()
    ws = CompareWorkspace()
    rec = None
    for item in compare_job(ws, path, opts, None, threading.Event(), lambda _: None):
        rec = item if isinstance(item, CompareRecord) else rec
    if rec is None:
        raise SystemExit("the comparison made no record")
    peak = _vm_hwm()
    target = (rec.a_bytes + rec.b_bytes) / MIB + 512
    print(json.dumps({
        "model": Path(path).name, "file_mib": file_mib(path), "cpu": cpu_model(), "tokens": len(rec.token_ids),
        "cache": cache,
        "a_mib": round(rec.a_bytes / MIB, 1), "b_mib": round(rec.b_bytes / MIB, 1), "kld_mean": rec.stats.kld_mean,
        "rss_before_mib": round(before / MIB, 1), "rss_after_mib": round(rss() / MIB, 1),
        "peak_mib": round(peak / MIB, 1), "target_mib": round(target, 1), "within": peak / MIB <= target,
        "seconds": round(time.perf_counter() - t0, 1),
    }), flush=True)
    ws.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
