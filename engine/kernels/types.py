"""The one table of the weight types the kernels multiply: each type's vec_dot_type (what ggml-cpu quantizes the
activations to before a product) and the activation types' block layouts. Every other place reads these."""
from __future__ import annotations

from engine.quant.types import GGMLType

_T = GGMLType
LEGACY = (_T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0)
FLOATS = (_T.F32, _T.F16, _T.BF16)
K_QUANTS = (_T.Q2_K, _T.Q3_K, _T.Q4_K, _T.Q5_K, _T.Q6_K)
# the i-quants: vec_dot on Q8_K rows (Q8_0 for IQ4_NL), engine.kernels.iquant.dot; and MXFP4 (Q8_0), whose
# kernels are IQ4_NL's with another table and scale
I_QUANTS = (_T.IQ4_NL, _T.IQ4_XS, _T.IQ3_XXS, _T.IQ3_S, _T.IQ2_XXS, _T.IQ2_XS, _T.IQ2_S, _T.IQ1_S, _T.IQ1_M,
            _T.MXFP4)

# type_traits_cpu[type].vec_dot_type in ggml-cpu.c
VEC_DOT_TYPE: dict[GGMLType, GGMLType] = {
    _T.F32: _T.F32, _T.F16: _T.F16, _T.BF16: _T.BF16,
    _T.Q4_0: _T.Q8_0, _T.Q5_0: _T.Q8_0, _T.Q8_0: _T.Q8_0,
    _T.Q4_1: _T.Q8_1, _T.Q5_1: _T.Q8_1,
    **{t: _T.Q8_K for t in K_QUANTS + I_QUANTS}, _T.IQ4_NL: _T.Q8_0, _T.MXFP4: _T.Q8_0,
}

# (values, bytes) per block of each activation type as ggml-cpu lays it out: block_q8_1 is 36 bytes (two fp16 and
# 32 quants; the GGUF type table's 40 is gguf-py's historical float d and s), block_q8_K 292
ACT_BLOCK: dict[GGMLType, tuple[int, int]] = {
    _T.F32: (1, 4), _T.F16: (1, 2), _T.BF16: (1, 2), _T.Q8_0: (32, 34), _T.Q8_1: (32, 36), _T.Q8_K: (256, 292),
}


def act_bytes(vdt: GGMLType, n: int) -> int:
    """Bytes of one activation row of n values in activation type vdt."""
    size, nbytes = ACT_BLOCK[vdt]
    return n // size * nbytes
