"""Requantizing a model: plan the types (a preview), apply them in memory, reset to the file, save a GGUF.

Every new tensor is made from the file's own weights, dequantized and quantized again (what
llama-quantize does with --allow-requantize), so the bytes equal llama.cpp's for the same
preset and rules. A tensor whose type does not change keeps the file's bytes, as llama.cpp
copies it. Applying is all or nothing: new blocks are computed first, checking `cancel`
between row chunks, and swapped into the model only when every one is ready. The engine starts
no threads: a caller that owns a thread pool may pass it as `executor` to requantize several
tensors at once (NumPy releases the GIL inside the kernels).
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Executor, wait
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import platformdirs

from engine.errors import SettingError
from engine.gguf import GGUFFile, GGUFValueType, open_gguf, write_gguf
from engine.kernels import pages
from engine.quality.imatrix import (
    ImportanceMatrix,
    quant_weights_for,
    quantize_metadata,
)
from engine.quality.plan import Plan, TensorPlan, make_plan
from engine.quant import dequantize_rows, quantize
from engine.quant.presets import Preset
from engine.quant.rules import Rule
from engine.quant.types import TYPES, GGMLType
from engine.runtime.warmup import products_apart, weight_kinds
from engine.tensor import QTensor

if TYPE_CHECKING:
    from engine.model import Model

log = logging.getLogger(__name__)

__all__ = ["Plan", "Requantizer", "TensorPlan", "make_plan", "quantize_file", "requantize_rows"]

Progress = Callable[[str, float], None]  # (what is happening, fraction done 0..1)

QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION in ggml.h, written as general.quantization_version
_SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")  # llama-quantize drops these
_CHUNK_WEIGHTS = 1 << 20  # rows are requantized this many weights at a time: the cancel/progress step


def requantize_rows(
    rows: npt.NDArray[np.uint8],
    old: GGMLType,
    new: GGMLType,
    *,
    source: npt.NDArray[np.float32] | None = None,
    cancel: threading.Event | None = None,
    on_weights: Callable[[int], None] | None = None,
    quant_weights: npt.NDArray[np.float32] | None = None,
) -> npt.NDArray[np.uint8] | None:
    """(n_rows, row_bytes) blocks of `old` requantized to `new` via float32, a row chunk at a time; None if cancelled.

    `source` may hold the same weights already dequantized (n_rows, n_cols), to skip that step;
    `quant_weights` (n_cols,) is the tensor's importance (ImportanceMatrix.values), as llama-quantize --imatrix.
    """
    n_rows = len(rows)
    n_cols = rows.shape[1] // TYPES[old].type_size * TYPES[old].block_size
    out = np.empty((n_rows, TYPES[new].row_bytes(n_cols)), dtype=np.uint8)
    step = max(1, _CHUNK_WEIGHTS // max(1, n_cols))
    for r0 in range(0, n_rows, step):
        if cancel is not None and cancel.is_set():
            return None
        r1 = min(n_rows, r0 + step)
        x = source[r0:r1] if source is not None else dequantize_rows(rows[r0:r1], old)
        out[r0:r1] = quantize(x, new, quant_weights)
        if on_weights is not None:
            on_weights((r1 - r0) * n_cols)
    return out


Job = tuple[TensorPlan, "npt.NDArray[np.uint8]", "npt.NDArray[np.float32] | None"]  # (what, file rows, float32 rows)


def scratch_dir() -> Path:
    """Where made blocks are spilled (unlinked files, gone with the arrays): the user's cache, on disk."""
    return Path(platformdirs.user_cache_dir("gguf-lens")) / "scratch"


