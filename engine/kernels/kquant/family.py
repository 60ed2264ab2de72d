"""The k-quant kernels (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) in one place: what each type runs, by ggml type.

  gemv_<type>(blocks, xq, out)             one Q8_K activation row against every weight row
  gemm_<type>(blocks, xq, out)             m activations (m, bytes) -> out (m, n_rows)
  dequantize_rows_<type>(blocks, r0, r1, out)   rows r0 .. r1 - 1 to float32, as engine.quant

`blocks` is the (n_rows, row_bytes) uint8 weight, usually a read-only np.memmap view used in
place; `xq` comes from quantize_q8_k. The products are bit for bit ggml-cpu's (x86 AVX2 path of
ggml_vec_dot_q*_K_q8_K); `matmul_ref` is the same in NumPy. The modules behind this one:

  q8k.py             activation quantization (quantize_row_q8_K)
  simd.py            the LLVM vector helpers (x86 AVX2 intrinsics, or portable IR)
  kquant_lanes.py    the integer core of a super-block, as explicit LLVM vectors
  kquant_dot.py      the float accumulation, rows and threads (gemv / gemm)
  kquant_dequant.py  dequantization of row tiles
  kquant_ref.py      the NumPy reference

numba caches each kernel under the file of its jitted function (kquant_dot.py, kquant_dequant.py,
q8k.py) and does not notice edits to simd.py or kquant_lanes.py, whose IR those kernels inline:
after changing either, touch the kernel files or clear their __pycache__ so they recompile.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from engine.quant.types import TYPES, GGMLType

from engine.kernels.kquant.dequant import (
    dequantize_rows_q2_k,
    dequantize_rows_q3_k,
    dequantize_rows_q4_k,
    dequantize_rows_q5_k,
    dequantize_rows_q6_k,
)
from engine.kernels.kquant.dot import (
    gemm_q2_k,
    gemm_q3_k,
    gemm_q4_k,
    gemm_q5_k,
    gemm_q6_k,
    gemv_q2_k,
    gemv_q4_k,
    gemv_q5_k,
    gemv_q6_k,
)
from engine.kernels.kquant.q3_k_gemv import gemv_q3_k
from engine.kernels.kquant.ref import KQUANT_TYPES, matmul_ref
from engine.kernels.q8k import Q8K_BLOCK_BYTES, quantize_q8_k, quantize_q8_k_ref

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
Product = Callable[[U8, U8, F32], F32]
DequantRows = Callable[[U8, int, int, F32], F32]

_T = GGMLType
GEMV: dict[GGMLType, Product] = {
    _T.Q2_K: gemv_q2_k, _T.Q3_K: gemv_q3_k, _T.Q4_K: gemv_q4_k, _T.Q5_K: gemv_q5_k, _T.Q6_K: gemv_q6_k,
}
GEMM: dict[GGMLType, Product] = {
    _T.Q2_K: gemm_q2_k, _T.Q3_K: gemm_q3_k, _T.Q4_K: gemm_q4_k, _T.Q5_K: gemm_q5_k, _T.Q6_K: gemm_q6_k,
}
DEQUANTIZE_ROWS: dict[GGMLType, DequantRows] = {
    _T.Q2_K: dequantize_rows_q2_k, _T.Q3_K: dequantize_rows_q3_k, _T.Q4_K: dequantize_rows_q4_k,
    _T.Q5_K: dequantize_rows_q5_k, _T.Q6_K: dequantize_rows_q6_k,
}


def matmul(qtype: GGMLType, blocks: U8, x: npt.ArrayLike) -> F32:
    """ggml's product of weight rows with float32 activations x (n,) -> (n_rows,) or (m, n) -> (m, n_rows)."""
    if qtype not in GEMV:
        raise ValueError(f"{GGMLType(qtype).name} is not a k-quant type")
    x = np.asarray(x, dtype=np.float32)
    n_cols = blocks.shape[1] // TYPES[qtype].type_size * 256
    if x.shape[-1] != n_cols:
        raise ValueError(f"activation of {x.shape[-1]} values for {qtype.name} rows of {n_cols} weights")
    xq = quantize_q8_k(x)
    if x.ndim == 1:
        return GEMV[qtype](blocks, xq, np.empty(blocks.shape[0], np.float32))
    return GEMM[qtype](blocks, xq, np.empty((x.shape[0], blocks.shape[0]), np.float32))


__all__ = [
    "DEQUANTIZE_ROWS",
    "GEMM",
    "GEMV",
    "KQUANT_TYPES",
    "Q8K_BLOCK_BYTES",
    "dequantize_rows_q2_k",
    "dequantize_rows_q3_k",
    "dequantize_rows_q4_k",
    "dequantize_rows_q5_k",
    "dequantize_rows_q6_k",
    "gemm_q2_k",
    "gemm_q3_k",
    "gemm_q4_k",
    "gemm_q5_k",
    "gemm_q6_k",
    "gemv_q2_k",
    "gemv_q3_k",
    "gemv_q4_k",
    "gemv_q5_k",
    "gemv_q6_k",
    "matmul",
    "matmul_ref",
    "quantize_q8_k",
    "quantize_q8_k_ref",
]
