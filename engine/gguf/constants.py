"""GGUF container constants: value types, magic, versions and the limits GGUF Lens enforces."""
from __future__ import annotations

import struct
from enum import IntEnum

import numpy as np


class GGUFValueType(IntEnum):
    """Metadata value type ids as stored in a GGUF key/value pair (gguf.h `enum gguf_type`)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


GGUF_MAGIC = b"GGUF"                 # bytes 0..3 of every GGUF file, whatever the byte order
LEGACY_MAGICS = (b"GGML", b"GGMF", b"GGJT", b"lmgg", b"fmgg", b"tjgg")  # pre-GGUF llama.cpp formats
GGUF_VERSIONS = (2, 3)               # v1 used 32-bit counts and is gone from llama.cpp
GGUF_VERSION = 3                     # what the writer emits by default
GGUF_DEFAULT_ALIGNMENT = 32          # gguf.h GGUF_DEFAULT_ALIGNMENT
ALIGNMENT_KEY = "general.alignment"  # must be a UINT32 power of two when present

# Limits. Each is far above anything a real model uses (a 262k-token vocab, 280k+ merges,
# 50 KB chat templates) and low enough that a tiny hostile file cannot make us allocate much.
MAX_ALIGNMENT = 1 << 20              # 1 MiB
MAX_KEY_BYTES = 64 * 1024            # a metadata key (real keys are < 100 bytes)
MAX_STRING_BYTES = 64 * 1024 * 1024  # one string value or string array item
MAX_ARRAY_ITEMS = 1 << 24            # 16.7M items per metadata array; also bounded by bytes left
MAX_HEADER_BYTES = 256 * 1024 * 1024  # metadata + tensor infos (a 262k vocab with scores is ~7 MB)
MAX_ARRAY_DEPTH = 2                  # an array may hold arrays, those may not (llama.cpp allows none)
MAX_DIMS = 4                         # GGML_MAX_DIMS
MAX_NAME_BYTES = 63                  # GGML_MAX_NAME = 64 including the NUL
MAX_ELEMENTS = (1 << 63) - 1         # INT64_MAX, as gguf.cpp checks

# Fixed-size scalars: (struct format, byte size)
SCALAR_FORMATS: dict[GGUFValueType, str] = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<B",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
SCALAR_SIZES: dict[GGUFValueType, int] = {t: struct.calcsize(f) for t, f in SCALAR_FORMATS.items()}

# numpy dtype of a numeric array item; BOOL arrays are read as uint8 and compared with 0
ARRAY_DTYPES: dict[GGUFValueType, np.dtype] = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("<u1"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}

# The fewest bytes one value of a type can take: what a declared count is checked against.
MIN_VALUE_BYTES: dict[GGUFValueType, int] = {
    **SCALAR_SIZES,
    GGUFValueType.STRING: 8,   # u64 length, empty string
    GGUFValueType.ARRAY: 12,   # i32 item type + u64 count, empty array
}
MIN_KV_BYTES = 8 + 1 + 4 + 1               # key length, 1-byte key, value type, 1-byte value
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8  # name length, 1-byte name, n_dims, ne[0], type, offset
HEADER_BYTES = 4 + 4 + 8 + 8               # magic, version, n_tensors, n_kv


def pad_to(n: int, alignment: int) -> int:
    """`n` rounded up to a multiple of `alignment` (GGML_PAD), in Python ints."""
    return -(-n // alignment) * alignment


def human_bytes(n: int) -> str:
    """A byte count as '64 MiB' / '1.5 KiB' / '12 bytes' for error messages."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"
