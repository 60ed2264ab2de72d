"""Importance matrices: per input column, the sum of squared activations a matrix saw (llama-imatrix's data).

An entry holds, for one weight tensor, `sums` (n_mat, n_cols) float32 (the sum over tokens of x_j^2 of the
product's input x; n_mat is 1 for a dense matrix) and `counts` (n_mat,) (the tokens summed). What a
quantizer uses is the mean, `sums / counts` per column (load_imatrix in llama.cpp's tools/quantize).

Two file formats, as llama.cpp has them:
  GGUF (tools/imatrix/imatrix.cpp save_imatrix, the current default): general.type = "imatrix",
    imatrix.datasets (string array), imatrix.chunk_count and imatrix.chunk_size (uint32); for each tensor
    in name order `<name>.in_sum2` F32 [n_cols, n_mat] and `<name>.counts` F32 [1, n_mat].
  legacy .dat (save_imatrix_legacy): int32 n_entries; per entry int32 name length, the name, int32 ncall,
    int32 nval, float32[nval] = sums / count * ncall; then int32 chunk count, int32 length and the dataset name.
Reading follows common/imatrix-loader.cpp; a legacy entry comes back with counts = ncall, so that
`sums / counts` is again the mean. Malformed files raise ModelFormatError naming the field.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError, SettingError
from engine.gguf import GGUFValueType, open_gguf, write_gguf
from engine.quant.types import GGMLType

F32 = npt.NDArray[np.float32]

KEY_DATASETS = "imatrix.datasets"
KEY_CHUNK_COUNT = "imatrix.chunk_count"
KEY_CHUNK_SIZE = "imatrix.chunk_size"
SUMS_SUFFIX = ".in_sum2"
COUNTS_SUFFIX = ".counts"
_MAX_LEGACY_ENTRIES = 1 << 16
_MAX_NAME = 1 << 12
_MAX_VALUES = 1 << 28


@dataclass
class ImportanceMatrix:
    """Squared-activation sums and token counts per weight tensor, with where they came from."""

    sums: dict[str, F32] = field(default_factory=dict)  # name -> (n_mat, n_cols) float32
    counts: dict[str, npt.NDArray[np.int64]] = field(default_factory=dict)  # name -> (n_mat,) tokens summed
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    legacy: bool = False  # read from a .dat file: sums are means times ncall, counts are ncall

    def __contains__(self, name: str) -> bool:
        return name in self.sums

    def __len__(self) -> int:
        return len(self.sums)

    def names(self) -> list[str]:
        return sorted(self.sums)

    def values(self, name: str) -> F32 | None:
        """The per-column importance a quantizer reads for `name` (flat n_mat * n_cols), or None.

        As load_imatrix in tools/quantize: sums / count per matrix, and 1 for a matrix with no tokens.
        """
        sums = self.sums.get(name)
        if sums is None:
            return None
        counts = self.counts[name].astype(np.float32)
        out = np.ones_like(sums)
        seen = counts > 0
        out[seen] = sums[seen] / counts[seen, None]
        return out.reshape(-1)

    def column_importance(self, name: str) -> F32 | None:
        """Mean squared activation per input column (matrices averaged), for display; None if absent."""
        v = self.values(name)
        if v is None:
            return None
        return v.reshape(self.sums[name].shape).mean(axis=0, dtype=np.float32)

    def quant_weights(self) -> dict[str, F32]:
        """{tensor name: values(name)}: what `quantize(..., quant_weights=...)` takes per tensor."""
        return {n: v for n in self.names() if (v := self.values(n)) is not None}

    def add(self, name: str, sums: F32, count: int) -> None:
        """Add squared-activation sums (n_cols,) or (n_mat, n_cols) of `count` more tokens to an entry."""
        sums = np.asarray(sums, np.float32)
        sums = sums.reshape(1, -1) if sums.ndim == 1 else sums
        old = self.sums.get(name)
        if old is None:
            self.sums[name] = sums.copy()
            self.counts[name] = np.full(len(sums), count, np.int64)
            return
        if old.shape != sums.shape:
            raise SettingError(f"imatrix entry {name}: shape {sums.shape} differs from {old.shape}")
        old += sums
        self.counts[name] += count


def read_imatrix(path: str | os.PathLike[str]) -> ImportanceMatrix:
    """Read an importance matrix in llama.cpp's GGUF format or the legacy .dat; ModelFormatError if neither."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise SettingError(f"cannot read imatrix {p}: {e.strerror or e}") from None
    if magic == b"GGUF":
        return _read_gguf(p)
    return _read_legacy(p)


