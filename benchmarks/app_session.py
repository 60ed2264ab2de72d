"""The real window's jobs, one at a time, with the process's resident memory before, after and at the peak of each.

Used by benchmarks/app_memory.py (an hour's worth of jobs on a catalog model) and by
tests/app/test_memory_returns.py (each job once on a tiny model). Every job is started the way its view starts
it, through the window's controllers (QuantBridge.run_compare and run_sweep, ExperimentsBridge.apply and
run_patching, LensBridge.request_roles('probe')), and is over when its done (or failed) signal has come and
no job thread is left. Resident memory is VmRSS of /proc/self/status: "before" as the job is asked for,
"after" once it is over and the window has idled `settle_s` seconds (its own timers run: the GUI thread's
garbage collector ticks every 0.5 s), and the peak sampled every 20 ms in a thread while the job runs.
Nothing here collects garbage or trims the heap: what is measured is what the app itself gives back.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QCoreApplication, QEventLoop

from app.records.compare import CompareOptions
from app.records.interventions import InterventionSpec
from benchmarks.sweep_memory import Sampler as PeakSampler  # the highest VmRSS while it runs, sampled in a thread
from benchmarks.sweep_memory import rss  # resident bytes now (VmRSS)

JOBS = ("compare", "sweep", "apply", "clear", "patching", "probe")
PATCH_KINDS = ("resid_pre", "attn_out", "mlp_out", "heads")  # a new kind each round: a repeated map is shown from memory
PATCH_PROMPTS = ("The Eiffel Tower is in the city of", "The Colosseum is in the city of")
CHAT = "Tell me, in two sentences, why the sky is blue and why sunsets are red."
B_RULES = ("ffn_.*=Q4_0",)  # Compare's B: the file with its FFN weights at Q4_0 (the measurement)
MIB = 1 << 20


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ('' where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


def wait_until(done: Callable[[], bool], timeout_s: float) -> None:
    """Run the event loop until done() (TimeoutError after timeout_s)."""
    end = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > end:
            raise TimeoutError(f"still waiting after {timeout_s:.0f} s")
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.01)


def idle(seconds: float) -> None:
    """Let the window run its event loop (timers, deferred deletions) for `seconds`."""
    end = time.monotonic() + seconds
    wait_until(lambda: time.monotonic() >= end, seconds + 5.0)


@dataclasses.dataclass(frozen=True)
class JobMemory:
    """One job's resident memory: as it was asked for, once it was over (and settled), and the peak in between."""

    job: str
    round: int
    before: int
    after: int
    peak: int
    seconds: float
    error: str = ""  # the job's failure message ('' when it ran)
    parts: dict[str, float] = dataclasses.field(default_factory=dict)  # what `after` is made of (resident_parts)

    def as_dict(self) -> dict[str, Any]:
        return {"round": self.round, "job": self.job, "rss_before_mib": round(self.before / MIB, 1),
                "rss_after_mib": round(self.after / MIB, 1), "peak_mib": round(self.peak / MIB, 1),
                "grew_mib": round((self.after - self.before) / MIB, 1), "seconds": round(self.seconds, 1),
                **({"error": self.error} if self.error else {}), **self.parts}


def resident_parts() -> dict[str, float]:
    """What the resident memory is made of now: anonymous pages (the heaps, arrays), file pages (the memory-mapped
    GGUF files, libraries), both in MiB (/proc/self/smaps_rollup), and the blocks Python's own allocator holds."""
    parts: dict[str, float] = {"py_blocks": float(sys.getallocatedblocks())}
    try:
        with open("/proc/self/smaps_rollup") as f:
            kb = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split(":")[0] in ("Rss", "Anonymous")}
        parts.update(anon_mib=round(kb["Anonymous"] / 1024, 1), file_mib=round((kb["Rss"] - kb["Anonymous"]) / 1024, 1))
    except (OSError, KeyError, ValueError):
        pass
    return parts


class SessionDriver:
    """Starts the window's jobs as its views do and waits for each to end (the window `w` is app.main_window's)."""

    def __init__(self, w: Any, text: str, *, tokens: int = 512, presets: tuple[str, ...] = ("Q8_0", "Q4_K_M", "Q2_K"),
                 settle_s: float = 1.0, timeout_s: float = 1800.0, patch_prompts: tuple[str, str] = PATCH_PROMPTS):
        self.w, self.text, self.tokens, self.presets = w, text, tokens, presets
        self.patch_prompts = patch_prompts  # (clean, corrupted): the same number of tokens
        self.settle_s, self.timeout_s = settle_s, timeout_s
        self._ended: list[tuple[str, str]] = []  # (kind, '' or the failure message) of the jobs that ended
        engine = w.engine
        engine.task_done.connect(lambda kind, _value: self._ended.append((kind, "")))
        engine.task_failed.connect(lambda kind, message: self._ended.append((kind, message)))
        engine.lens_ready.connect(lambda result: self._ended.append((getattr(result, "kind", "lens"), "")))
        engine.lens_failed.connect(lambda kind, message: self._ended.append((kind, message)))

    def quiet(self) -> bool:
        """No reply is being made and no job thread runs."""
        return not self.w.conversation.generating and not self.w.engine.threads()

    def chat(self, text: str = CHAT) -> None:
        """Send one message and wait for the reply (the Apply measures its effect on the chat's tokens)."""
        self.w.chat_view.input.setPlainText(text)
        self.w.chat_view._submit()
        wait_until(lambda: self.w.conversation.generating or not self.quiet(), 30.0)
        wait_until(self.quiet, self.timeout_s)

    def start(self, job: str, round_: int) -> str:
        """Ask for `job` as its view does; returns the signal kind that says it ended."""
        w = self.w
        if job == "compare":
            w.quant_bridge.run_compare(CompareOptions(b_source="mix", b_rules=B_RULES, b_name="FFNs at Q4_0",
                                                      text=self.text, max_tokens=self.tokens))
            return "compare"
        if job == "sweep":
            w.quant_bridge.run_sweep(self.text, self.presets, self.tokens)
            return "sweep"
        if job in ("apply", "clear"):
            w.experiments_bridge.apply(InterventionSpec(heads="0:0, 1:1") if job == "apply" else InterventionSpec())
            return "interventions"
        if job == "patching":
            w.experiments_bridge.run_patching(*self.patch_prompts, PATCH_KINDS[round_ % len(PATCH_KINDS)])
            return "patching"
        if job == "probe":
            w.bridge.request_roles("probe")
            return "roles"
        raise ValueError(f"job {job!r} is not one of {', '.join(JOBS)}")

    def run(self, job: str, round_: int = 0) -> JobMemory:
        """Run one job to its end; its resident memory before, after (settled) and at its peak."""
        wait_until(self.quiet, self.timeout_s)
        idle(self.settle_s)
        before, t0, mark = rss(), time.perf_counter(), len(self._ended)
        with PeakSampler() as sampler:
            kind = self.start(job, round_)
            wait_until(lambda: any(k == kind for k, _ in self._ended[mark:]) and self.quiet(), self.timeout_s)
            seconds = time.perf_counter() - t0
            idle(self.settle_s)
        error = next((m for k, m in self._ended[mark:] if k == kind and m), "")
        return JobMemory(job, round_, before, rss(), sampler.peak, seconds, error, resident_parts())


def file_mib(path: str) -> float:
    """A file's size in MiB."""
    return round(os.path.getsize(path) / MIB, 1)
