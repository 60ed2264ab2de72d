"""Weights on the device in their GGUF blocks, and how they multiply: fused GEMV for one row, tiles plus cuBLAS for many."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.errors import SettingError
from engine.gpu.device import GRID_CAP, Device, arg
from engine.quant.types import GGMLType
from engine.tensor import Linear, QTensor

# every type ggml_blocks.cu decodes (the NumPy engine's dequantizable types)
DEVICE_TYPES = frozenset({
    GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
    GGMLType.Q8_0, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
})
MAX_PARTS = 3  # matrices one gemv / dequant_rows launch takes (q/k/v)
GEMV_THREADS = 256  # GEMV_WARPS * 32 in gemv.cu
TARGET_BLOCKS = 1024  # gemv blocks to aim for: several per multiprocessor
TILE_BYTES = 64 << 20  # largest float32 tile dequantized at once for a product (the 262k-row Gemma head is 671 MB)
MAX_SHARED = 200 << 10  # gemv keeps its input in shared memory: n_in <= 51200


class BlockStore:
    """The device copies of QTensors' blocks, shared between users of one tensor (tied embeddings)."""

    def __init__(self, device: Device):
        self.device = device
        self._blocks: dict[tuple, Any] = {}

    @staticmethod
    def key(t: QTensor) -> tuple:
        return (t.name, int(t.qtype), t.blocks.shape, t.blocks.__array_interface__["data"][0])

    def get(self, t: QTensor) -> Any:
        """Device (n_rows, row_bytes) uint8 blocks of t, uploaded once."""
        check_tensor(t)
        k = self.key(t)
        if k not in self._blocks:
            self._blocks[k] = self.device.upload(np.asarray(t.blocks), np.uint8)
        return self._blocks[k]

    def keep_only(self, live: list[QTensor]) -> None:
        """Drop uploads no user holds any more (after requantizing)."""
        keys = {self.key(t) for t in live}
        self._blocks = {k: v for k, v in self._blocks.items() if k in keys}

    @property
    def nbytes(self) -> int:
        return sum(int(b.nbytes) for b in self._blocks.values())


def check_tensor(t: QTensor) -> None:
    """SettingError when the kernels cannot run this tensor."""
    if t.qtype not in DEVICE_TYPES:
        raise SettingError(f"{t.name}: type {t.qtype.name} has no CUDA kernel")
    if t.n_cols % 4:
        raise SettingError(f"{t.name}: rows of {t.n_cols} weights are not a multiple of 4, which the CUDA kernels need")


@dataclass
class _Part:
    linear: Linear
    source: QTensor  # what was uploaded; Linear.weight changes when the layer is requantized
    blocks: Any


class DeviceLinear:
    """Host Linears that read the same input (q/k/v, gate/up, or one), multiplied on the device from their blocks."""

    def __init__(self, device: Device, store: BlockStore, linears: list[Linear]):
        if not 1 <= len(linears) <= MAX_PARTS:
            raise ValueError(f"a DeviceLinear takes 1 to {MAX_PARTS} matrices, got {len(linears)}")
        self.device = device
        self.store = store
        self.n_in = linears[0].n_in
        if any(lin.n_in != self.n_in for lin in linears):
            raise ValueError("fused matrices must read inputs of one size")
        if self.n_in * 4 > MAX_SHARED:
            raise SettingError(f"{linears[0].weight.name}: rows of {self.n_in} weights are too long for the CUDA GEMV")
        self.parts = [_Part(lin, lin.weight, store.get(lin.weight)) for lin in linears]
        self.n_out = sum(lin.n_out for lin in linears)
        self.offsets = np.cumsum([0] + [lin.n_out for lin in linears]).tolist()
        self.rows_per_block = max(8, math.ceil(self.n_out / TARGET_BLOCKS / 8) * 8)

    def stale(self) -> bool:
        """True when a part's host weight was swapped (requantized) since it was uploaded."""
        return any(p.linear.weight is not p.source for p in self.parts)

    def refresh(self) -> None:
        """Upload the parts' current weights."""
        for p in self.parts:
            p.source = p.linear.weight
            p.blocks = self.store.get(p.source)

    def sources(self) -> list[QTensor]:
        return [p.source for p in self.parts]

    def _segments(self, outputs: list[Any] | None) -> tuple:
        """(blocks, type, rows, row_bytes[, out]) for three parts, empty ones padded with nulls."""
        args: list[Any] = []
        for k in range(MAX_PARTS):
            if k < len(self.parts):
                p = self.parts[k]
                seg = [p.blocks, np.int32(int(p.source.qtype)), np.int32(p.source.n_rows), np.int32(p.blocks.shape[1])]
            else:
                seg = [arg(None), np.int32(0), np.int32(0), np.int32(0)]
            if outputs is not None:
                seg.append(arg(outputs[k] if k < len(outputs) else None))
            args += seg
        return tuple(args)

    def gemv(self, x: Any, out: Any, *, norm_w: Any = None, eps: float = 0.0, act: int = 0, x2: Any = None,
             resid: Any = None) -> None:
        """out (n_out,) = W @ prologue(x); prologue: rms_norm(x) * norm_w, or act(x) * x2; out += resid when given."""
        flat = out.reshape(-1)
        outs = [flat[a:b] for a, b in zip(self.offsets[:-1], self.offsets[1:])]
        grid = math.ceil(self.n_out / self.rows_per_block)
        args = (x, arg(x2), arg(norm_w), np.float32(eps), np.int32(act), np.int32(self.n_in),
                *self._segments(outs), arg(resid), np.int32(self.rows_per_block))
        self.device.launch("gemv", grid, GEMV_THREADS, args, shared_mem=self.n_in * 4)

    def dequantize(self) -> Any:
        """All parts stacked as one float32 (n_out, n_in) matrix on the device."""
        w = self.device.empty((self.n_out, self.n_in))
        self._dequant_into(self._segments(None), self.n_out, w)
        return w

    def _dequant_into(self, segments: tuple, n_rows: int, out: Any) -> None:
        grid = min(GRID_CAP, max(1, math.ceil(n_rows * self.n_in / 4 / 256)))
        self.device.launch("dequant_rows", grid, 256, (*segments, np.int32(self.n_in), out, arg(None)))

    def matmul(self, x: Any) -> Any:
        """x (T, n_in) @ W^T -> (T, n_out): float32 tiles of W multiplied by cuBLAS."""
        if x.shape[0] == 1:
            y = self.device.empty((1, self.n_out))
            self.gemv(x, y)
            return y
        if self.n_out * self.n_in * 4 <= TILE_BYTES:
            return x @ self.dequantize().T
        return self._matmul_tiled(x)

    def _matmul_tiled(self, x: Any) -> Any:
        y = self.device.empty((x.shape[0], self.n_out))
        step = max(1, TILE_BYTES // (self.n_in * 4))
        for p, off in zip(self.parts, self.offsets):
            for r0 in range(0, p.source.n_rows, step):
                r1 = min(p.source.n_rows, r0 + step)
                tile = self.device.empty((r1 - r0, self.n_in))
                seg = (p.blocks[r0:r1], np.int32(int(p.source.qtype)), np.int32(r1 - r0), np.int32(p.blocks.shape[1]))
                blank = (arg(None), np.int32(0), np.int32(0), np.int32(0))
                self._dequant_into(seg + blank + blank, r1 - r0, tile)
                y[:, off + r0 : off + r1] = x @ tile.T
        return y
