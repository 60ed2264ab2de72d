"""The GGUF header parser: bounds-checked reads of the header, the metadata and the tensor infos.

Every count and length is checked against the caps in constants.py and the file size before it sizes a read;
the header is read in growing chunks, never mmapped. reader.py places the tensors and opens the data.
"""
from __future__ import annotations

import logging
import math
import struct
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError
from engine.gguf.constants import (
    ALIGNMENT_KEY,
    ARRAY_DTYPES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_VERSIONS,
    HEADER_BYTES,
    LEGACY_MAGICS,
    MAX_ALIGNMENT,
    MAX_ARRAY_DEPTH,
    MAX_ARRAY_ITEMS,
    MAX_DIMS,
    MAX_ELEMENTS,
    MAX_HEADER_BYTES,
    MAX_KEY_BYTES,
    MAX_NAME_BYTES,
    MAX_STRING_BYTES,
    MIN_KV_BYTES,
    MIN_TENSOR_INFO_BYTES,
    MIN_VALUE_BYTES,
    SCALAR_FORMATS,
    GGUFValueType,
    human_bytes,
)
from engine.quant.types import TYPES, GGMLType, type_info

log = logging.getLogger(__name__)

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_SCALARS = {t: struct.Struct(f) for t, f in SCALAR_FORMATS.items()}
_FIRST_READ = 1 << 20  # the header is read in growing chunks, never mmapped (no SIGBUS while parsing)

MetadataTypes = dict[str, tuple[GGUFValueType, "GGUFValueType | None"]]


def _truncated(field: str, need: int, have: int) -> ModelFormatError:
    return ModelFormatError(
        field, f"file is truncated (expected at least {need} bytes, got {have}); re-download it"
    )


class Cursor:
    """Bounds-checked little-endian reads over a growing in-memory prefix of the file."""

    def __init__(self, file: BinaryIO, file_size: int):
        self.file = file
        self.size = file_size
        self.buf = bytearray()
        self.pos = 0

    @property
    def left(self) -> int:
        """Bytes of the file after the cursor."""
        return self.size - self.pos

    def ensure(self, end: int, field: str) -> None:
        """Make buf cover [0, end) or raise 'truncated'."""
        if end <= len(self.buf):
            return
        if end > self.size:
            raise _truncated(field, end, self.size)
        if end > MAX_HEADER_BYTES:
            raise ModelFormatError(
                field, f"metadata and tensor infos exceed the {human_bytes(MAX_HEADER_BYTES)} limit", value=end
            )
        target = min(self.size, max(end, 2 * len(self.buf), _FIRST_READ))
        self.file.seek(len(self.buf))
        self.buf += self.file.read(target - len(self.buf))
        if len(self.buf) < end:  # the file shrank while we read it
            raise _truncated(field, end, len(self.buf))

    def take(self, n: int, field: str) -> bytes:
        """The next n bytes (n already checked against the bytes left)."""
        self.ensure(self.pos + n, field)
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def unpack(self, fmt: struct.Struct, field: str) -> int | float:
        """One fixed-size value."""
        self.ensure(self.pos + fmt.size, field)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value

    def u32(self, field: str) -> int:
        return int(self.unpack(_U32, field))

    def i32(self, field: str) -> int:
        return int(self.unpack(_I32, field))

    def u64(self, field: str) -> int:
        return int(self.unpack(_U64, field))

    def i64(self, field: str) -> int:
        return int(self.unpack(_I64, field))

    def check_count(self, field: str, n: int, what: str, min_bytes: int) -> None:
        """Reject a declared count that cannot fit in the bytes left (before any loop or allocation)."""
        need = n * min_bytes
        if need > self.left:
            raise ModelFormatError(
                field,
                f"declares {n} {what} but only {self.left} bytes are left (each needs at least "
                f"{min_bytes}); the file is truncated or corrupt (expected at least "
                f"{self.pos + need} bytes, got {self.size}); re-download it",
                value=n,
            )

    def string_bytes(self, field: str, limit: int) -> bytes:
        """A u64-length-prefixed byte string of at most `limit` bytes."""
        n = self.u64(field)
        if n > limit:
            raise ModelFormatError(field, f"string length {n} exceeds the {human_bytes(limit)} limit", value=n)
        if n > self.left:
            raise _truncated(field, self.pos + n, self.size)
        return self.take(n, field)


