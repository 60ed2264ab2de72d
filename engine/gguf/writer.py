"""Write GGUF files (v2/v3, little-endian) atomically, keeping metadata types exact when they are given."""
from __future__ import annotations

import logging
import math
import os
import struct
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from engine.gguf.constants import (
    ALIGNMENT_KEY,
    ARRAY_DTYPES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGUF_VERSION,
    GGUF_VERSIONS,
    MAX_ALIGNMENT,
    MAX_DIMS,
    MAX_NAME_BYTES,
    SCALAR_FORMATS,
    GGUFValueType,
    pad_to,
)
from engine.fileio import fsync_dir
from engine.quant.types import GGMLType, type_info

log = logging.getLogger(__name__)

VT = GGUFValueType
TensorSpec = tuple[str, GGMLType, tuple[int, ...], "bytes | np.ndarray"]
MetadataTypes = Mapping[str, tuple[GGUFValueType, "GGUFValueType | None"]]

_INT_RANGES: dict[GGUFValueType, tuple[int, int]] = {
    VT.UINT8: (0, (1 << 8) - 1),
    VT.INT8: (-(1 << 7), (1 << 7) - 1),
    VT.UINT16: (0, (1 << 16) - 1),
    VT.INT16: (-(1 << 15), (1 << 15) - 1),
    VT.UINT32: (0, (1 << 32) - 1),
    VT.INT32: (-(1 << 31), (1 << 31) - 1),
    VT.UINT64: (0, (1 << 64) - 1),
    VT.INT64: (-(1 << 63), (1 << 63) - 1),
}
_DTYPE_TO_VT: dict[tuple[str, int], GGUFValueType] = {
    (dt.kind, dt.itemsize): vt for vt, dt in ARRAY_DTYPES.items() if vt != VT.BOOL
} | {("b", 1): VT.BOOL}


def infer_type(value: object) -> tuple[GGUFValueType, GGUFValueType | None]:
    """(type, array item type) for a Python/numpy value, following gguf-py's GGUFValueType.get_type."""
    if isinstance(value, (str, bytes)):
        return VT.STRING, None
    if isinstance(value, (bool, np.bool_)):
        return VT.BOOL, None
    if isinstance(value, np.generic):
        return _dtype_type(value.dtype), None
    if isinstance(value, int):
        return _int_type(value), None  # gguf-py writes INT32; wider ints get INT64 / UINT64
    if isinstance(value, float):
        return VT.FLOAT32, None  # gguf-py's convention: Python floats are FLOAT32
    if isinstance(value, np.ndarray):
        return VT.ARRAY, _dtype_type(value.dtype)
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("cannot infer the item type of an empty array; pass metadata_types")
        kinds = {infer_type(v)[0] for v in value}
        widths = [VT.INT32, VT.INT64, VT.UINT64]
        if len(kinds) > 1 and kinds <= set(widths):
            if VT.UINT64 in kinds and any(v < 0 for v in value):  # type: ignore[operator]
                raise ValueError("integer array mixes negative values and values above 2^63")
            return VT.ARRAY, max(kinds, key=widths.index)
        if len(kinds) != 1:
            raise ValueError("all items of a GGUF array must have the same type")
        return VT.ARRAY, kinds.pop()
    raise ValueError(f"cannot store a {type(value).__name__} in GGUF metadata")


def _int_type(v: int) -> GGUFValueType:
    for vt in (VT.INT32, VT.INT64, VT.UINT64):
        lo, hi = _INT_RANGES[vt]
        if lo <= v <= hi:
            return vt
    raise ValueError(f"integer {v} does not fit in 64 bits")


def _dtype_type(dtype: np.dtype) -> GGUFValueType:
    dt = np.dtype(dtype)
    vt = _DTYPE_TO_VT.get((dt.kind, dt.itemsize))
    if vt is None:
        raise ValueError(f"numpy dtype {dt} has no GGUF value type")
    return vt


