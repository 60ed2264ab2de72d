"""Getting a model ready for its first token: the CPU kernels compiled (or loaded from numba's cache) and the
repacked weight copies built, or, for float32 numerics, the dequantized weights.

ggml numerics: `dispatch.warm_up` compiles the product kernels of the model's weight types, then a four-token
prompt and one decode step compile the rest of a forward pass and build every product's repacked copy. On a cold
cache with two cores or more (engine.kernels.precompile) the batch products compile in a second process while a
dry pass here compiles what a prompt needs; then one more process compiles the *late* kernels in the background
(engine.runtime.late: the decode step, the prompt attention, the legacy one-row products, each of which has a path of
the same bits), and the first token does not wait for them.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from engine.kernels import isa, pages, precompile, warmed
from engine.kernels.dispatch import GEMV_MAX_ROWS, KERNEL_LOCK, compiled, warm_up
from engine.quant.types import GGMLType

if TYPE_CHECKING:
    from engine.models.decoder import DecoderModel

Progress = Callable[[float], None]


def warm(model: DecoderModel, progress: Progress | None = None) -> None:
    """ggml numerics: compile the CPU kernels and build the products' copies."""
    def part(lo: float, hi: float) -> Progress | None:
        return None if progress is None else (lambda f: progress(lo + (hi - lo) * f))

    weights = weight_kinds(model)
    split = compiled() and _compile_split(model, weights, part(0.0, 0.6))
    if compiled() and not split:  # a warm cache, but maybe types it never held: compiled apart first
        products_apart(weights, part(0.0, 0.6))
    late = split and precompile.late_status() is not None  # the late kernels compile in the background
    warm_up(weights, part(0.6 if split else 0.0, 0.7), **({"legacy_rows": BATCH_ROWS} if late else {}))
    if compiled():
        # the prompt and decode-step kernels load (or compile) and the products' repacked copies are built now, not
        # at the first real token: first a dry pass (no copy made) loads the pass's own kernels (norms, RoPE,
        # attention, the step), then _real_pass. On a first start (late) the split's dry pass has loaded them: the
        # F32 cache's pass and a long prompt's attention products are the late helper's to compile (engine.runtime.
        # late), off the first token's path (Gemma 3 on an AVX2 AMD EPYC: 5 s of dot_f32 / dot_f16 compiles here,
        # after the product helpers); finish_late loads them
        if not late:
            with precompile.dry_products():
                dry_passes(model)
        _real_pass(model, progress, long_prompt=not late)
        # a first start's late kernels are still compiling: their paths (the decode step, the repacked copies they
        # read, which replace the file's pages) come in at finish_late, not inside whatever job first runs them
        model._late_pending = not precompile.late_ready()
    if progress is not None:
        progress(1.0)


def late_pending(model: DecoderModel) -> bool:
    """Whether the model was warmed before a first start's late kernels were compiled, and they are ready now:
    finish_late has work to do."""
    return bool(getattr(model, "_late_pending", False)) and precompile.late_ready()


def finish_late(model: DecoderModel) -> bool:
    """Once a first start's late kernels are compiled (engine.kernels.precompile.late_ready), what a warm start's
    warm-up does with them: load the prompt's parallel kernels and run the warm pass again, which builds the
    compiled decode step's plan and the repacked copies the late paths read (the file pages they were read from are
    released as each copy is made), then release LLVM's code pages and the heap's free ones. Model.forward calls it
    before the next pass, and the app's Engine after a pause: otherwise the first job to run a late path would make
    these copies one product at a time, and its memory would grow by them (Gemma 3: +170 MiB of copies in a patching
    run, the file's pages released in another job). The caller holds the model's lock. True when it ran."""
    if not late_pending(model):
        return False
    model._late_pending = False
    with precompile.dry_products():
        other_passes(model)  # what warm() left to the late helper: loaded from the cache now
    _real_pass(model)
    return True


def dry_passes(model: DecoderModel) -> None:
    """The warm pass on the model's own cache type, then other_passes: the kernels of these passes, loaded or
    compiled. Called inside dry_products() (the warm-up here, the late helper in its own process)."""
    warm_pass(model)
    other_passes(model)


def other_passes(model: DecoderModel) -> None:
    """The warm pass (flash attention reads no F32 cache) on an F32 cache, which Compare's reference run and the sweep
    read, or with flash attention a prompt long enough for its tiled kernel. Called inside dry_products() (dry_passes,
    and finish_late: a first start's warm-up leaves these to the late helper)."""
    if getattr(getattr(model, "ops", None), "flash", False):
        # a prompt of TILE_Q queries or more takes flash attention's tiled kernel: loaded here, not by the first such
        # prompt after the load gave LLVM's pages back (SmolLM2, a 128-token prompt: +19 MiB of peak memory)
        from engine.ops.attention_flash import TILE_Q  # noqa: PLC0415 - with compiled kernels only

        warm_pass(model, tokens=TILE_Q)
    else:
        warm_pass(model, "F32")


