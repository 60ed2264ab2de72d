"""The bound products of the compiled decode step (engine.runtime.decode_plan): an activation row quantized once for
every type its products read, and each product bound to its weight, that row's bytes and its output buffer, with
views of the parts a fused product holds (q/k/v, gate/up, a DeltaNet layer's inputs)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.kernels.dispatch import BlockProduct
from engine.kernels.types import VEC_DOT_TYPE, act_bytes
from engine.quant.types import GGMLType
from engine.tensor import Linear

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
EMPTY = np.zeros(0, np.float32)


class Inputs:
    """One activation row quantized for every vec_dot_type its readers need: buffers (1, bytes) per type."""

    def __init__(self, n: int, qtypes: list[GGMLType]):
        self.vdts = sorted({VEC_DOT_TYPE[q] for q in qtypes})
        self.bufs = {v: np.zeros((1, act_bytes(v, n)), np.uint8) for v in self.vdts}

    def slots(self) -> tuple[int, U8, int, U8]:
        """The first two (type, buffer) pairs as residual_norm_quant takes them (-1 when there is one)."""
        a = self.vdts[0]
        b = self.vdts[1] if len(self.vdts) > 1 else -1
        return int(a), self.bufs[a], int(b), self.bufs[b] if b != -1 else self.bufs[a]


@dataclass
class Product:
    """A bound product and where its output rows go: (run, out (1, n_out), [(part, start, stop)])."""

    run: Callable[[], None]
    out: F32
    parts: list[tuple[Linear, int, int]]


def bind(product: BlockProduct, members: list[Linear], inputs: Inputs) -> Product | None:
    out = np.zeros((1, product.n_out), np.float32)
    run = product.bind(inputs.bufs[VEC_DOT_TYPE[product.qtype]], out)
    if run is None:
        return None
    parts, start = [], 0
    for m in members:
        parts.append((m, start, start + m.n_out))
        start += m.n_out
    return Product(run, out, parts)


def bind_all(groups: list[tuple[BlockProduct, list[Linear]]], inputs: Inputs) -> list[Product] | None:
    bound = [bind(p, members, inputs) for p, members in groups]
    return None if any(b is None for b in bound) else bound  # type: ignore[return-value]


def views(bound: list[Product]) -> list[F32]:
    """The output (n,) of each part, in the order of the fused linear's parts."""
    return [b.out[0, s:e] for b in bound for _, s, e in b.parts]


def vec(v: F32 | None) -> F32:
    """A layer's optional norm weight, or the empty array the compiled step reads as 'none'."""
    return EMPTY if v is None else v
