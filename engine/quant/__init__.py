"""ggml tensor types: the type table, dequantize (GGUF blocks -> float32) and quantize (float32 -> blocks).

Every kernel works on whole blocks, (n_blocks, type_size) uint8 <-> (n_blocks, block_size)
float32, vectorised with NumPy; these functions add the checks, the chunking and the shapes.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from ..errors import SettingError
from . import floats, iquants, kquantize, kquants, legacy, mxfp4
from .types import TYPES, GGMLType, TypeInfo, type_by_name, type_info
from .weighted import IQ4_TYPES, WEIGHTED_TYPES, quantize_weighted

__all__ = [
    "DEQUANTIZERS",
    "QUANTIZERS",
    "TYPES",
    "WEIGHTED_TYPES",
    "GGMLType",
    "TypeInfo",
    "dequantize",
    "dequantize_rows",
    "quantize",
    "type_by_name",
    "type_info",
]

BlockKernel = Callable[[npt.NDArray[np.uint8]], npt.NDArray[np.float32]]
QuantKernel = Callable[[npt.NDArray[np.float32]], npt.NDArray[np.uint8]]

_T = GGMLType
DEQUANTIZERS: dict[GGMLType, BlockKernel] = {
    _T.F32: floats.dequantize_f32,
    _T.F16: floats.dequantize_f16,
    _T.BF16: floats.dequantize_bf16,
    _T.Q4_0: legacy.dequantize_q4_0,
    _T.Q4_1: legacy.dequantize_q4_1,
    _T.Q5_0: legacy.dequantize_q5_0,
    _T.Q5_1: legacy.dequantize_q5_1,
    _T.Q8_0: legacy.dequantize_q8_0,
    _T.Q2_K: kquants.dequantize_q2_k,
    _T.Q3_K: kquants.dequantize_q3_k,
    _T.Q4_K: kquants.dequantize_q4_k,
    _T.Q5_K: kquants.dequantize_q5_k,
    _T.Q6_K: kquants.dequantize_q6_k,
    _T.MXFP4: mxfp4.dequantize_mxfp4,
    **{t: getattr(iquants, f"dequantize_{t.name.lower()}") for t in (
        _T.IQ4_NL, _T.IQ4_XS, _T.IQ3_XXS, _T.IQ3_S, _T.IQ2_XXS, _T.IQ2_XS, _T.IQ2_S, _T.IQ1_S, _T.IQ1_M)},
}

# the reference quantizers of ggml_quantize_chunk without an imatrix, in ggml-quants.c / ggml.c
QUANTIZERS: dict[GGMLType, QuantKernel] = {
    _T.F32: floats.quantize_f32,
    _T.F16: floats.quantize_f16,
    _T.BF16: floats.quantize_bf16,
    _T.Q4_0: legacy.quantize_q4_0,
    _T.Q4_1: legacy.quantize_q4_1,
    _T.Q5_0: legacy.quantize_q5_0,
    _T.Q5_1: legacy.quantize_q5_1,
    _T.Q8_0: legacy.quantize_q8_0,
    _T.Q2_K: kquantize.quantize_q2_k,
    _T.Q3_K: kquantize.quantize_q3_k,
    _T.Q4_K: kquantize.quantize_q4_k,
    _T.Q5_K: kquantize.quantize_q5_k,
    _T.Q6_K: kquantize.quantize_q6_k,
    # quantize_iq4_nl / quantize_iq4_xs with quant_weights NULL (weights x^2); blocks are independent rows
    _T.IQ4_NL: lambda blocks: quantize_weighted(blocks, GGMLType.IQ4_NL, None),
    _T.IQ4_XS: lambda blocks: quantize_weighted(blocks, GGMLType.IQ4_XS, None),
    _T.MXFP4: mxfp4.quantize_mxfp4,  # quantize_mxfp4 ignores an importance matrix
}

# weights per dequantization chunk: big enough to amortise NumPy's per-call cost, small
# enough that the temporaries of one chunk stay in cache
_CHUNK_WEIGHTS = 1 << 16


def _resolve(qtype: GGMLType | int) -> TypeInfo:
    info = type_info(int(qtype))
    if info is None:
        raise ValueError(f"unknown ggml type id {int(qtype)}")
    return info


def _kernel(info: TypeInfo) -> BlockKernel:
    kernel = DEQUANTIZERS.get(info.qtype)
    if kernel is None:
        raise ValueError(f"dequantizing {info.name} is not supported")
    return kernel


def _dequantize_blocks(blocks: npt.NDArray[np.uint8], info: TypeInfo, out: npt.NDArray[np.float32]) -> None:
    """Dequantize (n_blocks, type_size) into the flat `out`, a chunk of blocks at a time."""
    kernel = _kernel(info)
    with np.errstate(all="ignore"):  # NaN/inf scales decode to NaN/inf, as in C, without warnings
        _run_chunks(kernel, blocks, info, out)


def _run_chunks(kernel: BlockKernel, blocks: npt.NDArray[np.uint8], info: TypeInfo, out: npt.NDArray[np.float32]) -> None:
    if info.block_size == 1:  # plain floats: one vectorised cast is already optimal
        out[:] = kernel(blocks).reshape(-1)
        return
    step = max(1, _CHUNK_WEIGHTS // info.block_size)
    out2 = out.reshape(len(blocks), info.block_size)
    for start in range(0, len(blocks), step):
        out2[start : start + step] = kernel(blocks[start : start + step])


def dequantize(
    raw: npt.NDArray[np.uint8], qtype: GGMLType | int, n_elements: int | None = None
) -> npt.NDArray[np.float32]:
    """Flat float32 weights of `raw`, uint8 bytes of whole blocks of `qtype` in any shape."""
    info = _resolve(qtype)
    raw = np.asarray(raw)
    if raw.dtype != np.uint8:
        raise ValueError(f"{info.name} data must be uint8 bytes, got {raw.dtype}")
    if raw.size % info.type_size:
        raise ValueError(
            f"{info.name} data of {raw.size} bytes is not a whole number of "
            f"{info.type_size}-byte blocks"
        )
    n_blocks = raw.size // info.type_size
    if n_elements is not None and n_elements != n_blocks * info.block_size:
        raise ValueError(
            f"{info.name} data of {raw.size} bytes holds {n_blocks * info.block_size} weights, "
            f"expected {n_elements}"
        )
    blocks = np.ascontiguousarray(raw).reshape(n_blocks, info.type_size)
    out = np.empty(n_blocks * info.block_size, dtype=np.float32)
    _dequantize_blocks(blocks, info, out)
    return out


def dequantize_rows(
    rows: npt.NDArray[np.uint8],
    qtype: GGMLType | int,
    row_ids: npt.ArrayLike | None = None,
) -> npt.NDArray[np.float32]:
    """Dequantize the rows `row_ids` (default all) of a (n_rows, row_bytes) uint8 matrix to (k, n_cols)."""
    info = _resolve(qtype)
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.dtype != np.uint8:
        raise ValueError(f"{info.name} rows must be a 2-D uint8 array, got {rows.dtype} of shape {rows.shape}")
    n_rows, row_bytes = rows.shape
    if row_bytes % info.type_size:
        raise ValueError(
            f"{info.name} row of {row_bytes} bytes is not a whole number of {info.type_size}-byte blocks"
        )
    if row_ids is not None:
        ids = np.asarray(row_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < -n_rows or ids.max() >= n_rows):
            raise IndexError(f"row id out of range for {n_rows} rows")
        rows = rows[ids]  # gathers only the requested rows' bytes
    n_cols = row_bytes // info.type_size * info.block_size
    flat = dequantize(rows, info.qtype)
    return flat.reshape(len(rows), n_cols)


# weights per quantization chunk, by block size: the k-quant searches keep ~20 temporaries
# of a chunk and pay a Python step per weight of a sub-block, so they want bigger chunks
_QUANT_CHUNK_WEIGHTS = {256: 1 << 18}
_QUANT_CHUNK_DEFAULT = 1 << 16


def quantize(
    x: npt.ArrayLike, qtype: GGMLType | int, quant_weights: npt.ArrayLike | None = None
) -> npt.NDArray[np.uint8]:
    """Quantize float32 rows (n_rows, n_cols) to (n_rows, row_bytes) uint8 blocks, byte-exact with llama.cpp.

    `quant_weights` (n_cols,) is the tensor's importance per column (ImportanceMatrix.values): with it the
    types that have a weighted quantizer use it, as ggml_quantize_chunk does with an imatrix.
    """
    info = _resolve(qtype)
    if quant_weights is not None and (info.qtype in WEIGHTED_TYPES or info.qtype in IQ4_TYPES):
        return _quantize_weighted(x, info, quant_weights)
    kernel = QUANTIZERS.get(info.qtype)
    if kernel is None:
        raise SettingError(f"quantizing to {info.name} is not supported")
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise SettingError(f"quantize expects rows of weights (n_rows, n_cols), got shape {x.shape}")
    n_rows, n_cols = x.shape
    if n_cols % info.block_size:
        raise SettingError(
            f"row size {n_cols} is not a multiple of {info.name} block size {info.block_size}"
        )
    blocks = np.ascontiguousarray(x).reshape(-1, info.block_size)
    out = np.empty((len(blocks), info.type_size), dtype=np.uint8)
    step = max(1, _QUANT_CHUNK_WEIGHTS.get(info.block_size, _QUANT_CHUNK_DEFAULT) // info.block_size)
    with np.errstate(all="ignore"):  # C does not trap on 1/0 or inf*0 either; the lanes are masked
        for start in range(0, len(blocks), step):
            out[start : start + step] = kernel(blocks[start : start + step])
    return out.reshape(n_rows, info.row_bytes(n_cols))


def _quantize_weighted(x: npt.ArrayLike, info: TypeInfo, quant_weights: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise SettingError(f"quantize expects rows of weights (n_rows, n_cols), got shape {x.shape}")
    n_cols = x.shape[1]
    if n_cols % info.block_size:
        raise SettingError(f"row size {n_cols} is not a multiple of {info.name} block size {info.block_size}")
    qw = np.asarray(quant_weights, dtype=np.float32).reshape(-1)
    if qw.size != n_cols:
        raise SettingError(f"importance matrix has {qw.size} values for rows of {n_cols}")
    if not np.isfinite(qw).all():
        raise SettingError("importance matrix contains non-finite values")
    return quantize_weighted(x, info.qtype, qw)
