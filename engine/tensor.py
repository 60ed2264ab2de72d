"""QTensor (a weight as its raw GGUF blocks) and Linear (how such a weight is multiplied on the CPU).

A Linear multiplies in one of two numerics: `ggml` (the default for loaded models) computes on the blocks with
ggml-cpu's activation quantization (engine.kernels) and keeps no float copy of the weight; `float32` is the
textbook reference: the weight dequantized to float32 (cached within a DenseBudget) times float32 activations.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from engine.kernels.dispatch import NUMERICS, Activation, BlockProduct
from engine.quant import dequantize_rows
from engine.quant.types import TYPES, GGMLType, TypeInfo

log = logging.getLogger(__name__)


@dataclass
class QTensor:
    """A tensor held as its ggml blocks: `blocks` is (n_rows, row_bytes) uint8, usually a read-only memmap."""

    name: str
    qtype: GGMLType
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    blocks: np.ndarray

    @property
    def info(self) -> TypeInfo:
        return TYPES[self.qtype]

    @property
    def n_cols(self) -> int:
        return self.shape[0]

    @property
    def n_rows(self) -> int:
        return self.blocks.shape[0]

    @property
    def nbytes(self) -> int:
        return int(self.blocks.size)

    @property
    def n_elements(self) -> int:
        return self.n_cols * self.n_rows

    def dequantize(self) -> npt.NDArray[np.float32]:
        """All rows as float32, (n_rows, n_cols)."""
        return dequantize_rows(self.blocks, self.qtype)

    def rows(self, ids: npt.ArrayLike) -> npt.NDArray[np.float32]:
        """Selected rows as float32 (len(ids), n_cols): embedding look-ups without expanding the table."""
        return dequantize_rows(self.blocks, self.qtype, np.asarray(ids, dtype=np.int64))


@dataclass
class DenseBudget:
    """How many bytes of float32 weight copies the model may keep; beyond it layers dequantize per call."""

    limit: int
    used: int = 0

    def take(self, nbytes: int) -> bool:
        if self.used + nbytes > self.limit:
            return False
        self.used += nbytes
        return True

    def give_back(self, nbytes: int) -> None:
        self.used = max(0, self.used - nbytes)


@dataclass
class Linear:
    """y = x @ W^T for a GGUF weight W of shape (n_out, n_in), with an optional float32 cache of W."""

    weight: QTensor
    budget: DenseBudget
    # keep the float32 copy column-major: for a tall matrix such as the output head (n_vocab x dim), x @ W^T then
    # reads W^T row by row, which BLAS does about twice as fast for a single token
    column_major: bool = False
    numerics: str = "float32"  # 'ggml': products on the blocks (engine.kernels); 'float32': dequantized weights
    _dense: np.ndarray | None = field(default=None, repr=False)
    _product: BlockProduct | None = field(default=None, repr=False)
    # LoRA adapters on this weight (engine.intervene.lora): (lora_a, lora_b, scale), added in order after the product
    loras: list[tuple[Linear, Linear, float]] = field(default_factory=list, repr=False)
    swaps: ClassVar[int] = 0  # weights replaced in any Linear so far: device copies (engine/gpu) look when it moves

    @property
    def n_in(self) -> int:
        return self.weight.n_cols

    @property
    def n_out(self) -> int:
        return self.weight.n_rows

    def dense(self) -> npt.NDArray[np.float32]:
        """W as float32 (n_out, n_in): the cached copy when the budget allows, else a fresh one."""
        if self._dense is not None:
            return self._dense
        w = self.weight.dequantize()
        if self.column_major:
            w = np.ascontiguousarray(w.T).T  # same (n_out, n_in) shape, Fortran order
        if self.budget.take(w.nbytes):
            self._dense = w
        return w

    def __post_init__(self) -> None:
        if self.numerics not in NUMERICS:
            raise ValueError(f"numerics {self.numerics!r} is not one of {', '.join(NUMERICS)}")

    def product(self) -> BlockProduct:
        """The block product of the current weight (rebuilt when the blocks were swapped)."""
        if self._product is None or self._product.blocks is not self.weight.blocks:
            self._product = BlockProduct(self.weight.qtype, self.weight.blocks, self.n_in)
        return self._product

    def drop_cache(self) -> None:
        """Forget the float32 copy (after requantizing, or to free memory)."""
        if self._dense is not None:
            self.budget.give_back(self._dense.nbytes)
            self._dense = None

    def replace(self, weight: QTensor) -> None:
        """Swap in new blocks (same shape), dropping the float32 copy."""
        if weight.shape != self.weight.shape:
            raise ValueError(f"{weight.name}: new shape {weight.shape} != {self.weight.shape}")
        self.drop_cache()
        self.weight = weight
        self._product = None
        Linear.swaps += 1

    def __call__(self, x: npt.NDArray[np.float32] | Activation) -> npt.NDArray[np.float32]:
        # x: (T, n_in) -> (T, n_out)
        if self.numerics == "ggml":
            return self.with_loras(self.product()(x), x)
        x = x.x if isinstance(x, Activation) else x
        return self.with_loras(x @ self.dense().T, x)

    def with_loras(self, y: npt.NDArray[np.float32], x: npt.NDArray[np.float32] | Activation) -> npt.NDArray[np.float32]:
        """build_lora_mm's additions to the product y of x: per adapter lora_b (lora_a x), ggml_scale'd, ggml_add'ed."""
        for a, b, scale in self.loras:
            y = y + b(a(x)) * np.float32(scale)
        return y