class HeaderParser:
    """Parses and validates the header, metadata and tensor infos; owns nothing after it returns."""

    def __init__(self, cur: Cursor):
        self.cur = cur
        self.warnings: list[str] = []
        self.metadata: dict[str, object] = {}
        self.metadata_types: MetadataTypes = {}

    # -- header ----------------------------------------------------------------------------------
    def header(self) -> tuple[int, int, int]:
        """Magic, version and the two counts."""
        cur = self.cur
        if cur.size < 4:
            cur.ensure(cur.size, "magic")
            got = bytes(cur.buf)
            if not GGUF_MAGIC.startswith(got):
                raise ModelFormatError("magic", "not a GGUF file", value=got)
            raise _truncated("magic", HEADER_BYTES, cur.size)
        magic = cur.take(4, "magic")
        if magic != GGUF_MAGIC:
            if magic in LEGACY_MAGICS:
                raise ModelFormatError(
                    "magic", "not a GGUF file (legacy GGML/GGJT format; convert it with llama.cpp)", value=magic
                )
            raise ModelFormatError("magic", "not a GGUF file", value=magic)
        version = cur.u32("version")
        if version == 1:
            raise ModelFormatError("version", "GGUF v1 is no longer supported; convert the model again", value=1)
        if version != 0 and version & 0xFFFF == 0:
            raise ModelFormatError(
                "version", "looks byte-swapped; big-endian GGUF files are not supported", value=version
            )
        if version not in GGUF_VERSIONS:
            lo, hi = GGUF_VERSIONS[0], GGUF_VERSIONS[-1]
            raise ModelFormatError(
                "version", f"file is version {version}; GGUF Lens supports versions {lo}-{hi}", value=version
            )
        n_tensors = cur.u64("n_tensors")
        n_kv = cur.u64("n_kv")
        cur.check_count("n_kv", n_kv, "metadata entries", MIN_KV_BYTES)
        cur.check_count("n_tensors", n_tensors, "tensors", MIN_TENSOR_INFO_BYTES)
        return version, n_tensors, n_kv

    # -- metadata --------------------------------------------------------------------------------
    def metadata_section(self, n_kv: int) -> None:
        """All key/value pairs, in file order."""
        cur = self.cur
        first_seen: dict[str, int] = {}
        for i in range(n_kv):
            field = f"metadata key #{i}"
            raw_key = cur.string_bytes(field, MAX_KEY_BYTES)
            if not raw_key:
                raise ModelFormatError(field, "metadata key is empty")
            try:
                key = raw_key.decode("utf-8")
            except UnicodeDecodeError:
                raise ModelFormatError(field, "metadata key is not valid UTF-8", value=raw_key) from None
            if key in first_seen:
                raise ModelFormatError(
                    f"metadata '{key}'", f"duplicate key (entries #{first_seen[key]} and #{i})"
                )
            first_seen[key] = i
            field = f"metadata '{key}'"
            vtype = self.value_type(cur.i32(field), field)
            value, item_type = self.value(vtype, field, depth=0)
            self.metadata[key] = value
            self.metadata_types[key] = (vtype, item_type)

    @staticmethod
    def value_type(raw: int, field: str) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise ModelFormatError(field, f"unknown value type {raw}", value=raw) from None

    def value(self, vtype: GGUFValueType, field: str, depth: int) -> tuple[object, GGUFValueType | None]:
        """One value of a known type; arrays return their item type too."""
        cur = self.cur
        if vtype == GGUFValueType.STRING:
            return self.decode_value(cur.string_bytes(field, MAX_STRING_BYTES), field), None
        if vtype != GGUFValueType.ARRAY:
            raw = cur.unpack(_SCALARS[vtype], field)
            if vtype == GGUFValueType.BOOL:
                return raw != 0, None
            return (float(raw) if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64) else int(raw)), None
        if depth + 1 > MAX_ARRAY_DEPTH:
            raise ModelFormatError(field, f"array nesting too deep (max {MAX_ARRAY_DEPTH})", offset=cur.pos)
        item_type = self.value_type(cur.i32(field), f"{field} item type")
        n = cur.u64(field)
        min_bytes = MIN_VALUE_BYTES[item_type]
        if n * min_bytes > cur.left:
            raise ModelFormatError(
                field,
                f"array declares {n} items, file has room for {cur.left // min_bytes}; the file is "
                f"truncated or corrupt (expected at least {cur.pos + n * min_bytes} bytes, got {cur.size}); "
                "re-download it",
                value=n,
            )
        if n > MAX_ARRAY_ITEMS:
            raise ModelFormatError(field, f"array declares {n} items (max {MAX_ARRAY_ITEMS})", value=n)
        if item_type == GGUFValueType.STRING:
            return self.string_array(n, field), item_type
        if item_type == GGUFValueType.ARRAY:
            return [self.value(GGUFValueType.ARRAY, field, depth + 1)[0] for _ in range(n)], item_type
        return self.numeric_array(n, item_type, field), item_type

    def decode_value(self, raw: bytes, field: str) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.warn(f"{field} is not valid UTF-8; invalid bytes were replaced")
            return raw.decode("utf-8", errors="replace")

    def warn(self, message: str) -> None:
        log.warning("%s", message)
        self.warnings.append(message)

    def numeric_array(self, n: int, item_type: GGUFValueType, field: str) -> npt.NDArray:
        """n fixed-size items as a read-only numpy array (a copy: no view into the header buffer)."""
        cur = self.cur
        dtype = ARRAY_DTYPES[item_type]
        nbytes = n * dtype.itemsize
        cur.ensure(cur.pos + nbytes, field)
        if n == 0:
            arr = np.empty(0, dtype=dtype)
        else:
            arr = np.frombuffer(cur.buf, dtype=dtype, count=n, offset=cur.pos).copy()
        cur.pos += nbytes
        if item_type == GGUFValueType.BOOL:
            arr = arr != 0
        arr.flags.writeable = False
        return arr

    def string_array(self, n: int, field: str) -> list[str]:
        """n u64-length-prefixed strings; a tight loop since vocabularies hold 262k of them."""
        cur = self.cur
        out: list[str] = []
        append = out.append
        unpack = _U64.unpack_from
        buf, blen, pos = cur.buf, len(cur.buf), cur.pos
        n_bad = 0
        for i in range(n):
            if pos + 8 > blen:
                cur.pos = pos
                cur.ensure(pos + 8, f"{field} item {i}")
                buf, blen = cur.buf, len(cur.buf)
            (length,) = unpack(buf, pos)
            pos += 8
            if length > MAX_STRING_BYTES:
                raise ModelFormatError(
                    f"{field} item {i}", f"string length {length} exceeds the "
                    f"{human_bytes(MAX_STRING_BYTES)} limit", value=length,
                )
            end = pos + length
            if end > blen:
                cur.pos = pos
                cur.ensure(end, f"{field} item {i}")
                buf, blen = cur.buf, len(cur.buf)
            chunk = buf[pos:end]
            try:
                append(chunk.decode("utf-8"))
            except UnicodeDecodeError:
                n_bad += 1
                append(chunk.decode("utf-8", errors="replace"))
            pos = end
        cur.pos = pos
        if n_bad:
            self.warn(f"{field}: {n_bad} of {n} strings are not valid UTF-8; invalid bytes were replaced")
        return out

    def alignment(self) -> int:
        """general.alignment, checked as gguf.cpp does (UINT32, power of two), capped at 1 MiB."""
        if ALIGNMENT_KEY not in self.metadata:
            return GGUF_DEFAULT_ALIGNMENT
        vtype, _ = self.metadata_types[ALIGNMENT_KEY]
        value = self.metadata[ALIGNMENT_KEY]
        rule = f"alignment must be a power of two between 1 and 1 MiB ({MAX_ALIGNMENT}), stored as UINT32"
        if vtype != GGUFValueType.UINT32:
            raise ModelFormatError(ALIGNMENT_KEY, f"stored as {vtype.name}; {rule}", value=value)
        assert isinstance(value, int)
        if value < 1 or value > MAX_ALIGNMENT or value & (value - 1):
            raise ModelFormatError(ALIGNMENT_KEY, rule, value=value)
        return value

    # -- tensor infos ----------------------------------------------------------------------------
    def tensor_infos(self, n_tensors: int) -> list[tuple[str, tuple[int, ...], GGMLType, int, int]]:
        """(name, shape, type, relative offset, nbytes) per tensor, each checked on its own."""
        cur = self.cur
        cur.check_count("n_tensors", n_tensors, "tensors", MIN_TENSOR_INFO_BYTES)
        out = []
        seen: set[str] = set()
        for i in range(n_tensors):
            field = f"tensor #{i} name"
            raw_name = cur.string_bytes(field, MAX_KEY_BYTES)
            if not raw_name:
                raise ModelFormatError(field, "tensor name is empty")
            if len(raw_name) > MAX_NAME_BYTES:
                raise ModelFormatError(
                    field, f"name is {len(raw_name)} bytes (max {MAX_NAME_BYTES})", value=raw_name[:80]
                )
            try:
                name = raw_name.decode("utf-8")
            except UnicodeDecodeError:
                raise ModelFormatError(field, "tensor name is not valid UTF-8", value=raw_name) from None
            if name in seen:
                raise ModelFormatError(f"tensor '{name}'", f"duplicate tensor name (tensor #{i})")
            seen.add(name)
            field = f"tensor '{name}'"
            n_dims = cur.u32(field)
            if not 1 <= n_dims <= MAX_DIMS:
                raise ModelFormatError(field, f"has {n_dims} dims (must be 1 to {MAX_DIMS})", value=n_dims)
            shape = tuple(cur.i64(field) for _ in range(n_dims))
            for j, ne in enumerate(shape):
                if ne < 0:
                    raise ModelFormatError(field, f"dim {j} is negative ({ne})", value=shape)
            n_elements = math.prod(shape)
            if n_elements > MAX_ELEMENTS:
                raise ModelFormatError(field, f"element count {n_elements} exceeds 2^63-1", value=shape)
            raw_type = cur.i32(field)
            info = type_info(raw_type)
            if info is None:
                raise ModelFormatError(field, f"uses type {raw_type} (unknown); supported types: {_supported()}", value=raw_type)
            if shape[0] % info.block_size:
                raise ModelFormatError(
                    field,
                    f"row size {shape[0]} is not a multiple of {info.name} block size {info.block_size}",
                )
            offset = cur.u64(field)
            nbytes = math.prod(shape[1:]) * info.row_bytes(shape[0])
            if nbytes > cur.size:
                raise ModelFormatError(
                    field, f"data size {nbytes} bytes exceeds file size {cur.size}", value=shape
                )
            if not info.supported:
                raise ModelFormatError(field, f"type {info.name} is not supported by GGUF Lens (supported: {_supported()})")
            out.append((name, shape, info.qtype, offset, nbytes))
        return out


def _supported() -> str:
    """The tensor types GGUF Lens runs, named in refusals."""
    return ", ".join(info.qtype.name for info in TYPES.values() if info.supported)