def _real_pass(model: DecoderModel, progress: Progress | None = None, long_prompt: bool = True) -> None:
    """A long prompt's kernels (its attention products, unless not long_prompt: a first start's late helper
    compiles them; the parallel chunk kernels once the late kernels may run, else the late helper compiles them for
    the next start), then LLVM's code pages go (libllvmlite.so, ~80 MiB resident since its import, and each kernel
    load touches ~50 MiB of it again), and only then the warm pass that makes the products' copies (the peak is not
    libraries + copies), and its temporaries go (~10 MiB for SmolLM2)."""
    from engine.ops import attention_ggml, ggml_kernels  # noqa: PLC0415 - with compiled kernels only

    if long_prompt:
        attention_ggml.load_kernels()
    if precompile.late_ready():
        with KERNEL_LOCK:
            ggml_kernels.load_parallel(isa.lanes() == 8)
    pages.release_libraries()
    warm_pass(model)
    if progress is not None:
        progress(0.85)
    pages.release_libraries()
    pages.trim_heap()


WARM_PROMPT = 4  # tokens: the batch kernels that take four rows or more (RMSNorm's) are among those it compiles


def warm_pass(model: DecoderModel, cache_type: str | None = None, tokens: int = WARM_PROMPT) -> None:
    """A prompt of `tokens` (four), then one decode step, on a KV cache of its own (of cache_type; default the
    model's) (a model with its own pass, such as an encoder-decoder's that encodes first, runs that, on its own cache
    only, once)."""
    own = getattr(model, "warm_pass", None)
    if own is not None:
        if cache_type is None and tokens == WARM_PROMPT:
            own()
        return
    cache = model.new_cache(min(256, model.args.n_ctx), cache_type)
    prompt = np.zeros(min(tokens, cache.n_ctx), np.int64)
    model.forward(prompt, cache)
    cache.commit(prompt.tolist())
    if cache.length < cache.n_ctx:
        model.forward(np.zeros(1, np.int64), cache)


APART_ENV = "GGUF_LENS_COMPILE_APART"  # "1": products_apart runs (app.__main__ sets it)


def weight_kinds(model: DecoderModel) -> set[tuple[GGMLType, int]]:
    """(type, rows) of every weight the model's products read."""
    return {(lin.weight.qtype, lin.weight.n_rows) for lin in model.linears().values()}


def products_apart(weights: Iterable[tuple[GGMLType, int]], progress: Progress | None = None) -> bool:
    """Before this process runs products of types new to the kernel cache (engine.kernels.warmed: a Compare's B
    requantized to another type), helper processes compile them, so that this process only loads them: the
    compile's memory (50-100 MiB of LLVM's work, kept) and its time are the helper's. True when a helper ran and
    succeeded; False when nothing was new, or there is no helper (one core, GGUF_LENS_PRECOMPILE=0): then the
    kernels compile here at their first call, as before. Only in a process that asked for it (GGUF_LENS_COMPILE_APART=1:
    the app, whose memory must come back after each job); a short-lived CLI run or a test loses nothing by compiling
    in place, and would pay a helper's start for each new type."""
    if not compiled() or os.environ.get(APART_ENV, "0") != "1":
        return False
    new = warmed.missing(weights)
    helper = precompile.start_products(new, late=True) if new else None
    return helper is not None and helper.wait(progress)


def _compile_split(model: DecoderModel, weights: set[tuple[GGMLType, int]], progress: Progress | None) -> bool:
    """On a cold kernel cache, the products a first token needs compile in a second process while a dry forward
    pass here compiles the rest of them; then the late kernels start compiling in the background. True when that
    ran."""
    from engine.runtime import decode_step as ggml_step  # noqa: PLC0415 - with compiled kernels only

    cache_type = getattr(getattr(model, "ops", None), "cache_type", None)
    attention = cache_type if cache_type in ("F16", "F32") and getattr(model, "warm_pass", None) is None else None
    helper = precompile.start(weights, ggml_step.ATTEND[bool(isa.w8())], attention)
    if helper is None:
        return False
    path = _file_of(model) if precompile.late_in_background() else None
    with (precompile.dry_products(), precompile.without_late() if path is not None else contextlib.nullcontext(),
          precompile.dry_attention() if attention else contextlib.nullcontext()):
        warm_pass(model)
    helper.wait(progress)
    if path is not None:  # not before: on two cores a third process would slow the first helper down
        names = sorted(f"{GGMLType(t).name}:{int(rows)}" for t, rows in weights)
        precompile.start_late(LATE_PROGRAM, [str(path), *names])
    return True


BATCH_ROWS = (2, GEMV_MAX_ROWS + 1)  # the legacy quants' rows before the first token (one row: a late kernel)
# the late helper's program: compile_late(model file, TYPE:ROWS ...)
LATE_PROGRAM = "import sys; from engine.runtime.late import compile_late; compile_late(sys.argv[1], sys.argv[2:])"


def _file_of(model: DecoderModel) -> Path | None:
    """The GGUF file a model was built from (the late helper builds it again), if it has one."""
    gguf = getattr(getattr(model, "weights", None), "gguf", None)
    path = getattr(gguf, "path", None)
    return Path(path) if path is not None and getattr(model, "is_encoder_decoder", False) is False else None


def dequantize_all(model: DecoderModel, progress: Progress | None) -> None:
    """float32 numerics: the dense weight copies, stacked for fused matrices, within the dense budget."""
    fused = [f for layer in getattr(model, "layers", []) for f in layer.fused()]
    linears = list(model.linears().values())
    total = max(1, len(fused) + len(linears))
    for i, f in enumerate(fused):
        if not f._fresh():
            f._build()
        if progress is not None and i % 8 == 0:
            progress(i / total)
    for j, lin in enumerate(linears):
        lin.dense()
        if progress is not None and j % 8 == 0:
            progress((len(fused) + j) / total)
