"""Weights: named tensors read from a GGUF file, each checked against the shape its architecture expects."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError
from engine.gguf import GGUFFile
from engine.quant.types import GGMLType
from engine.tensor import DenseBudget, Linear, QTensor

if TYPE_CHECKING:
    from engine.models.experts import ExpertLinear


class Weights:
    """Reads named tensors from a GGUF file, checking each against the shape the architecture expects."""

    def __init__(self, gguf: GGUFFile, budget: DenseBudget, numerics: str = "float32"):
        self.gguf = gguf
        self.budget = budget
        self.numerics = numerics
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def qtensor(self, name: str, shape: tuple[int, ...]) -> QTensor:
        """The tensor `name` with ggml shape `shape` (row length first), as raw blocks."""
        info = self.gguf.tensors.get(name)
        if info is None:
            raise ModelFormatError(name, "required tensor is missing from the file")
        got = tuple(info.shape) + (1,) * (len(shape) - len(info.shape))
        want = tuple(shape) + (1,) * (len(info.shape) - len(shape))
        if got != want:
            exp = "x".join(map(str, shape))
            raise ModelFormatError(name, f"has wrong shape; expected {exp}, got {'x'.join(map(str, info.shape))}")
        self.used.add(name)
        return QTensor(name, GGMLType(info.qtype), tuple(shape), self.gguf.rows(name))

    def linear(self, name: str, n_in: int, n_out: int) -> Linear:
        t = self.qtensor(name, (n_in, n_out))
        check_finite_mxfp4(t)
        return Linear(t, self.budget, numerics=self.numerics)

    def experts(self, name: str, n_in: int, n_out: int, n_expert: int) -> ExpertLinear:
        """A 3-D expert weight (ggml shape n_in x n_out x n_expert), kept as the memory map's blocks."""
        from engine.models.experts import ExpertLinear  # noqa: PLC0415 - experts builds on this module's neighbours

        return ExpertLinear(self.qtensor(name, (n_in, n_out, n_expert)), n_in, n_out, n_expert, numerics=self.numerics)

    def vector(self, name: str, n: int) -> npt.NDArray[np.float32]:
        """A 1-D tensor (norm weights) as float32."""
        t = self.qtensor(name, (n,))
        return t.dequantize().reshape(n)

    def unused(self) -> list[str]:
        return [n for n in self.gguf.tensors if n not in self.used]


def check_finite_mxfp4(t: QTensor) -> None:
    """An MXFP4 weight whose exponent bytes make infinities is refused by name; other types pass unchecked."""
    if t.qtype == GGMLType.MXFP4:
        from engine.quant.mxfp4 import refuse_infinite  # noqa: PLC0415

        refuse_infinite(t.name, t.blocks)
