"""Which weight types' product kernels numba's on-disk cache already holds, for this engine tree and CPU target.

A process that runs a product of a type for the first time loads its kernels from numba's cache, or compiles them
there and then: seconds, and 50-100 MiB of LLVM's work that the process keeps (the app's Compare of a file against
its FFNs at Q4_0 on a cold cache grew it by 108 MiB against 42 with the kernels cached). So whenever a warm-up
finishes a type's products (`dispatch.warm_up`, in any process) it leaves a marker here, and a process about to
use types without one has a helper process compile them first (engine.runtime.warmup.products_apart).

A marker is an empty file named TYPE_ROWS (the row class warm_up compiles for: 16, 8 or 4) in a folder keyed on
everything numba's cache entries depend on: the engine's compiled sources (cache_stamp.tree_stamp), the SIMD
target, numba's version and NUMBA_CACHE_DIR. Creating a file is atomic, so processes never race. A marker whose
cache entries were deleted since costs only the in-process compile it was meant to spare; no marker, a helper.
"""
from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from engine.quant.types import GGMLType

log = logging.getLogger(__name__)

_FOLDER: list[Path] = []


def row_class(rows: int) -> int:
    """The row count warm_up compiles a weight of `rows` rows as (16, 8 or 4: the batch kernels' groups)."""
    return 16 if rows % 16 == 0 else 8 if rows % 8 == 0 else 4


def name(qtype: GGMLType | int, rows: int) -> str:
    """A weight's marker name: TYPE_ROWCLASS (Q4_0_16)."""
    return f"{GGMLType(qtype).name}_{row_class(int(rows))}"


def folder() -> Path:
    """This tree's and target's marker folder (not created here)."""
    if not _FOLDER:
        import numba  # noqa: PLC0415 - only where the compiled kernels run
        import platformdirs  # noqa: PLC0415

        from engine.kernels import isa  # noqa: PLC0415
        from engine.kernels.cache_stamp import ENGINE, tree_stamp  # noqa: PLC0415

        key = "\0".join((tree_stamp(), isa.target(), numba.__version__, os.environ.get("NUMBA_CACHE_DIR", ""),
                         str(ENGINE)))
        digest = hashlib.sha256(key.encode()).hexdigest()[:24]
        _FOLDER.append(Path(platformdirs.user_cache_dir("gguf-lens")) / "kernels-warmed" / digest)
    return _FOLDER[0]


def missing(weights: Iterable[tuple[GGMLType | int, int]]) -> set[tuple[GGMLType, int]]:
    """The (type, rows) of `weights` whose row class has no marker (all of them when the folder cannot be read)."""
    out = set()
    for t, rows in weights:
        try:
            known = (folder() / name(t, rows)).exists()
        except OSError:
            known = False
        if not known:
            out.add((GGMLType(t), int(rows)))
    return out


def mark(weights: Iterable[tuple[GGMLType | int, int]]) -> None:
    """Leave a marker for each (type, rows): their products' kernels are in numba's cache now. Never raises: an
    unwritable cache only means the next process asks a helper again."""
    try:
        where = folder()
        where.mkdir(parents=True, exist_ok=True)
        for t, rows in weights:
            (where / name(t, rows)).touch()
    except OSError as err:
        log.debug("kernel markers not written (%s)", err)
