"""The product helper's program (engine.kernels.precompile starts it as a process of its own): compile, or load
from numba's cache, the product kernels of the weights named TYPE:ROWS. A module apart from precompile because
it imports the kernel families, and they import precompile."""
from __future__ import annotations

import os

import numpy as np

from engine.kernels import precompile
from engine.kernels.dispatch import GEMV_MAX_ROWS, warm_up
from engine.quant.types import GGMLType


def parse_weights(names: list[str]) -> set[tuple[GGMLType, int]]:
    """{(type, rows)} from the helpers' command-line form, TYPE:ROWS (Q4_K:576)."""
    weights = set()
    for name in names:
        kind, _, rows = name.partition(":")
        weights.add((GGMLType[kind], int(rows)))
    return weights


def products(names: list[str]) -> None:
    """The products of the weights named TYPE:ROWS: those a first token needs when the late kernels compile in the
    background (not the legacy quants' one-row products, not the VNNI batches), else all of them; with BOTH_ENV=1
    both sets (every path a loaded model may take for them, late kernels ready or not). Then the attention row
    products of the caches named attention:F16 / attention:F32 (precompile.start's `attention`)."""
    jobs = [n.partition(":")[2] for n in names if n.startswith(precompile.ATTENTION + ":")]
    weights = parse_weights([n for n in names if not n.startswith(precompile.ATTENTION + ":")])
    both = os.environ.get(precompile.BOTH_ENV) == "1"  # start_products(late=True), for a loaded model
    background = precompile.late_in_background()
    if both or background:
        with precompile.without_late():
            warm_up(weights, legacy_rows=(2, GEMV_MAX_ROWS + 1))
    if both or not background:
        warm_up(weights)
    for cache_type in jobs:
        attention_products(cache_type)


def attention_products(cache_type: str) -> None:
    """Compile (or load) the serial ggml_vec_dot_f16 / _f32 row products that a prompt's attention runs on a cache of
    this type (engine.ops.attention_ggml._vec_dot), in the build order of numba's target, with the argument types
    that call passes (C-contiguous, writable)."""
    from engine.kernels import isa  # noqa: PLC0415
    from engine.kernels.floats import vec_dot  # noqa: PLC0415 - compiled kernels only

    step, out = np.int64(4 * isa.lanes()), np.empty((1, 1), np.float32)
    if cache_type == "F16":  # the query rounded to fp16 (vec_dot_type F16), then the products
        from engine.kernels.activations import quantize_f16  # noqa: PLC0415

        row = quantize_f16(np.zeros((1, 64), np.float32)).view(np.uint16).reshape(1, -1)
        vec_dot.dot_f16_serial(row.copy(), row, out, step)
    elif cache_type == "F32":
        row = np.zeros((1, 64), np.float32)
        vec_dot.dot_f32_serial(row, row.copy(), out, step)
