"""Craft GGUF bytes with arbitrary, also invalid, header fields (raw counts, lengths, type ids, offsets, dims).

Independent of engine/gguf/writer.py on purpose, so a writer bug cannot hide a reader bug. Modelled on
llama.cpp's tests/test-gguf.cpp handcrafted files: every field can be overridden with a raw value.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.quant.types import type_info

U64_MAX = (1 << 64) - 1
INT64_MAX = (1 << 63) - 1
INT32_MAX = (1 << 31) - 1

# GGUF value type ids (gguf.h), spelled out so the factory does not depend on the code under test
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_FMT = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f",
        BOOL: "B", UINT64: "Q", INT64: "q", FLOAT64: "d"}
_MAX_DEFAULT_DATA = 1 << 22  # don't materialise zeros for hostile multi-exabyte shapes


class Enc:
    """Packs integers of a given width and byte order; values are masked so -1 becomes all ones."""

    def __init__(self, order: str = "<"):
        self.order = order

    def u32(self, v: int) -> bytes:
        return struct.pack(self.order + "I", v & 0xFFFFFFFF)

    def u64(self, v: int) -> bytes:
        return struct.pack(self.order + "Q", v & U64_MAX)

    def string(self, s: str | bytes, length: int | None = None) -> bytes:
        """u64 length (raw override allowed) then the bytes."""
        raw = s.encode("utf-8") if isinstance(s, str) else s
        return self.u64(len(raw) if length is None else length) + raw

    def value(self, vtype: int, value: object, item_type: int | None = None) -> bytes:
        """A well-formed value of a GGUF type (nested arrays allowed)."""
        if vtype == STRING:
            return self.string(value)  # type: ignore[arg-type]
        if vtype == ARRAY:
            assert item_type is not None
            items = list(value)  # type: ignore[call-overload]
            out = self.u32(item_type) + self.u64(len(items))
            for item in items:
                if item_type == ARRAY:
                    inner_type, inner = item
                    out += self.value(ARRAY, inner, inner_type)
                else:
                    out += self.value(item_type, item)
            return out
        return struct.pack(self.order + _FMT[vtype], value)


@dataclass
class KV:
    """One metadata pair: raw key bytes, raw type id, already-encoded payload."""

    key: str | bytes
    vtype: int
    payload: bytes
    key_length: int | None = None  # raw override of the key's length field


def kv(key: str | bytes, vtype: int, value: object, item_type: int | None = None, order: str = "<") -> KV:
    """A well-formed metadata pair."""
    return KV(key, vtype, Enc(order).value(vtype, value, item_type))


@dataclass
class Tensor:
    """One tensor info; any field may be invalid."""

    name: str | bytes
    dims: Sequence[int]
    qtype: int = 0                 # F32
    offset: int | None = None      # None: the running padded offset, as a valid file has
    n_dims: int | None = None      # None: len(dims)
    data: bytes | None = None      # None: zeros of the size implied by dims and qtype (when small)
    name_length: int | None = None


def nbytes_of(dims: Sequence[int], qtype: int) -> int | None:
    """Bytes implied by dims and type, or None when they make no sense."""
    info = type_info(qtype)
    if info is None or not dims or any(d < 0 for d in dims) or dims[0] % info.block_size:
        return None
    return math.prod(dims[1:]) * (dims[0] // info.block_size) * info.type_size


def pad(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@dataclass
class Layout:
    """Where the regions of a built file start (for truncation tests)."""

    tensor_infos_start: int = 0
    data_start: int = 0
    size: int = 0
    tensor_ends: list[int] = field(default_factory=list)


def build_gguf(
    kvs: Sequence[KV] = (),
    tensors: Sequence[Tensor] = (),
    *,
    magic: bytes = b"GGUF",
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
    order: str = "<",
    layout: Layout | None = None,
) -> bytes:
    """The bytes of a GGUF file built from raw parts; counts default to the real ones."""
    enc = Enc(order)
    out = bytearray(magic + enc.u32(version) + enc.u64(len(tensors) if n_tensors is None else n_tensors)
                    + enc.u64(len(kvs) if n_kv is None else n_kv))
    for pair in kvs:
        out += enc.string(pair.key, pair.key_length) + enc.u32(pair.vtype) + pair.payload
    infos_start = len(out)
    blobs: list[bytes] = []
    offset = 0
    for t in tensors:
        data = t.data
        if data is None:
            size = nbytes_of(t.dims, t.qtype)
            data = bytes(size) if size is not None and size <= _MAX_DEFAULT_DATA else b""
        n_dims = len(t.dims) if t.n_dims is None else t.n_dims
        out += enc.string(t.name, t.name_length) + enc.u32(n_dims)
        out += b"".join(enc.u64(d) for d in t.dims)
        out += enc.u32(t.qtype) + enc.u64(offset if t.offset is None else t.offset)
        blobs.append(data)
        offset += pad(len(data), alignment)
    out += bytes(pad(len(out), alignment) - len(out))
    data_start = len(out)
    ends = []
    for i, data in enumerate(blobs):
        out += data
        ends.append(len(out))
        if i < len(blobs) - 1:  # no padding after the last tensor, so its end is the file's end
            out += bytes(pad(len(out), alignment) - len(out))
    if layout is not None:
        layout.tensor_infos_start, layout.data_start, layout.size, layout.tensor_ends = (
            infos_start, data_start, len(out), ends)
    return bytes(out)


def default_kvs() -> list[KV]:
    """A few metadata pairs of every shape a real model has."""
    return [
        kv("general.architecture", STRING, "llama"),
        kv("general.name", STRING, "tiny"),
        kv("llama.block_count", UINT32, 1),
        kv("llama.rope.freq_base", FLOAT32, 10000.0),
        kv("tokenizer.ggml.tokens", ARRAY, ["<s>", "</s>", "a", "b"], STRING),
        kv("tokenizer.ggml.scores", ARRAY, [0.0, 0.0, -1.0, -2.0], FLOAT32),
        kv("tokenizer.ggml.add_bos_token", BOOL, True),
    ]


def default_tensors() -> list[Tensor]:
    """Three small tensors; the last one's size is a multiple of 32 so it ends exactly at EOF."""
    return [
        Tensor("output_norm.weight", [8], 0),             # F32, 32 bytes
        Tensor("blk.0.attn_q.weight", [32, 2], 8),        # Q8_0, 68 bytes
        Tensor("token_embd.weight", [256, 2], 12),        # Q4_K, 288 bytes
    ]


def make_gguf(*, kvs: Sequence[KV] | None = None, extra_kvs: Sequence[KV] = (),
              tensors: Sequence[Tensor] | None = None, **overrides: object) -> bytes:
    """A small valid GGUF, with any part replaced: make_gguf(n_kv=2**64-1), make_gguf(tensors=[...])."""
    return build_gguf(
        [*(default_kvs() if kvs is None else kvs), *extra_kvs],
        default_tensors() if tensors is None else tensors,
        **overrides,  # type: ignore[arg-type]
    )