def _read_gguf(path: Path) -> ImportanceMatrix:
    im = ImportanceMatrix()
    with open_gguf(path) as g:
        md = g.metadata
        datasets = md.get(KEY_DATASETS, [])
        im.datasets = [str(d) for d in datasets] if isinstance(datasets, (list, tuple)) else []
        im.chunk_count = int(md.get(KEY_CHUNK_COUNT, 0) or 0)
        im.chunk_size = int(md.get(KEY_CHUNK_SIZE, 0) or 0)
        pairs: dict[str, dict[str, object]] = {}
        for name, info in g.tensors.items():
            for suffix, key in ((SUMS_SUFFIX, "sums"), (COUNTS_SUFFIX, "counts")):
                if name.endswith(suffix):
                    if GGMLType(info.qtype) != GGMLType.F32:
                        raise ModelFormatError(name, "imatrix sums and counts must be F32", GGMLType(info.qtype).name)
                    data = np.frombuffer(g.raw(name).tobytes(), dtype="<f4").astype(np.float32)
                    pairs.setdefault(name[: -len(suffix)], {})[key] = (data, tuple(info.shape))
        if not pairs:
            raise ModelFormatError(str(path), "holds no imatrix entries (no *.in_sum2 tensors)")
        for name in sorted(pairs):
            got = pairs[name]
            if "sums" not in got or "counts" not in got:
                raise ModelFormatError(name, "imatrix has sums without counts or counts without sums")
            sums, _ = got["sums"]  # type: ignore[misc]
            counts, _ = got["counts"]  # type: ignore[misc]
            n_mat = len(counts)
            if n_mat < 1 or sums.size % n_mat:
                raise ModelFormatError(name + SUMS_SUFFIX, f"{sums.size} values do not split into {n_mat} matrices")
            im.sums[name] = sums.reshape(n_mat, -1)
            im.counts[name] = np.rint(counts).astype(np.int64)  # std::lround
    return im


def _read_legacy(path: Path) -> ImportanceMatrix:
    data = path.read_bytes()
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(data):
            raise ModelFormatError(what, f"imatrix file {path.name} is truncated or not an imatrix", offset=pos)
        out = data[pos : pos + n]
        pos += n
        return out

    def i32(what: str) -> int:
        return struct.unpack("<i", take(4, what))[0]

    im = ImportanceMatrix(legacy=True)
    n_entries = i32("n_entries")
    if not 1 <= n_entries <= _MAX_LEGACY_ENTRIES:
        raise ModelFormatError("n_entries", f"{path.name} is neither a GGUF nor a legacy imatrix file", n_entries)
    for i in range(n_entries):
        length = i32(f"entry {i} name length")
        if not 0 < length <= _MAX_NAME:
            raise ModelFormatError(f"entry {i} name length", "out of range", length)
        name = take(length, f"entry {i} name").decode("utf-8", "replace")
        ncall = i32(f"{name} ncall")
        nval = i32(f"{name} nval")
        if not 0 < nval <= _MAX_VALUES:
            raise ModelFormatError(f"{name} nval", "out of range", nval)
        im.sums[name] = np.frombuffer(take(4 * nval, f"{name} values"), "<f4").astype(np.float32).reshape(1, -1)
        im.counts[name] = np.array([ncall], np.int64)
    if pos + 4 <= len(data):  # the chunk count and dataset name are optional
        im.chunk_count = i32("chunk count")
        if pos + 4 <= len(data):
            length = i32("dataset name length")
            if 0 < length <= _MAX_NAME and pos + length <= len(data):
                im.datasets.append(take(length, "dataset").decode("utf-8", "replace"))
    return im


def write_imatrix(path: str | os.PathLike[str], im: ImportanceMatrix) -> None:
    """Write llama.cpp's GGUF imatrix file (what llama-imatrix writes by default)."""
    if not im.sums:
        raise SettingError("the importance matrix is empty: nothing to write")
    md: dict[str, object] = {
        "general.type": "imatrix",
        KEY_DATASETS: list(im.datasets),
        KEY_CHUNK_COUNT: int(im.chunk_count),
        KEY_CHUNK_SIZE: int(im.chunk_size),
    }
    u32 = (GGUFValueType.UINT32, None)
    types = {"general.type": (GGUFValueType.STRING, None), KEY_DATASETS: (GGUFValueType.ARRAY, GGUFValueType.STRING),
             KEY_CHUNK_COUNT: u32, KEY_CHUNK_SIZE: u32}
    tensors = []
    for name in im.names():
        sums = np.ascontiguousarray(im.sums[name], np.float32)
        counts = im.counts[name].astype(np.float32).reshape(-1)
        n_mat, n_cols = sums.shape
        tensors.append((name + SUMS_SUFFIX, GGMLType.F32, (n_cols, n_mat), sums.view(np.uint8).reshape(-1)))
        tensors.append((name + COUNTS_SUFFIX, GGMLType.F32, (1, n_mat), counts.view(np.uint8).reshape(-1)))
    write_gguf(path, md, tensors, metadata_types=types)


