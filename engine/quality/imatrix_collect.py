"""Computing an importance matrix from a model and a calibration text, as llama-imatrix does.

compute_imatrix in tools/imatrix/imatrix.cpp: the text is tokenized once (with BOS where the vocabulary
adds one), cut into chunks of n_ctx tokens (at least two chunks are needed), and each chunk runs from an
empty KV cache with its first token replaced by BOS. For every matrix product inside a block (tensor
names starting `blk.`; the output matrix only on request) the eval callback adds x_j^2 of every input row
into a float32 accumulator per input column, and the token count. Batches of fewer than 16 rows are
skipped, as collect_imatrix does; a chunk runs in ubatches of 512 tokens, llama.cpp's default n_ubatch.

The inputs come from the forward pass through the Recorder's `on_input` hook (engine.observe), so normal
inference pays nothing; a model on the GPU is run by its CPU twin (the same numbers). `cancel` is checked between ubatches; progress is (what, fraction done).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import SettingError
from engine.observe.recorder import Recorder
from engine.quality.imatrix import ImportanceMatrix

if TYPE_CHECKING:
    from engine.model import Model

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]

DEFAULT_CHUNK = 512  # llama-imatrix's default --ctx-size
UBATCH = 512  # llama.cpp's default n_ubatch: the rows one product sees at a time
MIN_ROWS = 16  # collect_imatrix ignores products over fewer rows


class _Accumulator:
    """The eval callback: float32 sums of squares per column, added row after row as the C loop does."""

    def __init__(self) -> None:
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}
        self.bad: str | None = None

    def __call__(self, names: tuple[str, ...], x: np.ndarray) -> None:
        rows = np.asarray(x, np.float32).reshape(-1, x.shape[-1])
        if len(rows) < MIN_ROWS:
            return
        sq = rows * rows
        for name in names:
            if not name.startswith("blk."):
                continue
            acc = self.sums.get(name)
            if acc is None:
                acc = np.zeros(rows.shape[1], np.float32)
            # acc += x*x per row in order: prepend the running sum so the reduction starts from it
            acc = np.add.reduce(np.concatenate([acc[None, :], sq]), axis=0)
            if self.bad is None and not np.isfinite(acc).all():
                self.bad = name
            self.sums[name] = acc
            self.counts[name] = self.counts.get(name, 0) + len(rows)


def refuse_encoder_decoder(model: Model) -> None:
    """SettingError for an encoder-decoder model (T5), as llama-imatrix gives it nothing to write.

    collect_imatrix keeps the products of tensors named `blk.*` (and output.weight on request); a T5 file's are
    `enc.blk.*` and `dec.blk.*`, so llama-imatrix stores no entry, and it runs each chunk through llama_decode
    alone, the decoder attending to an encoder output that was never computed."""
    if getattr(model.net, "is_encoder_decoder", False):
        raise SettingError(f"{model.arch} is an encoder-decoder model: llama-imatrix collects nothing from one (it "
                           "keeps the products of blk.* tensors, and this file's are enc.blk.* and dec.blk.*; it also "
                           "decodes each chunk with no encoder input), so there is no importance matrix to compute")


def chunk_tokens(ids: Sequence[int], n_ctx: int, bos: int | None, skip: int = 0, max_chunks: int = -1) -> list[list[int]]:
    """The chunks llama-imatrix evaluates: n_ctx tokens each, the first replaced by BOS when there is one."""
    if n_ctx < 1:
        raise SettingError(f"--ctx-size {n_ctx}: must be at least 1")
    ids = list(ids)
    if skip > 0:
        if (skip + 2) * n_ctx >= len(ids):
            raise SettingError(f"--chunk {skip}: not enough tokens left after skipping {skip} chunks "
                               f"({len(ids)} tokens, chunks of {n_ctx})")
        ids = ids[skip * n_ctx :]
    if len(ids) < 2 * n_ctx:
        raise SettingError(f"the calibration text is {len(ids)} tokens; llama-imatrix needs at least 2 chunks of "
                           f"{n_ctx} ({2 * n_ctx} tokens): use a longer text or a smaller --ctx-size")
    n_chunk = len(ids) // n_ctx
    if max_chunks >= 0:
        n_chunk = min(n_chunk, max_chunks)
    out = []
    for i in range(n_chunk):
        chunk = ids[i * n_ctx : (i + 1) * n_ctx]
        if bos is not None:
            chunk[0] = bos
        out.append(chunk)
    return out


def compute_imatrix(
    model: Model,
    text: str,
    *,
    n_ctx: int = DEFAULT_CHUNK,
    skip_chunks: int = 0,
    max_chunks: int = -1,
    parse_special: bool = False,
    dataset: str = "",
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> ImportanceMatrix | None:
    """The importance matrix of `model` over `text` (llama-imatrix's numbers); None if cancelled."""
    refuse_encoder_decoder(model)
    tok = model.tokenizer
    ids = tok.encode(text, add_special=True, parse_special=parse_special)
    bos = tok.bos_id if tok.add_bos else None
    chunks = chunk_tokens(ids, n_ctx, bos, skip_chunks, max_chunks)
    return compute_imatrix_tokens(model, chunks, dataset=dataset, chunk_size=n_ctx, progress=progress, cancel=cancel)


def compute_imatrix_tokens(
    model: Model,
    chunks: Sequence[Sequence[int]],
    *,
    dataset: str = "",
    chunk_size: int | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
) -> ImportanceMatrix | None:
    """The importance matrix over token chunks, each run from an empty cache; None if cancelled."""
    refuse_encoder_decoder(model)
    say = progress or (lambda what, frac: None)
    acc = _Accumulator()
    recorder = Recorder(capture_q=False, on_input=acc)
    total = max(1, sum(len(c) for c in chunks))
    done = 0
    n_ctx = max((len(c) for c in chunks), default=1)
    net = getattr(model.net, "cpu", model.net)  # a GPU runner's layers have no input hook: run its CPU model
    say("imatrix", 0.0)
    for i, chunk in enumerate(chunks):
        model.gguf.check_unchanged()
        cache = net.new_cache(n_ctx)
        for s in range(0, len(chunk), UBATCH):
            if cancel is not None and cancel.is_set():
                say("cancelled", 0.0)
                return None
            piece = chunk[s : s + UBATCH]
            net.forward(piece, cache, recorder)
            cache.commit(list(piece))
            recorder.commit()
            done += len(piece)
            say(f"imatrix chunk {i + 1}/{len(chunks)}", min(1.0, done / total))
        if acc.bad is not None:
            raise SettingError(f"non-finite activations in {acc.bad} at chunk {i + 1}: the model output is not usable")
    im = ImportanceMatrix(datasets=[dataset] if dataset else [], chunk_count=len(chunks),
                          chunk_size=chunk_size or n_ctx)
    for name in sorted(acc.sums):
        im.sums[name] = acc.sums[name].reshape(1, -1)
        im.counts[name] = np.array([acc.counts[name]], np.int64)
    say("done", 1.0)
    log.info("imatrix: %d tensors over %d chunks of %d tokens", len(im), len(chunks), n_ctx)
    return im
