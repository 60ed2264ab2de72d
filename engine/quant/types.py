"""The table of ggml tensor types: ids, block sizes and bytes per block, as in ggml.h / gguf-py."""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class GGMLType(IntEnum):
    """ggml type ids as stored in a GGUF tensor info (ggml.h `enum ggml_type`)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39


@dataclass(frozen=True)
class TypeInfo:
    """How one ggml type packs weights: `block_size` weights in `type_size` bytes."""

    qtype: GGMLType
    block_size: int
    type_size: int
    supported: bool  # dequantized (and so runnable) by GGUF Lens

    @property
    def name(self) -> str:
        return self.qtype.name

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.type_size / self.block_size

    def row_bytes(self, n_cols: int) -> int:
        """Bytes of one row of `n_cols` weights; the caller checks divisibility first."""
        return (n_cols // self.block_size) * self.type_size


_T = GGMLType
# (block size, bytes per block, supported) as in ggml's type_traits / gguf-py GGML_QUANT_SIZES
_TABLE: dict[GGMLType, tuple[int, int, bool]] = {
    _T.F32: (1, 4, True),
    _T.F16: (1, 2, True),
    _T.BF16: (1, 2, True),
    _T.Q4_0: (32, 2 + 16, True),
    _T.Q4_1: (32, 2 + 2 + 16, True),
    _T.Q5_0: (32, 2 + 4 + 16, True),
    _T.Q5_1: (32, 2 + 2 + 4 + 16, True),
    _T.Q8_0: (32, 2 + 32, True),
    _T.Q8_1: (32, 4 + 4 + 32, False),
    _T.Q2_K: (256, 2 + 2 + 16 + 64, True),
    _T.Q3_K: (256, 2 + 64 + 32 + 12, True),
    _T.Q4_K: (256, 2 + 2 + 12 + 128, True),
    _T.Q5_K: (256, 2 + 2 + 12 + 32 + 128, True),
    _T.Q6_K: (256, 2 + 128 + 64 + 16, True),
    _T.Q8_K: (256, 4 + 256 + 32, False),
    _T.IQ2_XXS: (256, 2 + 64, True),
    _T.IQ2_XS: (256, 2 + 64 + 8, True),
    _T.IQ3_XXS: (256, 2 + 96, True),
    _T.IQ1_S: (256, 2 + 32 + 16, True),
    _T.IQ4_NL: (32, 2 + 16, True),
    _T.IQ3_S: (256, 2 + 64 + 32 + 8 + 4, True),
    _T.IQ2_S: (256, 2 + 64 + 16, True),
    _T.IQ4_XS: (256, 2 + 2 + 4 + 128, True),
    _T.I8: (1, 1, False),
    _T.I16: (1, 2, False),
    _T.I32: (1, 4, False),
    _T.I64: (1, 8, False),
    _T.F64: (1, 8, False),
    _T.IQ1_M: (256, 32 + 16 + 8, True),
    _T.TQ1_0: (256, 2 + 4 * 13, False),
    _T.TQ2_0: (256, 2 + 64, False),
    _T.MXFP4: (32, 1 + 16, True),
}

TYPES: dict[GGMLType, TypeInfo] = {
    t: TypeInfo(t, bs, ts, ok) for t, (bs, ts, ok) in _TABLE.items()
}


def type_info(qtype: int) -> TypeInfo | None:
    """The TypeInfo of a raw type id, or None when ggml has no such type."""
    try:
        return TYPES[GGMLType(qtype)]
    except ValueError:
        return None


def type_by_name(name: str) -> GGMLType:
    """GGMLType from a name such as 'Q4_K' (case-insensitive); ValueError when unknown."""
    try:
        return GGMLType[name.strip().upper()]
    except KeyError:
        raise ValueError(f"unknown ggml type {name!r}") from None