def write_imatrix_legacy(path: str | os.PathLike[str], im: ImportanceMatrix) -> None:
    """Write the legacy .dat format (llama-imatrix --output-format dat)."""
    if not im.sums:
        raise SettingError("the importance matrix is empty: nothing to write")
    chunk = max(1, im.chunk_size)
    out = [struct.pack("<i", len(im.sums))]
    for name in im.names():
        counts = im.counts[name]
        raw = name.encode()
        sums = im.sums[name]
        if im.legacy:  # already mean * ncall, with counts = ncall
            ncall, vals = int(counts.max()), sums
        else:
            ncall = (int(counts.max()) + chunk - 1) // chunk  # ceiling division, as save_imatrix_legacy
            c = counts.astype(np.float32)[:, None]
            vals = np.where(c == 0, np.float32(1.0), sums / np.where(c == 0, np.float32(1.0), c)) * np.float32(ncall)
        out += [struct.pack("<i", len(raw)), raw, struct.pack("<ii", ncall, sums.size),
                vals.astype("<f4").tobytes()]
    dataset = (im.datasets[-1] if im.datasets else "").encode()
    out += [struct.pack("<ii", im.chunk_count, len(dataset)), dataset]
    Path(path).write_bytes(b"".join(out))


def relative_difference(a: ImportanceMatrix, b: ImportanceMatrix) -> dict[str, float]:
    """Per tensor, the largest |a - b| / max(|b|, tiny) over columns of the mean values (tests, reports)."""
    out: dict[str, float] = {}
    for name in sorted(set(a.sums) | set(b.sums)):
        va, vb = a.values(name), b.values(name)
        if va is None or vb is None or va.shape != vb.shape:
            out[name] = math.inf
            continue
        denom = np.maximum(np.abs(vb.astype(np.float64)), 1e-30)
        out[name] = float(np.max(np.abs(va.astype(np.float64) - vb) / denom))
    return out


# the keys llama-quantize adds to a file it wrote with --imatrix (tools/quantize/quantize.cpp), in its order
KEY_QUANTIZE_FILE = "quantize.imatrix.file"
KEY_QUANTIZE_DATASET = "quantize.imatrix.dataset"
KEY_QUANTIZE_ENTRIES = "quantize.imatrix.entries_count"
KEY_QUANTIZE_CHUNKS = "quantize.imatrix.chunks_count"
_KV_STRING_MAX = 127  # llama_model_kv_override.val_str holds 128 bytes


def quantize_metadata(im: ImportanceMatrix, file_label: str) -> list[tuple[str, object, GGUFValueType]]:
    """(key, value, type) of the quantize.imatrix.* keys llama-quantize writes, `file_label` as given on its command line."""
    out: list[tuple[str, object, GGUFValueType]] = [
        (KEY_QUANTIZE_FILE, _clip(file_label), GGUFValueType.STRING)]
    if im.datasets:
        out.append((KEY_QUANTIZE_DATASET, _clip(im.datasets[0]), GGUFValueType.STRING))
    out.append((KEY_QUANTIZE_ENTRIES, len(im), GGUFValueType.UINT32))
    if im.chunk_count > 0:
        out.append((KEY_QUANTIZE_CHUNKS, int(im.chunk_count), GGUFValueType.UINT32))
    return out


def _clip(text: str) -> str:
    """strncpy into 128 bytes with the last forced to NUL: at most 127 bytes (a cut UTF-8 tail dropped)."""
    raw = text.encode()[:_KV_STRING_MAX]
    return raw.decode("utf-8", "ignore")


def quant_weights_for(im: ImportanceMatrix, tensors: dict[str, tuple[int, ...]]) -> dict[str, F32]:
    """The importance each tensor to be quantized gets ({name: ggml shape}), checked as llama-quantize checks it.

    A tensor missing from the matrix is quantized without one; a size that differs from the rows (ne[0] * ne[2])
    is an error except for token_embd; non-finite values are an error.
    """
    out: dict[str, F32] = {}
    for name, shape in tensors.items():
        v = im.values(name)
        if v is None:
            continue
        want = int(shape[0]) * (int(shape[2]) if len(shape) > 2 else 1)
        if v.size != want:
            if name == "token_embd.weight":
                continue
            raise SettingError(f"imatrix size {v.size} is different from tensor size {want} for {name}")
        if not np.isfinite(v).all():
            raise SettingError(f"imatrix contains non-finite values for {name}")
        out[name] = v
    return out
