"""Give resident pages back that hold nothing this process still needs (Linux; elsewhere a no-op).

Two kinds of clean, file-backed pages inflate a loaded model's resident memory without being used:

- the GGUF blocks of a weight once its repacked copy is made (the kernels read only the copy), and
- the code of libraries that ran once: `import llvmlite` maps ~80 MiB of libllvmlite.so (its static
  constructors touch nearly every page), used again only when numba compiles.

madvise(MADV_DONTNEED) unmaps them from this process; they stay in the page cache and fault back in on
the next read, so it is always safe for read-only private mappings without copy-on-write pages.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import os
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator

import numpy as np

log = logging.getLogger(__name__)
_MADV_DONTNEED = 4
_libc = None


def _madvise() -> object | None:
    global _libc
    if not sys.platform.startswith("linux"):
        return None
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            _libc = False
    return _libc.madvise if _libc else None


def _file_backed(arr: np.ndarray) -> bool:
    base = arr
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            return True
        base = base.base
    return isinstance(base, mmap.mmap)


def release(arr: np.ndarray | None) -> int:
    """Drop the whole pages of a read-only memory-mapped array from this process (bytes released)."""
    fn = _madvise()
    if fn is None or not isinstance(arr, np.ndarray) or arr.size == 0 or arr.flags.writeable or not _file_backed(arr):
        return 0
    page = mmap.PAGESIZE
    start = arr.__array_interface__["data"][0]
    lo, hi = -(-start // page) * page, (start + arr.nbytes) // page * page
    if hi <= lo or fn(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) != 0:
        return 0
    return hi - lo


_MADV_HUGEPAGE = 14
COPY_CHUNK = 8 << 20  # bytes copied between two releases of the source's pages


def anon_copy(arr: np.ndarray, chunk: int = COPY_CHUNK) -> np.ndarray:
    """A C-contiguous copy of `arr` in anonymous memory, asked for huge pages (MADV_HUGEPAGE, where Linux has
    transparent huge pages), copied `chunk` bytes of rows at a time with each part's file pages released as soon
    as it is copied: the process never holds both copies. For weights that every decode step reads whole, where
    a file mapping's 4 KiB pages cost a TLB miss each (in a VM a two-level page walk)."""
    return anon_concat([arr], chunk)


