"""The first start's kernel compile, split over processes.

numba compiles on one core, and a cold start of the ggml numerics compiles about seventy functions:
half a minute for a small model. Most of it splits in two independent halves: the product kernels of
the model's weight types (what `dispatch.warm_up` compiles) and everything else a forward pass runs
(norms, RoPE, attention, the decode step). So on a cold cache the warm-up starts a second Python
process that compiles the products into numba's on-disk cache (two when the model has legacy quants and other
types: each family's kernels in its own), and meanwhile runs a *dry* forward
pass here: inside `dry_products()` every BlockProduct returns zeros without running (or compiling) a
product kernel, so the pass compiles the other half. Then the real warm-up finds the products in the
cache. Nothing of this runs when the cache is warm, on one core, or with GGUF_LENS_PRECOMPILE=0; if
the helper fails or hangs, this process compiles what is missing itself (only slower).

The *late* kernels are those a model can run without, since another path gives the same bits: the compiled
decode step (the op-by-op step), the compiled prompt attention (its NumPy path), the legacy quants' one-row
products (their batch kernel on one row), the AVX512-VNNI batch kernels (the plainer ones of engine.kernels.paths,
which compile in a fraction of the time) and the MoE layers' few-rows products of all experts in one call
(engine.kernels.kquant.groups; a call per expert without them). On a cold cache they compile in one more background process started
after the dry pass (`start_late`), while the first token is computed without them; `late_ready()` tells the
engine when they may run, and `late_status()` what a front end shows meanwhile. A late helper still running
when this process exits is stopped (what it finished stays cached). GGUF_LENS_LATE_KERNELS=now compiles them
in the warm-up instead, before the first token.

Two processes writing numba's cache is safe: each index file is replaced atomically, and an entry
lost to a race is compiled again the next time.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from engine.quant.types import GGMLType

log = logging.getLogger(__name__)

WAIT_LIMIT_S = 600.0  # a helper still compiling after this long is stopped; this process compiles the rest
_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds the engine package
# the helper's whole program: compile (or load) the product kernels of the weights named as TYPE:ROWS
# (engine.kernels.compile_jobs.products: a module of its own, since it imports the kernels that import this one)
_HELPER = "import sys; from engine.kernels.compile_jobs import products; products(sys.argv[1:])"

BOTH_ENV = "GGUF_LENS_PRODUCTS_BOTH"  # "1": the product helper compiles the early paths and the late ones
_state = threading.local()
_late: list[Helper] = []  # the background compile of the late kernels, while it runs


def is_dry() -> bool:
    """Whether this thread is in the warm-up's dry pass (products give zeros, no product kernel runs)."""
    return getattr(_state, "dry", False)


@contextlib.contextmanager
def dry_products() -> Iterator[None]:
    """Within: every BlockProduct called on this thread fills its output with zeros instead of running."""
    _state.dry = True
    try:
        yield
    finally:
        _state.dry = False


@contextlib.contextmanager
def dry_attention() -> Iterator[None]:
    """Within: attention's row products (ggml_vec_dot_f16 / _f32 of the scores and values) give zeros on this thread
    instead of running: a first start's dry pass, while a product helper compiles them (an `attention:` job)."""
    _state.dry_attention = True
    try:
        yield
    finally:
        _state.dry_attention = False


def is_dry_attention() -> bool:
    """Whether this thread is in a dry pass whose attention products a helper compiles (dry_attention)."""
    return getattr(_state, "dry_attention", False)


ATTENTION = "attention"  # a helper's job beside TYPE:ROWS names: attention:F16 (or F32), that cache's row products


@contextlib.contextmanager
def without_late() -> Iterator[None]:
    """Within: late_ready() is False on this thread (the dry pass before the first token compiles no late kernel)."""
    _state.no_late = True
    try:
        yield
    finally:
        _state.no_late = False


def late_in_background() -> bool:
    """Whether a cold start compiles the late kernels in the background (GGUF_LENS_LATE_KERNELS=background, the
    default) or before the warm-up returns (=now: every path of a warm start from the first token)."""
    return os.environ.get("GGUF_LENS_LATE_KERNELS", "background").strip().lower() != "now"


def late_ready() -> bool:
    """Whether the late kernels may run now: False inside without_late() and while a background process compiles
    them (numba's cache has them once it is done)."""
    if getattr(_state, "no_late", False):
        return False
    _late[:] = [h for h in _late if not h.done()]
    return not _late


def late_status() -> float | None:
    """Seconds since the background compile of the late kernels began, while it runs; None otherwise."""
    running = [h for h in _late if not h.done()]
    return time.monotonic() - min(h.started for h in running) if running else None


def wait_late(limit: float = WAIT_LIMIT_S) -> bool:
    """Wait for the background compile of the late kernels (True when none runs or every one succeeded)."""
    ok = all([h.wait(limit=limit) for h in list(_late)])
    _late.clear()
    return ok


def start_late(program: str, args: list[str]) -> Helper | None:
    """Start `python -c program *args` compiling the late kernels in the background (see the module's text); one
    started for an earlier model goes on (what it compiles is cached for every model)."""
    helper = _spawn(program, [args], "the late kernels (decode step, prompt attention, one-row products, VNNI batches)")
    if helper is not None:
        _late.append(helper)
        log.info("compiling the decode kernels in the background; the first tokens take the slower path")
    return helper


