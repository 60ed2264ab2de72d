"""The file's reference run on an evaluation text: its log-probabilities in an unlinked scratch file, shared by jobs.

The sweep and the mix search compare every variant with the file's log-probabilities on the evaluation
text: a Reference, made once (by a comparison whose A reads the text with an F32 cache, or by the sweep
itself) and shared by the workspaces. Its (tokens, vocabulary) rows, half a gigabyte for Gemma 3's 262k
vocabulary, wait in an unlinked scratch file (page cache, not this process's memory) and are read back a block
of rows at a time; each variant's logits are compared as its chunks come (measure_against).
"""
from __future__ import annotations

import os
import tempfile
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from engine.errors import LensError
from engine.kernels.pages import trim_heap

Say = Callable[[str, float], None]
CHUNK = 128  # prefill chunk at most: the step of progress and cancel (and of the comparison's runs: same numbers)
MIN_CHUNK = 16  # and at least, however big the vocabulary


def chunk_rows(n_vocab: int) -> int:
    """The prefill chunk of the jobs' measuring runs (a comparison's A and B in step, the sweep's reference and
    variants): as many positions as the CLI's logit budget (engine.quality.compare.LOGIT_ROWS_BYTES of float32
    rows a side) holds, CHUNK at most, MIN_CHUNK at least. Gemma 3's 262,144-token vocabulary gets 48 rows (48 MiB
    a side, not 128 MiB), a 49,152-token one CHUNK. With an F32 cache the numbers do not depend on the chunk."""
    from engine.quality.compare import LOGIT_ROWS_BYTES  # noqa: PLC0415

    return int(max(MIN_CHUNK, min(CHUNK, LOGIT_ROWS_BYTES // (4 * max(1, int(n_vocab))))))


def spill_dir() -> str | None:
    """Where references wait: the user cache (a disk; /tmp may be memory), else the system's temporary folder."""
    try:
        import platformdirs  # noqa: PLC0415

        folder = os.path.join(platformdirs.user_cache_dir("gguf-lens"), "scratch")
        os.makedirs(folder, exist_ok=True)
        return folder
    except (ImportError, OSError):
        return None


class Reference:
    """The file's log-probabilities (float32, log_softmax of its logits) at each position of `ids`, in an unlinked
    scratch file: written a chunk of rows at a time, read back the same way (os.pread, from any thread)."""

    def __init__(self, key: tuple[Any, ...], ids: Sequence[int], n_vocab: int):
        self.key = key
        self.ids = tuple(int(i) for i in ids)
        self.n_vocab = int(n_vocab)
        self.rows_done = 0
        self._file = tempfile.TemporaryFile(dir=spill_dir(), prefix="reference-")
        self._row_bytes = 4 * self.n_vocab
        self._close = weakref.finalize(self, self._file.close)  # when no job holds it any more

    @property
    def complete(self) -> bool:
        return self.rows_done == len(self.ids)

    def append(self, logp: np.ndarray) -> None:
        """The next rows, (r, n_vocab) float32 log-probabilities."""
        rows = np.ascontiguousarray(logp, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[1] != self.n_vocab or self.rows_done + rows.shape[0] > len(self.ids):
            raise LensError(f"reference rows of shape {rows.shape} do not fit")
        view, offset = memoryview(rows).cast("B"), self.rows_done * self._row_bytes
        while len(view):  # a write may take fewer bytes than it was given
            n = os.pwrite(self._file.fileno(), view, offset)
            view, offset = view[n:], offset + n
        self.rows_done += rows.shape[0]

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows [r0, r1) as a (r1 - r0, n_vocab) float32 array."""
        if not 0 <= r0 <= r1 <= self.rows_done:
            raise LensError(f"reference rows {r0}..{r1} of {self.rows_done}")
        out = np.empty((r1 - r0, self.n_vocab), np.float32)
        view, offset, fd = memoryview(out).cast("B"), r0 * self._row_bytes, self._file.fileno()
        while len(view):
            n = os.preadv(fd, [view], offset) if hasattr(os, "preadv") else _pread_into(fd, view, offset)
            if n <= 0:
                raise LensError("the reference's scratch file was cut short")
            view, offset = view[n:], offset + n
        return out

    def close(self) -> None:
        self._close()


def _pread_into(fd: int, view: memoryview, offset: int) -> int:
    data = os.pread(fd, len(view), offset)
    view[: len(data)] = data
    return len(data)


_REFERENCES: dict[tuple[Any, ...], Reference] = {}  # the latest references, shared by the workspaces
_REFERENCES_KEPT = 2
_REFERENCES_LOCK = threading.Lock()


def reference_key(model: Any, ids: Sequence[int]) -> tuple[Any, ...]:
    """What the file's logits on `ids` depend on: the file (and its version on disk), the numerics, the tokens."""
    path = os.path.realpath(str(model.path))
    try:
        st = os.stat(path)
        version: tuple[int, int] = (st.st_size, st.st_mtime_ns)
    except OSError:
        version = (-1, -1)
    return (path, version, str(getattr(model, "numerics", "")), tuple(int(i) for i in ids))


def find_reference(model: Any, ids: Sequence[int]) -> Reference | None:
    """The complete reference of this file on these tokens, if a job made one."""
    with _REFERENCES_LOCK:
        ref = _REFERENCES.get(reference_key(model, ids))
    return ref if ref is not None and ref.complete else None


def keep_reference(ref: Reference) -> None:
    """Share a complete reference; only the last few are kept (a job still reading an older one keeps it alive,
    its scratch file goes when the job lets go of it)."""
    with _REFERENCES_LOCK:
        _REFERENCES.pop(ref.key, None)
        _REFERENCES[ref.key] = ref
        for k in list(_REFERENCES)[:-_REFERENCES_KEPT]:
            del _REFERENCES[k]


def forget_references(path: str | None = None) -> None:
    """Stop sharing the references of a file (every reference when None)."""
    real = os.path.realpath(path) if path is not None else None
    with _REFERENCES_LOCK:
        for k in [k for k in _REFERENCES if real is None or k[0] == real]:
            del _REFERENCES[k]


def make_reference(model: Any, ids: Sequence[int], cancel: threading.Event, say: Say, what: str) -> Reference:
    """Run the model (holding the file's weights) on `ids` with an F32 cache, a chunk at a time into a Reference."""
    from engine.quality.compare import log_softmax_rows  # noqa: PLC0415

    ref = Reference(reference_key(model, ids), ids, int(model.args.n_vocab))
    for logits in _chunks(model, ids, cancel, say, what):
        ref.append(log_softmax_rows(logits, out=logits))
    return ref


def _chunks(model: Any, ids: Sequence[int], cancel: threading.Event, say: Say, what: str) -> Iterator[np.ndarray]:
    """The logits of `ids` on a fresh F32 cache, chunk_rows at a time (the forward passes run_model makes), each
    chunk's logits handed over as it comes. The weights stream: a measuring run reads each once per chunk, so
    their file pages (the GGUF's, or a requantized variant's scratch file) are given back after each product."""
    from engine.generate import run_checked  # noqa: PLC0415
    from engine.kernels.pages import streaming  # noqa: PLC0415

    cache = model.new_cache(max(len(ids), 16), "F32")
    chunk = chunk_rows(int(model.args.n_vocab))
    say(what, 0.0)
    for r0 in range(0, len(ids), chunk):
        if cancel.is_set():
            raise LensError("comparison cancelled")
        r1 = min(r0 + chunk, len(ids))
        with streaming():  # each weight's file pages go once its batch is done (one layer resident at a time)
            logits = run_checked(model, list(ids[r0:r1]), cache, None, all_logits=True)
        yield logits
        say(what, r1 / len(ids))


def measure_against(model: Any, ids: Sequence[int], ref: Reference, cancel: threading.Event, say: Say,
                    what: str) -> dict[str, object]:
    """token_stats of the model's run on `ids` against the file's reference, a chunk of rows at a time (and the
    reference read back a block of rows at a time): neither side's (tokens, vocabulary) logits are ever whole
    in memory."""
    from engine.quality import compare as stats  # noqa: PLC0415

    acc = stats.TokenStats(ids, base_logp=True)
    step = max(1, stats.STATS_BLOCK_BYTES // max(1, 8 * ref.n_vocab))
    for logits in _chunks(model, ids, cancel, say, what):
        for r0 in range(0, len(logits), step):
            block = logits[r0 : r0 + step]
            acc.add(ref.rows(acc.done, acc.done + len(block)), block)
        del logits
    trim_heap()
    return acc.result()