def anon_concat(parts: list[np.ndarray], chunk: int = COPY_CHUNK) -> np.ndarray:
    """anon_copy of arrays stacked by rows (one weight of several: q/k/v, gate/up), each part's file pages
    released as it is copied."""
    first = parts[0]
    shape = first.shape if len(parts) == 1 else (sum(len(p) for p in parts), *first.shape[1:])
    out = np.empty(shape, first.dtype)
    fn = _madvise()
    if fn is not None and out.nbytes >= 2 << 20:
        start = out.__array_interface__["data"][0]
        lo, hi = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, (start + out.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if hi > lo:
            fn(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_HUGEPAGE)  # a hint: failure changes nothing
    if first.ndim == 0:
        out[...] = first
        return out
    at = 0
    for arr in parts:
        rows = max(1, chunk // max(1, arr[:1].nbytes))
        for r in range(0, len(arr), rows):
            stop = min(len(arr), r + rows)
            out[at + r : at + stop] = arr[r:stop]
            release(arr[r:stop])
        release(arr)  # the pages at the chunks' edges (and those a fault mapped around a later chunk's first read)
        at += len(arr)
    return out


ARENAS = 1  # glibc malloc arenas a long-running front end allows (limit_arenas): the app's first Compare on Gemma 3
# kept +51 to +56 MiB with 2 (its job thread's temporaries and the records it keeps share pages in the second arena),
# +30 to +35 MiB with 1, in the same time (benchmarks/app_memory.py, 2026-12-07)
_M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def limit_arenas(n: int = ARENAS) -> bool:
    """Let glibc's malloc keep at most n arenas (mallopt M_ARENA_MAX; elsewhere nothing); True when set. Call it
    before the threads start: each thread that allocates otherwise gets an arena of its own (up to 8 per core),
    and what the app's jobs free stays in whichever arena served them (ARENAS: how many the app keeps). With at most
    2, ten Compares in a row on Gemma 3 (benchmarks/app_memory.py --jobs compare) each left the resident memory
    within 17 MiB of where it was after the first (25 MiB with glibc's default), and the tenth ended 22 MiB lower;
    trim_heap still hands the free pages back after each job."""
    if _madvise() is None:
        return False
    try:
        return bool(_libc.mallopt(_M_ARENA_MAX, n))  # type: ignore[union-attr]
    except AttributeError:  # a libc without it (musl)
        return False


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing): freed temporaries
    (a load's, a comparison's chunks of logits) otherwise keep their pages resident."""
    if _madvise() is not None:
        try:
            _libc.malloc_trim(0)  # type: ignore[union-attr]
        except AttributeError:  # a libc without it (musl)
            pass


def release_libraries() -> int:
    """Drop the clean pages of every read-only library mapping that has no anonymous (relocated) page."""
    fn = _madvise()
    if fn is None:
        return 0
    spans: list[tuple[int, int]] = []
    cur: list[int] | None = None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if head and "-" in head[0] and not head[0].endswith(":"):
                    if cur is not None and cur[2] == 0:
                        spans.append((cur[0], cur[1]))
                    cur = None
                    if len(head) > 5 and ".so" in head[5] and head[1] in ("r-xp", "r--p"):
                        lo, hi = (int(v, 16) for v in head[0].split("-"))
                        cur = [lo, hi, 0]
                elif cur is not None and head and head[0] == "Anonymous:":
                    cur[2] = int(head[1])
    except OSError:
        return 0
    if cur is not None and cur[2] == 0:
        spans.append((cur[0], cur[1]))
    return sum(hi - lo for lo, hi in spans if fn(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) == 0)


def spill(arr: np.ndarray, directory: str | os.PathLike[str] | None = None) -> np.ndarray:
    """`arr`'s bytes in an unlinked scratch file, mapped read-only: an array that behaves like a GGUF file's blocks
    (release() can give its pages back; they fault in again from the page cache when read). Made blocks that
    the kernels read only once (to repack them) or only in batches then cost no anonymous memory of their own.

    The file is removed as soon as it is mapped, so nothing is left on disk after the array goes, whatever
    happens; where the file cannot be written (no space, no directory) `arr` itself is returned, unchanged."""
    if not isinstance(arr, np.ndarray) or arr.nbytes < mmap.PAGESIZE or not arr.flags.c_contiguous:
        return arr
    try:
        if directory is not None:
            os.makedirs(directory, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory, prefix="gguf-lens-spill-") as f:
            f.write(memoryview(arr).cast("B"))
            f.flush()
            mapped = np.memmap(f, dtype=arr.dtype, mode="r", shape=arr.shape)
    except (OSError, ValueError) as exc:
        log.warning("made blocks stay in memory (scratch file not written: %s)", exc)
        return arr
    return mapped


_STREAM = threading.local()


@contextlib.contextmanager
def streaming() -> Iterator[None]:
    """Within it (this thread), a product that read a file-backed weight for a batch gives its pages back
    afterwards (engine.kernels.dispatch.BlockProduct): measuring runs (a sweep's variants, a comparison's
    chunks) then hold about one layer's weights resident at a time instead of the model's; the pages fault back
    in from the page cache at the next chunk. Not for chat, where every step reads every weight again."""
    before = getattr(_STREAM, "on", False)
    _STREAM.on = True
    try:
        yield
    finally:
        _STREAM.on = before


def after_batch(arrays: Iterable[object], always: bool = False) -> None:
    """Release the file-backed arrays a batch product just read: under streaming(), or `always` (blocks that only
    batches read, such as the legacy quants' GGUF blocks once one-row products read their repacked planes)."""
    if always or getattr(_STREAM, "on", False):
        for arr in arrays:
            if isinstance(arr, np.ndarray):
                release(arr)
