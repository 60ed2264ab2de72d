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

Two processes writing numba's cache is safe: each index file is replaced atomically, and an entry
lost to a race is compiled again the next time.
"""
from __future__ import annotations

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
_HELPER = "import sys; from engine.kernels.dispatch import warm_up; from engine.quant.types import GGMLType; " \
          "warm_up({(GGMLType[a.split(':')[0]], int(a.split(':')[1])) for a in sys.argv[1:]})"

_state = threading.local()


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


def is_cached(dispatcher: Any) -> bool:
    """Whether numba's on-disk cache holds a current entry of this compiled function (False when unsure)."""
    try:
        return bool(dispatcher._cache._cache_file._load_index())
    except Exception:  # noqa: BLE001 - numba internals differ between versions: then assume a cold cache
        return False


class Helper:
    """The helper processes compiling the product kernels (one per kernel family, see `start`)."""

    def __init__(self, procs: list[tuple[subprocess.Popen[bytes], list[str], Any]]):
        self.procs, self.started = procs, time.monotonic()
        self.names = [n for _, names, _ in procs for n in names]

    def wait(self, progress: Callable[[float], None] | None = None, limit: float = WAIT_LIMIT_S) -> bool:
        """Wait until every helper is done (progress gets a rising fraction meanwhile); True when all succeeded."""
        while any(proc.poll() is None for proc, _, _ in self.procs):
            elapsed = time.monotonic() - self.started
            if elapsed > limit:
                log.warning("the kernel compile helper took over %.0f s; compiling here instead", limit)
                for proc, _, _ in self.procs:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                for _, _, errors in self.procs:
                    errors.close()
                return False
            if progress is not None:
                progress(min(0.95, elapsed / 30.0))
            time.sleep(0.1)
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
        log.info("product kernels for %s compiled in %s in %.1f s", ", ".join(self.names), where,
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


def start(weights: Iterable[tuple[GGMLType, int]], probe: Any) -> Helper | None:
    """Start the helpers compiling the products of these (weight type, rows) when `probe` (a compiled function
    every forward pass runs) is not in numba's cache and there are two cores or more; None otherwise."""
    if os.environ.get("GGUF_LENS_PRECOMPILE", "1") == "0" or (os.cpu_count() or 1) < 2 or is_cached(probe):
        return None
    names = sorted(f"{GGMLType(t).name}:{int(rows)}" for t, rows in set(weights))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)}
    procs: list[tuple[subprocess.Popen[bytes], list[str], Any]] = []
    for group in families(names):
        errors = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the helper's lifetime, closed by wait()
        try:
            proc = subprocess.Popen([sys.executable, "-c", _HELPER, *group], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=errors)
        except OSError as err:
            errors.close()
            log.info("no second process for the kernel compile (%s)", err)
            break
        procs.append((proc, group, errors))
    return Helper(procs) if procs else None
