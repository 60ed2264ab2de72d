"""The product helper's program (engine.kernels.precompile starts it as a process of its own): compile, or load
from numba's cache, the product kernels of the weights named TYPE:ROWS. A module apart from precompile because
it imports the kernel families, and they import precompile."""
from __future__ import annotations

import os

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
    both sets (every path a loaded model may take for them, late kernels ready or not)."""
    weights = parse_weights(names)
    both = os.environ.get(precompile.BOTH_ENV) == "1"  # start_products(late=True), for a loaded model
    background = precompile.late_in_background()
    if both or background:
        with precompile.without_late():
            warm_up(weights, legacy_rows=(2, GEMV_MAX_ROWS + 1))
    if both or not background:
        warm_up(weights)