def _run_jobs(
    jobs: list[Job], progress: Progress | None, cancel: threading.Event | None, executor: Executor | None,
    weights: dict[str, npt.NDArray[np.float32]] | None = None, release: bool = False,
) -> dict[str, npt.NDArray[np.uint8]] | None:
    """Requantize every job (with its tensor's importance from `weights`), on `executor` when given; progress
    is reported from the calling thread. `release`: once a tensor is done, its file pages leave this process
    (engine.kernels.pages; they stay in the page cache), so reading the whole file does not keep it resident,
    and its new blocks go to a scratch file mapped read-only (pages.spill): the products release them as they
    release a file's blocks, so a variant costs one copy of its weights, not the blocks and their repack."""
    weights = weights or {}
    total = max(1, sum(tp.n_elements for tp, _, _ in jobs))
    done = [0]
    lock = threading.Lock()
    say = progress or (lambda what, frac: None)

    def count(n: int) -> None:
        with lock:
            done[0] += n
        if executor is None:
            say("requantizing", min(1.0, done[0] / total))

    say("requantizing", 0.0)
    out: dict[str, npt.NDArray[np.uint8]] = {}
    if executor is None:
        for tp, rows, source in jobs:
            blocks = requantize_rows(rows, tp.old, tp.new, source=source, cancel=cancel, on_weights=count,
                                     quant_weights=weights.get(tp.name))
            if blocks is None:
                return None
            out[tp.name] = pages.spill(blocks, scratch_dir()) if release else blocks
            if release:
                pages.release(rows)
        return out
    stop = threading.Event()  # set on cancel or error, so the other jobs end at their next chunk
    rows_of = {tp.name: rows for tp, rows, _ in jobs}
    futures = {
        executor.submit(requantize_rows, rows, tp.old, tp.new, source=source, cancel=stop, on_weights=count,
                        quant_weights=weights.get(tp.name)): tp.name
        for tp, rows, source in jobs
    }
    try:
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
            if cancel is not None and cancel.is_set():
                stop.set()
            for fut in finished:
                blocks = fut.result()
                if blocks is None:
                    stop.set()
                else:
                    out[futures[fut]] = pages.spill(blocks, scratch_dir()) if release else blocks
                    if release:
                        pages.release(rows_of[futures[fut]])
            say("requantizing", min(1.0, done[0] / total))
    except BaseException:
        stop.set()
        raise
    return None if stop.is_set() else out


def output_metadata(
    gguf: GGUFFile, plan: Plan | None, imatrix: tuple[ImportanceMatrix, str] | None = None,
) -> tuple[dict[str, object], dict[str, tuple[GGUFValueType, GGUFValueType | None]]]:
    """The metadata llama-quantize writes: the file's keys, split keys dropped, quantization version and file type
    last, then the quantize.imatrix.* keys when an (imatrix, its file name) was used."""
    md = {k: v for k, v in gguf.metadata.items() if k not in _SPLIT_KEYS}
    types = {k: v for k, v in gguf.metadata_types.items() if k in md}
    u32 = (GGUFValueType.UINT32, None)
    file_type = plan.file_type if plan is not None else None
    if file_type is None and "general.file_type" in md:
        file_type = int(md["general.file_type"])  # type: ignore[call-overload]
    for key, value in (("general.quantization_version", QUANTIZATION_VERSION), ("general.file_type", file_type)):
        md.pop(key, None)
        types.pop(key, None)
        if value is not None:
            md[key], types[key] = value, u32
    for key, value, vtype in quantize_metadata(*imatrix) if imatrix is not None else ():
        md.pop(key, None)
        types.pop(key, None)
        md[key], types[key] = value, (vtype, None)
    return md, types


def quantize_file(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    preset: str | Preset,
    rules: Sequence[str | Rule] = (),
    *,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    executor: Executor | None = None,
    imatrix: ImportanceMatrix | None = None,
    imatrix_file: str = "",
) -> Plan | None:
    """Write `dst`: `src` requantized to a preset and rules, as llama-quantize does (with `--imatrix imatrix_file`
    when `imatrix` is given); None if cancelled."""
    with open_gguf(src) as gguf:
        plan = make_plan(gguf, preset, rules, has_imatrix=imatrix is not None)
        used = (imatrix, imatrix_file) if imatrix is not None else None
        if not _write(gguf, plan, {}, dst, progress, cancel, executor, used):
            return None
    for tp in plan.fallbacks:
        log.info("%s: %s", tp.name, tp.reason)
    return plan


def _write(
    gguf: GGUFFile, plan: Plan, held: dict[str, QTensor], dst: str | os.PathLike[str],
    progress: Progress | None, cancel: threading.Event | None, executor: Executor | None,
    imatrix: tuple[ImportanceMatrix, str] | None = None,
) -> bool:
    """Write the plan's file: blocks held in memory, else requantized now (with the imatrix), else the file's own bytes."""
    jobs = [(tp, gguf.rows(tp.name), None) for tp in plan.changed if not _holds(held, tp)]
    weights = _plan_weights(plan, imatrix[0]) if imatrix is not None else None
    made = _run_jobs(jobs, progress, cancel, executor, weights)
    if made is None:
        return False
    tensors = []
    for tp in plan.tensors.values():
        blocks = held[tp.name].blocks if _holds(held, tp) else made.get(tp.name)
        tensors.append((tp.name, tp.new, tp.shape, blocks if blocks is not None else gguf.rows(tp.name)))
    md, types = output_metadata(gguf, plan, imatrix)
    write_gguf(dst, md, tensors, metadata_types=types, alignment=gguf.alignment)
    return True


