"""TensorRecord: one tensor for the Quantization lens, its weight and block-scale distributions and one block decoded."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from app.records.model import tensor_row
from engine.quant import dequantize_rows
from engine.quant.blocks import DecodedBlock, block_scales, decode_block, histogram
from engine.quant.types import GGMLType, type_info

if TYPE_CHECKING:
    from engine.gguf import GGUFFile
    from engine.model import Model

F32 = npt.NDArray[np.float32]
HIST_BINS = 128
MAX_HIST_WEIGHTS = 1 << 22  # past this many weights the histogram uses evenly spaced rows


@dataclass(frozen=True)
class TensorRecord:
    """One tensor for the quant lens: weight and block-scale distributions and one block decoded."""

    name: str
    layer: int | None
    role: str
    type_name: str
    shape: tuple[int, ...]
    nbytes: int
    bpw: float
    n_elements: int
    weight_counts: npt.NDArray[np.int64]  # histogram of the dequantized weights
    weight_edges: F32
    weight_stats: dict[str, float]  # min, max, mean, std, absmax
    sampled_rows: int  # rows that went into the histogram (n_rows when all)
    n_rows: int
    scale_counts: dict[str, npt.NDArray[np.int64]]  # field name ('d', 'sub-block scale', ...) -> histogram
    scale_edges: dict[str, F32]
    block: DecodedBlock | None  # None when the type cannot be decoded
    block_index: int
    elapsed_s: float


def _live_blocks(model: Model | GGUFFile, name: str) -> tuple[np.ndarray, GGMLType]:
    """The tensor's current blocks (after any requantization), (n_rows, row_bytes) uint8, and type."""
    net = getattr(model, "net", None)
    if net is not None:
        lin = net.linears().get(name)
        if lin is not None:
            return lin.weight.blocks, lin.weight.qtype
    gguf = model.gguf if net is not None else model
    return gguf.rows(name), GGMLType(gguf.tensors[name].qtype)


def make_tensor_record(model: Model | GGUFFile, tensor_name: str, *, block_index: int = 0) -> TensorRecord:
    """Histograms of the tensor's dequantized weights and block scales, and block `block_index` decoded."""
    t0 = time.perf_counter()
    gguf = model.gguf if getattr(model, "net", None) is not None else model
    if tensor_name not in gguf.tensors:
        raise KeyError(f"no tensor named {tensor_name!r} in {getattr(gguf, 'path', 'the model')}")
    row = tensor_row(gguf.tensors[tensor_name])
    blocks, qtype = _live_blocks(model, tensor_name)
    info = type_info(int(qtype))
    n_rows = blocks.shape[0]
    per_row = max(1, row.shape[0])
    keep = max(1, min(n_rows, MAX_HIST_WEIGHTS // per_row))
    ids = np.unique(np.linspace(0, n_rows - 1, keep).round().astype(np.int64))
    counts, edges, stats = histogram(np.zeros(0, np.float32), HIST_BINS)
    scale_counts: dict[str, np.ndarray] = {}
    scale_edges: dict[str, np.ndarray] = {}
    block = None
    flat_blocks = np.asarray(blocks[ids]).reshape(-1, info.type_size) if info else None
    if info is not None and info.supported:
        w = dequantize_rows(blocks, qtype, ids).reshape(-1)
        counts, edges, stats = histogram(w, HIST_BINS)
        for key, vals in block_scales(flat_blocks, qtype).items():
            scale_counts[key], scale_edges[key], _ = histogram(vals, HIST_BINS)
    if info is not None:
        all_blocks = np.asarray(blocks).reshape(-1, info.type_size)
        block_index = int(np.clip(block_index, 0, len(all_blocks) - 1))
        block = decode_block(np.array(all_blocks[block_index]), qtype)
    return TensorRecord(
        name=row.name, layer=row.layer, role=row.role, type_name=row.type_name, shape=row.shape, nbytes=row.nbytes,
        bpw=row.bpw, n_elements=row.n_elements, weight_counts=counts, weight_edges=edges, weight_stats=stats,
        sampled_rows=len(ids), n_rows=n_rows, scale_counts=scale_counts, scale_edges=scale_edges, block=block,
        block_index=block_index, elapsed_s=time.perf_counter() - t0,
    )