class FusedLinear:
    """Several Linears that read the same input (q/k/v, gate/up) multiplied as one matrix.

    One BLAS call instead of several matters for single-token decode, where each call is short. The parts
    keep their identity (the Quantization lens and requantizing address them by tensor name): their float32
    copies become row-views into one stacked array, rebuilt when any part was replaced.
    """

    def __init__(self, parts: list[Linear]):
        self.parts = parts
        self._groups: list[tuple[BlockProduct, list[Linear]]] = []  # ggml numerics: products and their parts
        self._groups_key: tuple[int, ...] = ()
        self._stacked: np.ndarray | None = None
        self._views: list[np.ndarray] = []
        self.splits = np.cumsum([p.n_out for p in parts])[:-1].tolist()

    def products(self) -> list[tuple[BlockProduct, list[Linear]]]:
        """ggml numerics: the products this input runs, each with the parts whose rows it holds (in order).

        Consecutive parts of one repackable type are stacked into one product (one kernel call); the grouping is
        rebuilt when a part's blocks were swapped."""
        key = tuple(id(p.weight.blocks) for p in self.parts)
        if key != self._groups_key or not self._groups:
            runs: list[list[Linear]] = []
            for p in self.parts:
                if runs and runs[-1][0].weight.qtype == p.weight.qtype:
                    runs[-1].append(p)
                else:
                    runs.append([p])
            built: list[tuple[BlockProduct, list[Linear]]] = []
            for members in runs:
                qtype = members[0].weight.qtype
                if len(members) > 1 and BlockProduct.can_fuse(qtype):
                    built.append((BlockProduct.fused(qtype, [m.weight.blocks for m in members], members[0].n_in), members))
                else:
                    built.extend((m.product(), [m]) for m in members)
            self._groups, self._groups_key = built, key
        return self._groups

    def _ggml(self, x: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
        """ggml numerics: x quantized once per vec_dot_type, read by every product."""
        act = Activation(x)  # quantized once per vec_dot_type, read by every part
        outs: list[npt.NDArray[np.float32]] = []
        for product, members in self.products():
            y = product(act)
            start = 0
            for m in members:
                outs.append(m.with_loras(y[:, start : start + m.n_out], act) if m.loras else y[:, start : start + m.n_out])
                start += m.n_out
        return outs

    def _fresh(self) -> bool:
        return self._stacked is not None and all(p._dense is v for p, v in zip(self.parts, self._views))

    def _build(self) -> np.ndarray | None:
        budget = self.parts[0].budget
        for p in self.parts:
            p.drop_cache()
        n_in = self.parts[0].n_in
        n_out = sum(p.n_out for p in self.parts)
        if not budget.take(n_out * n_in * 4):
            return None
        stacked = np.empty((n_out, n_in), np.float32)
        self._views = []
        row = 0
        for p in self.parts:
            view = stacked[row : row + p.n_out]
            view[:] = p.weight.dequantize()
            p._dense = view
            self._views.append(view)
            row += p.n_out
        # the parts' views are accounted for once, here; drop_cache on a part gives back its share
        self._stacked = stacked
        return stacked

    def __call__(self, x: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
        """[x @ W_i^T for each part], computed with one matrix product when the cache allows."""
        if self.parts[0].numerics == "ggml":
            return self._ggml(x)
        if not self._fresh():
            self._stacked = None
            if self._build() is None:
                return [p(x) for p in self.parts]  # each adds its own adapters
        y = x @ self._stacked.T  # (T, sum n_out)
        return [p.with_loras(y[:, a:b], x) for p, a, b in zip(self.parts, [0, *self.splits], [*self.splits, y.shape[-1]])]