def _plan_weights(plan: Plan, im: ImportanceMatrix) -> dict[str, npt.NDArray[np.float32]]:
    """Each changed tensor's importance (checked as llama-quantize checks it)."""
    return quant_weights_for(im, {tp.name: tp.shape for tp in plan.changed})


def _holds(held: dict[str, QTensor], tp: TensorPlan) -> bool:
    return tp.name in held and held[tp.name].qtype == tp.new


class Requantizer:
    """Requantizes a loaded Model in place: preview a plan, apply it, reset to the file, save it.

    The app keeps one per loaded model and calls it from its worker thread:
      plan = rq.plan("Q4_K_M", ["attn_v=Q8_0"])      # cheap: types, reasons, sizes
      rq.apply(plan, progress=..., cancel=event)     # True when applied, False when cancelled
      rq.reset()                                     # the file's blocks again
      rq.save(path, progress=..., cancel=event)      # a GGUF llama.cpp loads
    With `imatrix` set (set_imatrix), plans, applies and saves are llama-quantize's with --imatrix.
    """

    def __init__(self, model: Model):
        self.model = model
        self.gguf = model.gguf
        self.applied: Plan | None = None
        self.imatrix: ImportanceMatrix | None = None
        self.imatrix_file = ""  # the name written as quantize.imatrix.file
        self._held: dict[str, QTensor] = {}  # tensors whose blocks in the model are not the file's
        self._held_imatrix: ImportanceMatrix | None = None  # the imatrix the held blocks were made with

    def set_imatrix(self, imatrix: ImportanceMatrix | None, file_label: str = "") -> None:
        """Use an importance matrix for the next plans, applies and saves (None: quantize without one)."""
        self.imatrix = imatrix
        self.imatrix_file = file_label if imatrix is not None else ""

    def plan(self, preset: str | Preset | None, rules: Sequence[str | Rule] = ()) -> Plan:
        """The plan for this model's file (see make_plan), with or without the importance matrix."""
        return make_plan(self.gguf, preset, rules, has_imatrix=self.imatrix is not None)

    def current_types(self) -> dict[str, GGMLType]:
        """The type each tensor has in memory now."""
        return {n: (self._held[n].qtype if n in self._held else t.qtype) for n, t in self.gguf.tensors.items()}

    def _setters(self) -> dict[str, list[tuple[tuple[int, ...], Callable[[QTensor], None]]]]:
        """For each tensor the model holds: (its shape in the model, how to swap new blocks in)."""
        net = self.model.net
        owner = getattr(net, "cpu", net)  # a GPU runner wraps the NumPy model and re-uploads what changed there
        out: dict[str, list[tuple[tuple[int, ...], Callable[[QTensor], None]]]] = {}
        for name, lin in net.linears().items():
            out.setdefault(name, []).append((lin.weight.shape, lin.replace))
        embd = getattr(owner, "tok_embd", None)  # the embedding table is looked up by rows, not a Linear
        if isinstance(embd, QTensor):
            out.setdefault(embd.name, []).append((embd.shape, lambda qt: setattr(owner, "tok_embd", qt)))
        return out

    def _file_qtensor(self, name: str, shape: tuple[int, ...]) -> QTensor:
        return QTensor(name, GGMLType(self.gguf.tensors[name].qtype), shape, self.gguf.rows(name))

    def _dense_source(self, name: str) -> npt.NDArray[np.float32] | None:
        """The file's float32 weights when the model still holds them dequantized (saves a dequantize)."""
        if name in self._held:
            return None
        lin = self.model.net.linears().get(name)
        if lin is None or lin.weight.qtype != self.gguf.tensors[name].qtype:
            return None
        dense = getattr(lin, "_dense", None)  # only a copy it keeps: making one here would hold every tensor in
        if dense is None:  # float32 at once (4 bytes a weight) while the jobs are built; the rows dequantize anyway
            return None
        return dense if dense.shape == (lin.n_out, lin.n_in) and lin.n_in == self.gguf.tensors[name].shape[0] else None

    def apply(
        self,
        plan: Plan,
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        executor: Executor | None = None,
        replace_first: bool = False,
    ) -> bool:
        """Put the plan's types into the model; False (and the model untouched) if cancelled.

        Tensors already holding the planned type are kept; `executor` (the caller's thread pool)
        requantizes several tensors at once, else this thread does them one after another.
        `replace_first` (the preset sweep): the blocks this plan replaces are given back (the tensors return to
        the file's blocks, the products built on them are dropped) before the new ones are made, and each
        tensor's file pages are released once it is done, so the model never holds two requantized copies at
        once; if cancelled, the model is then back at the file's weights instead of untouched.
        """
        say = progress or (lambda what, frac: None)
        setters = self._setters()
        missing = [tp.name for tp in plan.changed if tp.name not in setters]
        if missing:
            log.warning("%d tensors are not used by the model in memory and stay as in the file: %s",
                        len(missing), ", ".join(missing[:5]))
        same_imatrix = self.imatrix is self._held_imatrix  # blocks made with another imatrix are made again
        if replace_first:
            keep = {tp.name for tp in plan.changed if same_imatrix and _holds(self._held, tp)}
            for name in [n for n in self._held if n not in keep]:
                self._swap(setters[name], None, name)
            self.applied = None
            self._drop_products()
        restore = [n for n in self._held if n not in plan.tensors or not plan.tensors[n].changed]
        jobs = [(tp, self.gguf.rows(tp.name), self._dense_source(tp.name)) for tp in plan.changed
                if tp.name in setters and (not same_imatrix or not _holds(self._held, tp))]
        weights = _plan_weights(plan, self.imatrix) if self.imatrix is not None else None
        made = _run_jobs(jobs, say, cancel, executor, weights, release=replace_first)
        if made is None or (cancel is not None and cancel.is_set()):
            if replace_first:
                self.reset()
            say("cancelled", 0.0)
            return False
        for name in restore:  # the commit: nothing here can fail half way
            self._swap(setters[name], None, name)
        for tp, _, _ in jobs:
            self._swap(setters[tp.name], QTensor(tp.name, tp.new, setters[tp.name][0][0], made.pop(tp.name)), tp.name)
        self.applied = plan if plan.changed else None
        self._held_imatrix = self.imatrix
        net = getattr(self.model, "net", None)
        if jobs and hasattr(net, "linears"):  # types the kernel cache never held compile in a helper, not here
            products_apart(weight_kinds(net), lambda frac: say("compiling the new types' kernels", frac))
        say("done", 1.0)
        log.info("applied %s", plan.summary())
        return True

    def _drop_products(self) -> None:
        """Forget the fused q/k/v and gate/up products (their stacked copies of the old blocks): the next forward
        builds them again from the blocks the tensors hold then."""
        owner = getattr(self.model.net, "cpu", self.model.net)
        for layer in getattr(owner, "layers", ()):
            for fused in getattr(layer, "fused", lambda: ())():
                if hasattr(fused, "_groups"):
                    fused._groups, fused._groups_key = [], ()
                if getattr(fused, "_stacked", None) is not None:
                    for p in fused.parts:
                        p.drop_cache()
                    fused._stacked, fused._views = None, []

    def _swap(self, setters: list[tuple[tuple[int, ...], Callable[[QTensor], None]]], qt: QTensor | None, name: str) -> None:
        for shape, put in setters:
            if qt is None:
                put(self._file_qtensor(name, shape))
            else:
                put(QTensor(name, qt.qtype, shape, qt.blocks))
        if qt is None:
            self._held.pop(name, None)
        else:
            self._held[name] = qt

    def reset(self) -> None:
        """Give every tensor back its blocks from the file."""
        setters = self._setters()
        for name in list(self._held):
            self._swap(setters[name], None, name)
        self.applied = None

    def save(
        self,
        path: str | os.PathLike[str],
        *,
        progress: Progress | None = None,
        cancel: threading.Event | None = None,
        executor: Executor | None = None,
    ) -> bool:
        """Write the model as it is now (the applied plan, or the file) to a GGUF; False if cancelled."""
        plan = self.applied or make_plan(self.gguf, None)
        held = self._held if self._held_imatrix is self.imatrix else {}
        used = (self.imatrix, self.imatrix_file) if self.imatrix is not None else None
        if not _write(self.gguf, plan, held, path, progress, cancel, executor, used):
            return False
        if progress is not None:
            progress("saved", 1.0)
        return True


def check_output_path(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Refuse to write over the input file (it is memory-mapped while we read it)."""
    try:
        same = os.path.samefile(src, dst)
    except OSError:
        same = False
    if same:
        raise SettingError(f"output {os.fspath(dst)!r} is the input file; choose another path")
