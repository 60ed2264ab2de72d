"""A validated GGUF reader: every header field is checked before it sizes a read; tensor data stays mmapped."""
from __future__ import annotations

import logging
import math
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError
from engine.gguf.constants import (
    pad_to,
)
from engine.gguf.header import Cursor, HeaderParser, MetadataTypes
from engine.quant.types import GGMLType, TypeInfo, type_info

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives in the file and how it is packed."""

    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] = ne[0] = row length (contiguous)
    qtype: GGMLType
    offset: int             # absolute byte offset of the data in the file
    nbytes: int

    @property
    def n_elements(self) -> int:
        """Number of weights."""
        return math.prod(self.shape)

    @property
    def n_rows(self) -> int:
        """Number of rows of shape[0] weights (no division, so a zero dim is safe)."""
        return math.prod(self.shape[1:])

    @property
    def type_info(self) -> TypeInfo:
        """Block size and bytes per block of this tensor's type."""
        info = type_info(self.qtype)
        assert info is not None  # the reader only builds TensorInfo for known types
        return info



def _place_tensors(
    infos: list[tuple[str, tuple[int, ...], GGMLType, int, int]],
    data_offset: int,
    alignment: int,
    file_size: int,
) -> dict[str, TensorInfo]:
    """Check offsets as gguf.cpp does (each equals the running padded size) and that data fits the file."""
    tensors: dict[str, TensorInfo] = {}
    expected = 0
    for name, shape, qtype, offset, nbytes in infos:
        field = f"tensor '{name}'"
        if offset % alignment:
            raise ModelFormatError(field, f"offset is not a multiple of the alignment {alignment}", value=offset)
        if offset < expected:
            raise ModelFormatError(
                field, f"offset overlaps the previous tensor (expected {expected})", value=offset
            )
        if offset > expected:
            raise ModelFormatError(
                field,
                f"offset leaves a gap after the previous tensor (expected {expected}; tensors must be "
                "packed in file order)",
                value=offset,
            )
        start = data_offset + offset
        end = start + nbytes
        if end > file_size:
            raise ModelFormatError(
                field,
                f"data [{start}, {end}) exceeds file size {file_size}; file is truncated "
                f"(expected at least {end} bytes, got {file_size}); re-download it",
            )
        tensors[name] = TensorInfo(name, shape, qtype, start, nbytes)
        expected += pad_to(nbytes, alignment)
    return tensors


class GGUFFile:
    """An open, validated GGUF file: metadata in memory, tensor data memory-mapped on demand."""

    def __init__(
        self,
        path: Path,
        file: BinaryIO,
        st: os.stat_result,
        version: int,
        alignment: int,
        data_offset: int,
        metadata: dict[str, object],
        metadata_types: MetadataTypes,
        tensors: dict[str, TensorInfo],
        warnings: list[str],
    ):
        self.path = path
        self.version = version
        self.alignment = alignment
        self.data_offset = data_offset
        self.file_size = st.st_size
        self.metadata = metadata
        self.metadata_types = metadata_types
        self.tensors = tensors
        self.warnings = warnings
        self._file: BinaryIO | None = file
        self._identity = _identity(st)
        self._map: np.memmap | None = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"

    def check_unchanged(self) -> None:
        """Raise if the file was truncated, replaced or deleted since it was opened (it would SIGBUS)."""
        if self._file is None:
            raise ValueError(f"GGUF file {self.path} is closed")
        try:
            now = os.stat(self.path)
            size_now = os.fstat(self._file.fileno()).st_size
        except OSError:
            raise ModelFormatError("file", "model file changed on disk; reload it", value=str(self.path)) from None
        if _identity(now) != self._identity or size_now != self.file_size:
            raise ModelFormatError("file", "model file changed on disk; reload it", value=str(self.path))

    def raw(self, name: str) -> npt.NDArray[np.uint8]:
        """Read-only uint8 view (memmap) of exactly the tensor's bytes."""
        info = self.tensors[name]
        self.check_unchanged()
        if self._map is None:
            assert self._file is not None
            try:
                self._map = np.memmap(self._file, dtype=np.uint8, mode="r", shape=(self.file_size,))
            except (OSError, ValueError) as exc:  # ENOMEM: no address space for the mapping
                raise ModelFormatError(
                    "file", f"cannot be memory-mapped ({getattr(exc, 'strerror', None) or exc}); "
                    "not enough address space or memory for a file this size", self.file_size) from None
        return self._map[info.offset : info.offset + info.nbytes]

    def rows(self, name: str) -> npt.NDArray[np.uint8]:
        """The tensor's bytes as (n_rows, row_bytes) uint8."""
        info = self.tensors[name]
        return self.raw(name).reshape(info.n_rows, info.type_info.row_bytes(info.shape[0]))

    def close(self) -> None:
        """Drop the mapping and the file handle; views already handed out stay valid."""
        self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _open_file(path: Path) -> tuple[BinaryIO, os.stat_result]:
    """Open a regular file for reading, turning OS errors into ModelFormatError."""
    field = "file"
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise ModelFormatError(field, "is a directory, not a GGUF file", value=str(path))
        if not stat.S_ISREG(st.st_mode):
            raise ModelFormatError(field, "is not a regular file", value=str(path))
        file = open(path, "rb")  # noqa: SIM115 - owned by GGUFFile
        st = os.fstat(file.fileno())
    except FileNotFoundError:
        raise ModelFormatError(field, "no such file", value=str(path)) from None
    except IsADirectoryError:
        raise ModelFormatError(field, "is a directory, not a GGUF file", value=str(path)) from None
    except PermissionError:
        raise ModelFormatError(field, "permission denied", value=str(path)) from None
    except OSError as exc:
        raise ModelFormatError(field, f"cannot read it ({exc.strerror or exc})", value=str(path)) from None
    if not stat.S_ISREG(st.st_mode):
        file.close()
        raise ModelFormatError(field, "is not a regular file", value=str(path))
    return file, st


def open_gguf(path: str | os.PathLike) -> GGUFFile:
    """Open and validate a GGUF file; raises ModelFormatError (only) for anything malformed."""
    t0 = time.perf_counter()
    path = Path(path)
    file, st = _open_file(path)
    try:
        cur = Cursor(file, st.st_size)
        parser = HeaderParser(cur)
        try:
            version, n_tensors, n_kv = parser.header()
            parser.metadata_section(n_kv)
            alignment = parser.alignment()
            infos = parser.tensor_infos(n_tensors)
            data_offset = pad_to(cur.pos, alignment)
            tensors = _place_tensors(infos, data_offset, alignment, cur.size)
        except MemoryError:
            raise ModelFormatError("file", "not enough memory to read the metadata", value=str(path)) from None
        except OSError as exc:
            raise ModelFormatError("file", f"cannot read it ({exc.strerror or exc})", value=str(path)) from None
        del cur
        gf = GGUFFile(
            path, file, st, version, alignment, data_offset,
            parser.metadata, parser.metadata_types, tensors, parser.warnings,
        )
        gf.check_unchanged()
    except BaseException:
        file.close()
        raise
    log.debug(
        "opened %s: GGUF v%d, %d keys, %d tensors in %.1f ms",
        path, version, len(gf.metadata), len(gf.tensors), 1000 * (time.perf_counter() - t0),
    )
    return gf
