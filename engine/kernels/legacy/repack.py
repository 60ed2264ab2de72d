"""Weight layouts the legacy-quant kernels read, and the activation unpacking they share.

The kernels vectorise across rows: one SIMD lane per weight row, ROW_GROUP rows at a time. In a
GGUF file the rows lie one after the other, so a group's byte j of block b sits at stride
row_bytes; `repack` lays the same bytes out as *byte planes* once, at load:

  planes[g, b, j, r] = byte j of block b of row g * ROW_GROUP + r        (ng, nb, type_size, ROW_GROUP)

Plane j of a block is ROW_GROUP contiguous bytes, the d / m fp16 fields included (as two planes),
so one vector load feeds ROW_GROUP rows. Nothing is widened or reordered inside a block: the
repacked weight takes the file's bytes plus at most ROW_GROUP - 1 zero rows, and the numbers are
the same as on the raw blocks. Kernels given raw blocks copy one group into this layout in a
scratch buffer first (`gather_group`), which is slower but needs no preparation.

The activation side is unpacked once per call from its ggml bytes (block_q8_0 / block_q8_1) into
float32: the scale d, the sum s (Q8_1) and the 32 quants, which are small integers and so exact
in float32, as are all the integer sums the kernels form from them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.quant.types import TYPES, GGMLType

from engine.kernels import pages
from engine.kernels.activations import f16_to_f32, njit

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
QK = 32
ROW_GROUP = 64  # rows per SIMD group: 4 zmm (or 8 ymm) vectors of float32 per plane

LEGACY_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0)


@dataclass(frozen=True)
class Repacked:
    """A legacy-quant weight as byte planes (see the module docstring); `n_rows` real rows of `n_cols`."""

    qtype: GGMLType
    planes: U8  # (ng, nb, type_size, ROW_GROUP)
    n_rows: int
    n_cols: int

    @property
    def shape(self) -> tuple[int, int]:
        """(n_rows, row_bytes) of the raw blocks it came from."""
        return (self.n_rows, TYPES[self.qtype].row_bytes(self.n_cols))

    @property
    def nbytes(self) -> int:
        return self.planes.nbytes

    def rows(self, ids: npt.ArrayLike) -> U8:
        """The raw (len(ids), row_bytes) blocks of rows `ids` (a gather from the planes)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_rows):
            raise IndexError(f"row id out of range for {self.n_rows} rows")
        return self.planes[ids // ROW_GROUP, :, :, ids % ROW_GROUP].reshape(len(ids), -1)


def repack(qtype: GGMLType, blocks: U8) -> Repacked:
    """Raw (n_rows, row_bytes) blocks of a legacy type to byte planes, one copy of the file's bytes."""
    info = TYPES[qtype]
    if qtype not in LEGACY_TYPES:
        raise ValueError(f"no byte-plane layout for {info.name}")
    n_rows, row_bytes = blocks.shape
    if row_bytes % info.type_size:
        raise ValueError(f"{info.name} row of {row_bytes} bytes is not a whole number of {info.type_size}-byte blocks")
    nb = row_bytes // info.type_size
    ng = -(-n_rows // ROW_GROUP)
    planes = np.zeros((ng, nb, info.type_size, ROW_GROUP), dtype=np.uint8)
    full = n_rows // ROW_GROUP
    src = np.asarray(blocks)
    if full:  # (g, r, b, j) -> (g, b, j, r), a group at a time so no temporary outgrows one group
        grouped = src[: full * ROW_GROUP].reshape(full, ROW_GROUP, nb, info.type_size)
        per_release = max(1, (8 << 20) // max(1, ROW_GROUP * row_bytes))
        for g in range(full):
            planes[g] = grouped[g].transpose(1, 2, 0)
            if (g + 1) % per_release == 0:  # the copied rows' file pages: the planes hold their bytes now
                pages.release(src[(g + 1 - per_release) * ROW_GROUP : (g + 1) * ROW_GROUP])
    tail = n_rows - full * ROW_GROUP
    if tail:
        planes[full, :, :, :tail] = src[full * ROW_GROUP :].reshape(tail, nb, info.type_size).transpose(1, 2, 0)
    pages.release(src)
    return Repacked(qtype, planes, n_rows, nb * QK)


def unpack_planes(rep: Repacked) -> U8:
    """The raw (n_rows, row_bytes) blocks back from byte planes (a copy)."""
    ng, nb, size, group = rep.planes.shape
    raw = rep.planes.transpose(0, 3, 1, 2).reshape(ng * group, nb * size)
    return np.ascontiguousarray(raw[: rep.n_rows])


# ---- numba helpers


@njit(cache=True)
def gather_group(blocks, g, size, planes):
    """Copy group g of raw blocks (n_rows, row_bytes) into flat planes (nb * size * ROW_GROUP,); zero past the end."""
    n_rows = blocks.shape[0]
    nb = blocks.shape[1] // size
    r0 = g * ROW_GROUP
    n = min(ROW_GROUP, n_rows - r0)
    for b in range(nb):  # contiguous writes; the group's cache lines of block b stay in L1 across j
        for j in range(size):
            col = b * size + j
            at = (b * size + j) * ROW_GROUP
            for r in range(n):
                planes[at + r] = blocks[r0 + r, col]
            for r in range(n, ROW_GROUP):
                planes[at + r] = 0


@njit(cache=True)
def unpack_q8(xq, size, yd, ys, yf):
    """Activation rows xq (m, nb * size) of block_q8_0 (size 34) or block_q8_1 (36) into float32
    d (m, nb), s (m, nb; zero for Q8_0) and quants (m, nb, 32)."""
    m = xq.shape[0]
    nb = xq.shape[1] // size
    head = size - QK
    for i in range(m):
        for b in range(nb):
            o = b * size
            yd[i, b] = f16_to_f32(np.uint16(xq[i, o]) | (np.uint16(xq[i, o + 1]) << np.uint16(8)))
            if head == 4:
                ys[i, b] = f16_to_f32(np.uint16(xq[i, o + 2]) | (np.uint16(xq[i, o + 3]) << np.uint16(8)))
            else:
                ys[i, b] = np.float32(0.0)
            for p in range(QK):
                yf[i, b, p] = np.float32(np.int8(xq[i, o + head + p]))


def split_activation(xq: U8, size: int) -> tuple[F32, F32, F32]:
    """NumPy twin of unpack_q8 for (m, bytes) activations: (d, s, quants) float32."""
    b = xq.reshape(xq.shape[0], -1, size)
    yd = np.ascontiguousarray(b[..., 0:2]).view("<f2")[..., 0].astype(np.float32)
    if size == 36:
        ys = np.ascontiguousarray(b[..., 2:4]).view("<f2")[..., 0].astype(np.float32)
    else:
        ys = np.zeros_like(yd)
    yf = b[..., size - QK :].view(np.int8).astype(np.float32)
    return yd, ys, yf
