"""Getting a model ready for its first token: the CPU kernels compiled (or loaded from numba's cache) and the
repacked weight copies built, or, for float32 numerics, the dequantized weights.

ggml numerics: `dispatch.warm_up` compiles the product kernels of the model's weight types, then a two-token
prompt and one decode step compile the rest of a forward pass and build every product's repacked copy. On a cold
cache with two cores or more the products compile in a second process meanwhile (engine.kernels.precompile)
while a dry pass here compiles the rest, so the first start takes about half as long.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from engine.kernels import isa, pages, precompile
from engine.kernels.dispatch import compiled, warm_up

if TYPE_CHECKING:
    from engine.models.decoder import DecoderModel
    from engine.quant.types import GGMLType

Progress = Callable[[float], None]


def warm(model: DecoderModel, progress: Progress | None = None) -> None:
    """ggml numerics: compile the CPU kernels and build the products' copies."""
    def part(lo: float, hi: float) -> Progress | None:
        return None if progress is None else (lambda f: progress(lo + (hi - lo) * f))

    weights = {(lin.weight.qtype, lin.weight.n_rows) for lin in model.linears().values()}
    split = compiled() and _compile_split(model, weights, part(0.0, 0.6))
    warm_up(weights, part(0.6 if split else 0.0, 0.7))
    if compiled():
        # the products' repacked copies are built and the prompt and decode-step kernels compiled (or loaded)
        # now, not at the first real token; after them LLVM's code (libllvmlite.so, ~80 MiB resident since its
        # import) is needed again only to compile, so its pages go back
        pages.release_libraries()  # before the copies are made, so the peak is not libraries + copies
        warm_pass(model)
        if progress is not None:
            progress(0.85)
        pages.release_libraries()
    if progress is not None:
        progress(1.0)


def warm_pass(model: DecoderModel) -> None:
    """A two-token prompt, then one decode step, on a KV cache of its own (a model with its own pass, such as an
    encoder-decoder's that encodes first, runs that)."""
    own = getattr(model, "warm_pass", None)
    if own is not None:
        own()
        return
    cache = model.new_cache(min(256, model.args.n_ctx))
    prompt = np.zeros(min(2, cache.n_ctx), np.int64)
    model.forward(prompt, cache)
    cache.commit(prompt.tolist())
    if cache.length < cache.n_ctx:
        model.forward(np.zeros(1, np.int64), cache)


def _compile_split(model: DecoderModel, weights: set[tuple[GGMLType, int]], progress: Progress | None) -> bool:
    """On a cold kernel cache, the product kernels compile in a second process while a dry forward pass here
    compiles the rest; True when that ran."""
    from engine.runtime import decode_step as ggml_step  # noqa: PLC0415 - with compiled kernels only

    helper = precompile.start(weights, ggml_step.ATTEND[bool(isa.w8())])
    if helper is None:
        return False
    with precompile.dry_products():
        warm_pass(model)
    helper.wait(progress)
    return True


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
