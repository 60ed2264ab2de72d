"""The feed-forward seam of a block: what runs between the FFN norm and the residual add.

`DenseFFN` is the gated FFN every dense architecture has (act(x W_gate) * x W_up, then W_down; Phi-3 holds gate and up
in one matrix). A Mixture-of-Experts FFN is another class beside it with the same `__call__` and `linears`; the block
graph (engine.models.transformer) calls whichever a layer holds, and the compiled decode step takes the dense kind
only (engine.runtime.decode_plan checks the type).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from engine.tensor import FusedLinear, Linear

if TYPE_CHECKING:  # the recorder is passed in; models never build one
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]


class GatedActivation(Protocol):
    """What an FFN asks of the numerics object: the GLU of gate and up rows, as the model's numerics compute it."""

    def glu(self, kind: str, gate: F32, up: F32) -> F32: ...


@dataclass
class DenseFFN:
    """act(gate) * up, then the down product; `glu` is 'swiglu' or 'geglu'."""

    parts: list[Linear]  # [w_gate, w_up], or [w_up] holding gate then up (Phi-3)
    w_down: Linear
    glu: str
    gate_up: FusedLinear = field(init=False)

    def __post_init__(self) -> None:
        self.gate_up = FusedLinear(self.parts)

    @property
    def w_gate(self) -> Linear | None:
        return self.parts[0] if len(self.parts) == 2 else None

    @property
    def w_up(self) -> Linear:
        return self.parts[-1]

    def split(self, parts: list[F32]) -> list[F32]:
        """gate, up: the products' outputs, or the halves of the fused ffn_up (ggml_swiglu's first half is the gate)."""
        if len(parts) == 2:
            return parts
        (y,) = parts
        n = y.shape[-1] // 2
        return [y[..., :n], y[..., n:]]

    def input_names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The matrices each recorded input feeds: gate/up, then down."""
        return tuple(p.weight.name for p in self.parts), (self.w_down.weight.name,)

    def __call__(self, h: F32, ops: GatedActivation, recorder: Recorder | None = None) -> F32:
        """The FFN's output rows (T, dim) for its normed input h (T, dim)."""
        if recorder is not None:  # the inputs of the products, for an importance matrix
            recorder.record_input(self.input_names()[0], h)
        gate, up = self.split(self.gate_up(h))
        g = ops.glu(self.glu, gate, up)
        if recorder is not None:
            recorder.record_input(self.input_names()[1], g)
        return self.w_down(g)

    def linears(self) -> list[Linear]:
        """The matrices, in the order llama.cpp's graph multiplies them."""
        return [*self.parts, self.w_down]
