"""Leave a CPU core to the GUI: cap numpy's BLAS thread pool while the app runs (threadpoolctl).

OpenBLAS threads spin while they wait; with one BLAS thread per core the GUI thread loses whole scheduler
slices and the window stalls for hundreds of milliseconds during a reply. Single-token decode of a small
model is memory-bound, so one thread fewer costs little, and on a busy machine it is faster.
"""
from __future__ import annotations

import logging
import os

import numpy  # noqa: F401 - loads the BLAS library threadpoolctl controls
from threadpoolctl import ThreadpoolController

log = logging.getLogger(__name__)


def limit_blas_threads(n: int | None = None) -> object | None:
    """Cap BLAS at n threads (default: one fewer than the CPUs); returns a handle for restore_blas_threads."""
    n = n if n is not None else max(1, (os.cpu_count() or 2) - 1)
    ctl = ThreadpoolController()
    if not ctl.select(user_api="blas").lib_controllers:
        return None
    handle = ctl.limit(limits=n, user_api="blas")
    log.info("BLAS limited to %d threads (one core left to the GUI)", n)
    return handle


def restore_blas_threads(handle: object | None) -> None:
    """Undo limit_blas_threads."""
    if handle is not None:
        handle.restore_original_limits()  # type: ignore[attr-defined]
