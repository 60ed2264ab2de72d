"""Leave a CPU core to the GUI: cap the BLAS thread pool numpy already loaded (as threadpoolctl does, by name).

OpenBLAS threads spin while they wait; with one BLAS thread per core the GUI thread loses whole scheduler
slices and the window stalls for hundreds of milliseconds during a reply. Single-token decode of a small
model is memory-bound, so one thread fewer costs little, and on a busy machine it is faster.
"""
from __future__ import annotations

import ctypes
import logging
import os

log = logging.getLogger(__name__)

# (set, get) symbol pairs of the OpenBLAS builds numpy ships or links
_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)


def _loaded_blas() -> list[str]:
    """Paths of the OpenBLAS libraries mapped into this process."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return []
    return sorted(paths)


def _functions() -> list[tuple[object, object]]:
    import numpy  # noqa: F401, PLC0415 - make sure numpy's BLAS is loaded

    out = []
    for path in _loaded_blas():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _SYMBOLS:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                setter, getter = getattr(lib, set_name), getattr(lib, get_name)
                getter.restype = ctypes.c_int
                setter.argtypes = [ctypes.c_int]
                out.append((setter, getter))
                break
    return out


def blas_threads() -> int | None:
    """The current OpenBLAS thread count, or None when none could be found."""
    funcs = _functions()
    return int(funcs[0][1]()) if funcs else None


def limit_blas_threads(n: int | None = None) -> int | None:
    """Cap OpenBLAS at n threads (default: one fewer than the CPUs); returns the previous count, or None."""
    funcs = _functions()
    if not funcs:
        return None
    if n is None:
        n = max(1, (os.cpu_count() or 2) - 1)
    previous = int(funcs[0][1]())
    if n < previous:
        for setter, _getter in funcs:
            setter(int(n))
        log.info("BLAS threads %d -> %d (one core left to the GUI)", previous, n)
    return previous


def set_blas_threads(n: int) -> None:
    """Set OpenBLAS to n threads (used to restore the count on shutdown)."""
    for setter, _getter in _functions():
        setter(int(n))