@atexit.register
def _stop_late() -> None:
    for helper in _late:
        helper.stop()


def is_cached(dispatcher: Any) -> bool:
    """Whether numba's on-disk cache holds a current entry of this compiled function (False when unsure)."""
    try:
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - numba internals differ between versions: then assume a cold cache
        return False


class Helper:
    """The helper processes compiling the product kernels (one per kernel family, see `start`)."""

    def __init__(self, procs: list[tuple[subprocess.Popen[bytes], list[str], Any]], what: str):
        self.procs, self.started, self.what = procs, time.monotonic(), what
        self.names = [n for _, names, _ in procs for n in names]
        self.ok: bool | None = None  # None while any runs

    def done(self) -> bool:
        """Whether every helper has exited (then its outcome is logged, once)."""
        if self.ok is None and all(proc.poll() is not None for proc, _, _ in self.procs):
            self.ok = self._finish()
        return self.ok is not None

    def stop(self) -> None:
        """Stop every helper still running (what each finished stays in numba's cache)."""
        for proc, _, _ in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.ok is None:
            for _, _, errors in self.procs:
                errors.close()
            self.ok = False

    def wait(self, progress: Callable[[float], None] | None = None, limit: float = WAIT_LIMIT_S) -> bool:
        """Wait until every helper is done (progress gets a rising fraction meanwhile); True when all succeeded."""
        while not self.done():
            elapsed = time.monotonic() - self.started
            if elapsed > limit:
                log.warning("the kernel compile helper took over %.0f s; compiling here instead", limit)
                self.stop()
                return False
            if progress is not None:
                progress(min(0.95, elapsed / 30.0))
            time.sleep(0.1)
        return bool(self.ok)

    def _finish(self) -> bool:
        ok = True
        for proc, _, errors in self.procs:
            if proc.returncode != 0:
                ok = False
                errors.seek(0)
                tail = errors.read()[-2000:].decode("utf-8", "replace")
                log.warning("the kernel compile helper failed (exit %s); compiling here instead: %s",
                            proc.returncode, tail)
            errors.close()
        where = "a second process" if len(self.procs) == 1 else f"{len(self.procs)} more processes"
        log.info("%s compiled in %s in %.1f s", self.what or "product kernels for " + ", ".join(self.names), where,
                 time.monotonic() - self.started)
        return ok


# the legacy quants share one batch kernel (legacy_gemm_vnni / legacy_gemm): their products compile together;
# the k-quants, i-quants and floats in a second helper when the model has both (the compile is two-thirds of a
# cold start, and one helper was its long pole)
_LEGACY = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


def families(names: list[str]) -> list[list[str]]:
    """TYPE:ROWS names split into the legacy quants and the rest (an empty group is dropped)."""
    groups = [[n for n in names if n.split(":")[0] in _LEGACY], [n for n in names if n.split(":")[0] not in _LEGACY]]
    return [g for g in groups if g]


def start(weights: Iterable[tuple[GGMLType, int]], probe: Any, attention: str | None = None) -> Helper | None:
    """Start the helpers compiling the batch products of these (weight type, rows) when `probe` (a compiled function
    every forward pass runs) is not in numba's cache and there are two cores or more; None otherwise. `attention`
    (F16 or F32, the model's cache type): the first helper compiles that cache's attention row products too, which
    the dry pass here then skips (dry_attention): a first start's dry pass was its longest process."""
    return None if is_cached(probe) else start_products(weights, attention=attention)


def start_products(weights: Iterable[tuple[GGMLType, int]], late: bool = False,
                   attention: str | None = None) -> Helper | None:
    """Start the helpers compiling (or loading) the batch products of these (weight type, rows) when there are two
    cores or more and GGUF_LENS_PRECOMPILE is not 0; None otherwise. late=True: their late kernels too (the one-row
    products and VNNI batches) beside the paths taken before those are ready: for a model loaded already, whose
    own late helper may still run and compiled only its own types' kernels. attention: as for start."""
    if os.environ.get("GGUF_LENS_PRECOMPILE", "1") == "0" or (os.cpu_count() or 1) < 2:
        return None
    names = sorted(f"{GGMLType(t).name}:{int(rows)}" for t, rows in set(weights))
    env = {BOTH_ENV: "1"} if late else {}
    groups = families(names)
    if groups and attention:  # the legacy quants' helper where there is one: the shorter of Gemma 3's two
        groups[0].append(f"{ATTENTION}:{attention}")
    return _spawn(_HELPER, groups, "", env) if names else None


def _spawn(program: str, groups: list[list[str]], what: str, extra: dict[str, str] | None = None) -> Helper | None:
    """One `python -c program *group` process per group, its errors kept in a temporary file; `what` names the
    kernels in the log (empty: the product kernels of the groups' weights); `extra`: environment variables set."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p),
           **(extra or {})}
    procs: list[tuple[subprocess.Popen[bytes], list[str], Any]] = []
    for group in groups:
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the helper's lifetime, closed by wait()
        try:
            proc = subprocess.Popen([sys.executable, "-c", program, *group], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=errors)
        except OSError as err:
            errors.close()
            log.info("no second process for the kernel compile (%s)", err)
            break
        procs.append((proc, group, errors))
    return Helper(procs, what) if procs else None