def _encode_string(value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return struct.pack("<Q", len(raw)) + raw


def _encode_scalar(vtype: GGUFValueType, value: object, key: str) -> bytes:
    if vtype == VT.BOOL:
        return struct.pack("<B", 1 if value else 0)
    if vtype in (VT.FLOAT32, VT.FLOAT64):
        return struct.pack(SCALAR_FORMATS[vtype], float(value))  # type: ignore[arg-type]
    v = int(value)  # type: ignore[call-overload]
    lo, hi = _INT_RANGES[vtype]
    if not lo <= v <= hi:
        raise ValueError(f"metadata {key!r}: {v} does not fit in {vtype.name}")
    return struct.pack(SCALAR_FORMATS[vtype], v)


def encode_value(
    value: object, vtype: GGUFValueType, item_type: GGUFValueType | None = None, key: str = "?"
) -> bytes:
    """The bytes of one metadata value (without its type id), as gguf-py's _pack_val writes them."""
    if vtype == VT.STRING:
        return _encode_string(value)  # type: ignore[arg-type]
    if vtype != VT.ARRAY:
        return _encode_scalar(vtype, value, key)
    if item_type is None:
        item_type = infer_type(value)[1]
        assert item_type is not None
    items = value if isinstance(value, np.ndarray) else list(value)  # type: ignore[call-overload]
    parts = [struct.pack("<iQ", int(item_type), len(items))]
    if item_type == VT.STRING:
        parts.extend(_encode_string(s) for s in items)
    elif item_type == VT.ARRAY:
        for inner in items:
            parts.append(encode_value(inner, VT.ARRAY, None, key))
    else:
        arr = np.asarray(items)
        if item_type == VT.BOOL:
            arr = arr.astype(bool)
        elif arr.size and arr.dtype.kind in "iu":
            lo, hi = _INT_RANGES[item_type] if item_type in _INT_RANGES else (-math.inf, math.inf)
            if int(arr.min()) < lo or int(arr.max()) > hi:
                raise ValueError(f"metadata {key!r}: array values do not fit in {item_type.name}")
        parts.append(np.ascontiguousarray(arr, dtype=ARRAY_DTYPES[item_type]).tobytes())
    return b"".join(parts)


def _tensor_bytes(name: str, qtype: GGMLType, shape: tuple[int, ...], data: bytes | np.ndarray) -> memoryview:
    """The tensor's raw bytes, checked against what its type and shape need."""
    info = type_info(qtype)
    if info is None:
        raise ValueError(f"tensor {name!r}: unknown type {qtype}")
    if not 1 <= len(shape) <= MAX_DIMS or any(int(d) < 0 for d in shape):
        raise ValueError(f"tensor {name!r}: bad shape {shape}")
    if shape[0] % info.block_size:
        raise ValueError(
            f"tensor {name!r}: row size {shape[0]} is not a multiple of {info.name} block size {info.block_size}"
        )
    expected = math.prod(shape[1:]) * info.row_bytes(shape[0])
    if isinstance(data, np.ndarray):  # as bytes (a zero-size tensor too, which memoryview.cast refuses)
        view = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    else:
        view = memoryview(data).cast("B")
    if view.nbytes != expected:
        raise ValueError(f"tensor {name!r}: {info.name} {shape} needs {expected} bytes, got {view.nbytes}")
    return view


def _write_pad(out: BinaryIO, alignment: int) -> None:
    pos = out.tell()
    out.write(b"\x00" * (pad_to(pos, alignment) - pos))


def write_gguf(
    path: str | os.PathLike,
    metadata: Mapping[str, object],
    tensors: Iterable[TensorSpec],
    *,
    metadata_types: MetadataTypes | None = None,
    alignment: int = GGUF_DEFAULT_ALIGNMENT,
    version: int = GGUF_VERSION,
) -> None:
    """Write a GGUF file atomically (temp file in the same folder, fsync, rename)."""
    if version not in GGUF_VERSIONS:
        raise ValueError(f"can only write GGUF versions {GGUF_VERSIONS}, not {version}")
    if not (1 <= alignment <= MAX_ALIGNMENT and alignment & (alignment - 1) == 0):
        raise ValueError(f"alignment must be a power of two between 1 and {MAX_ALIGNMENT}, got {alignment}")
    metadata = dict(metadata)
    types = dict(metadata_types or {})
    if ALIGNMENT_KEY in metadata:
        if int(metadata[ALIGNMENT_KEY]) != alignment:  # type: ignore[call-overload]
            raise ValueError(f"metadata {ALIGNMENT_KEY}={metadata[ALIGNMENT_KEY]} disagrees with alignment={alignment}")
        types[ALIGNMENT_KEY] = (VT.UINT32, None)
    elif alignment != GGUF_DEFAULT_ALIGNMENT:
        metadata[ALIGNMENT_KEY] = alignment
        types[ALIGNMENT_KEY] = (VT.UINT32, None)

    kv_parts = []
    for key, value in metadata.items():
        if not key:
            raise ValueError("metadata keys must not be empty")
        vtype, item_type = types.get(key) or infer_type(value)
        vtype = VT(vtype)
        item_type = None if item_type is None else VT(item_type)
        kv_parts.append(
            _encode_string(key) + struct.pack("<i", int(vtype)) + encode_value(value, vtype, item_type, key)
        )

    specs = []
    infos = []
    offset = 0
    seen: set[str] = set()
    for name, qtype, shape, data in tensors:
        shape = tuple(int(d) for d in shape)
        raw_name = name.encode("utf-8")
        if not raw_name or len(raw_name) > MAX_NAME_BYTES or name in seen:
            raise ValueError(f"bad or duplicate tensor name {name!r} (1 to {MAX_NAME_BYTES} bytes, unique)")
        seen.add(name)
        view = _tensor_bytes(name, GGMLType(qtype), shape, data)
        infos.append(
            _encode_string(raw_name)
            + struct.pack(f"<I{len(shape)}qiQ", len(shape), *shape, int(qtype), offset)
        )
        specs.append(view)
        offset += pad_to(view.nbytes, alignment)

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(GGUF_MAGIC + struct.pack("<IQQ", version, len(infos), len(kv_parts)))
            for part in kv_parts:
                out.write(part)
            for part in infos:
                out.write(part)
            _write_pad(out, alignment)
            for view in specs:
                out.write(view)
                _write_pad(out, alignment)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)
    log.debug("wrote %s: %d keys, %d tensors", path, len(kv_parts), len(infos))
