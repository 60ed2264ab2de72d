"""Products of float32 activations with weights kept as ggml blocks, with ggml-cpu's numerics.

`BlockProduct(qtype, blocks)(x)` is `x @ W^T` for a weight W held as its GGUF blocks (usually the read-only
memory map). As ggml-cpu does before every product, x is first quantized to the weight type's vec_dot_type
(Q8_0, Q8_1, Q8_K, F16, ...). Then:

- with the compiled kernels: the integer block dot products (gemv for one row, gemm for up to GEMV_MAX_ROWS
  rows a call), bit for bit ggml's vec_dot, for any number of rows (a prompt too, as llama.cpp's CPU backend);
- without numba (or with GGUF_LENS_KERNELS=numpy): the quantized activation's values against tiles of W
  dequantized into a scratch buffer and multiplied by BLAS. Both operands hold exactly the values ggml
  multiplies, so only the order of float additions differs; no tile outlives the call.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from engine.kernels import fallback, pages, paths, precompile, warmed
from engine.kernels.activations import KERNEL_LOCK
from engine.kernels.variants import early
from engine.quant import dequantize_rows
from engine.kernels.types import I_QUANTS, K_QUANTS, VEC_DOT_TYPE
from engine.quant.types import TYPES, GGMLType

log = logging.getLogger(__name__)

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
Gemv = Callable[[U8, U8, F32], None]
DequantRows = Callable[[U8, int, int, F32], None]

NUMERICS = ("ggml", "float32")
GEMV_MAX_ROWS = 16  # activation rows per gemm call (the k-quant gemm decodes each weight block once for them)
TILED_MIN_ROWS = 8  # batches from this size take ggml-cpu's tiled k-quant path (Q6_K, Q4_K not repacked)
TILE_BYTES = 8 << 20  # float32 bytes of one dequantized weight tile in the prefill path

_T = GGMLType


@dataclass
class KernelSet:
    """The compiled functions found for one weight type (any may be missing)."""

    gemv: Gemv | None = None
    gemm: Gemv | None = None
    dequant: DequantRows | None = None
    repack: Callable[[U8], object] | None = None  # a faster layout for the products, made once per weight


@dataclass
class _Registry:
    loaded: bool = False
    compiled: bool = False
    reason: str = ""
    kernels: dict[GGMLType, KernelSet] = field(default_factory=dict)
    quantizers: dict[GGMLType, Callable[[F32], U8]] = field(default_factory=dict)


_REG = _Registry()


def _wanted() -> bool:
    return os.environ.get("GGUF_LENS_KERNELS", "auto").strip().lower() not in ("numpy", "off", "0", "none")


_LOAD_LOCK = threading.Lock()


def _load() -> _Registry:
    """Load the compiled kernels once (the families' tables) and the activation quantizers."""
    if _REG.loaded:
        return _REG
    with _LOAD_LOCK:
        if not _REG.loaded:
            _find_kernels()
            _REG.loaded = True
    return _REG


def _kernel_table() -> dict[GGMLType, KernelSet]:
    """Each weight type's compiled functions, from its family's table (imported here: numba compiles on import)."""
    from engine.kernels.iquant import dot as iquant  # noqa: PLC0415
    from engine.kernels.kquant import family as kquant  # noqa: PLC0415
    from engine.kernels.legacy import family as legacy  # noqa: PLC0415

    table = {t: KernelSet(legacy.GEMV[t], legacy.GEMM[t], legacy.DEQUANTIZE_ROWS[t], legacy.REPACK[t]) for t in legacy.TYPES}
    table.update({t: KernelSet(kquant.GEMV[t], kquant.GEMM[t], kquant.DEQUANTIZE_ROWS[t]) for t in K_QUANTS})
    table.update({t: KernelSet(iquant.GEMV[t], iquant.GEMM[t]) for t in I_QUANTS})
    assert set(table) == set(VEC_DOT_TYPE), "every type with a vec_dot_type has its kernels"
    return table


def _find_kernels() -> None:
    from engine.kernels import activations  # noqa: PLC0415 - numba-free at import

    _REG.quantizers = {t: getattr(activations, f"quantize_{t.name.lower()}_ref") for t in (_T.Q8_0, _T.Q8_1)}
    _REG.quantizers[_T.F16] = activations.quantize_f16_ref
    _REG.quantizers[_T.BF16] = activations.quantize_bf16_ref
    _REG.quantizers[_T.F32] = activations.quantize_f32
    if not _wanted():
        _REG.reason = "GGUF_LENS_KERNELS=numpy"
    elif not activations.HAVE_NUMBA:
        _REG.reason = "numba is not installed"
    else:
        try:
            _REG.kernels.update(_kernel_table())
            from engine.kernels.q8k import quantize_q8_k  # noqa: PLC0415

            _REG.quantizers.update({t: getattr(activations, f"quantize_{t.name.lower()}") for t in (_T.Q8_0, _T.Q8_1)})
            _REG.quantizers[_T.F16] = activations.quantize_f16
            _REG.quantizers[_T.BF16] = activations.quantize_bf16
            _REG.quantizers[_T.Q8_K] = quantize_q8_k
            _REG.compiled = True
        except Exception as exc:  # a broken numba/llvmlite install must not stop the engine
            _REG.kernels.clear()
            _REG.reason = f"the compiled kernels failed to load ({type(exc).__name__}: {exc})"
    if _T.Q8_K not in _REG.quantizers:
        from engine.kernels.q8k import quantize_q8_k_ref  # noqa: PLC0415

        _REG.quantizers[_T.Q8_K] = quantize_q8_k_ref
    if not _REG.compiled:
        log.warning("CPU kernels: NumPy fallback (%s); products follow ggml's numerics, more slowly", _REG.reason)


_KQUANT_ROWS: dict = {}


def _kquant_rows() -> dict:
    """Q5_K's and Q6_K's one-row products -> their few-rows twins (engine.kernels.kquant.dot), loaded once."""
    if not _KQUANT_ROWS:
        from engine.kernels.kquant import dot  # noqa: PLC0415 - compiled kernels only

        _KQUANT_ROWS.update({dot.gemv_q5_k: dot.gemv_rows_q5_k, dot.gemv_q6_k: dot.gemv_rows_q6_k})
    return _KQUANT_ROWS


def compiled() -> bool:
    """Whether the numba kernels are in use (else the NumPy fallback)."""
    return _load().compiled


def kernel_note() -> str:
    """One line for a status bar: which CPU path runs."""
    reg = _load()
    return "numba kernels" if reg.compiled else f"NumPy fallback ({reg.reason})"


def supported(qtype: GGMLType) -> bool:
    return qtype in VEC_DOT_TYPE


def dequantize_weight(qtype: GGMLType, blocks: U8, out: F32 | None = None) -> F32:
    """Every row of a weight's GGUF blocks (n_rows, row_bytes) as float32 (n_rows, n_cols), into `out` when given: the
    compiled row dequantizer of its type where there is one (the tiled prompt products' own; the same values as
    engine.quant's NumPy, several times faster), else engine.quant."""
    reg = _load()
    fn = reg.kernels.get(qtype, KernelSet()).dequant if reg.compiled else None
    info = TYPES[qtype]
    n_cols = blocks.shape[1] // info.type_size * info.block_size
    if out is None:
        out = np.empty((blocks.shape[0], n_cols), np.float32)
    if fn is None or precompile.is_dry():
        out[:] = dequantize_rows(blocks, qtype)
        return out
    with KERNEL_LOCK, fallback.one_numba_thread():  # BLAS multiplies it next: see one_numba_thread
        fn(blocks, 0, blocks.shape[0], out)
    return out


def quantize_activation(qtype: GGMLType, x: F32) -> U8:
    """x (T, n) as the bytes of `qtype`'s vec_dot_type, (T, nbytes), as ggml-cpu's from_float makes them."""
    quantizer = _load().quantizers[VEC_DOT_TYPE[qtype]]
    x = np.ascontiguousarray(x, dtype=np.float32)
    with KERNEL_LOCK:
        return quantizer(x)


def activation_values(vdt: GGMLType, xq: U8, n: int) -> F32:
    """The float32 values an activation's bytes stand for (T, n): what the integer products multiply."""
    t = xq.shape[0]
    if vdt == _T.F32:
        return xq.view(np.float32).reshape(t, n)
    if vdt == _T.F16:
        return xq.view(np.float16).astype(np.float32).reshape(t, n)
    if vdt == _T.BF16:
        return (xq.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(t, n)
    if vdt == _T.Q8_K:
        b = xq.reshape(t, -1, 292)
        d = np.ascontiguousarray(b[..., 0:4]).view(np.float32)  # (T, nb, 1)
        return (b[..., 4:260].view(np.int8).astype(np.float32) * d).reshape(t, n)
    size = 34 if vdt == _T.Q8_0 else 36
    b = xq.reshape(t, -1, size)
    d = np.ascontiguousarray(b[..., 0:2]).view(np.float16).astype(np.float32)  # (T, nb, 1)
    return (b[..., size - 32:].view(np.int8).astype(np.float32) * d).reshape(t, n)


class Activation:
    """One activation batch quantized once for every weight type that reads it (q/k/v, gate/up share one)."""

    def __init__(self, x: F32):
        self.x = np.ascontiguousarray(x, dtype=np.float32)
        self._bytes: dict[GGMLType | str, U8] = {}
        self._values: dict[GGMLType, F32] = {}

    def q8k_mat_bytes(self) -> U8:
        """Q8_K bytes as llama.cpp quantizes a batch for its repacked Q4_K gemm (rows in fours by
        ggml_quantize_mat_q8_K_4x8, the rest by quantize_row_q8_K): engine.kernels.kquant.repack."""
        got = self._bytes.get("q8_k_mat")
        if got is None:
            from engine.kernels.kquant.repack import quantize_q8_k_mat  # noqa: PLC0415 - compiled kernels only

            with KERNEL_LOCK:
                got = self._bytes["q8_k_mat"] = quantize_q8_k_mat(self.x)
        return got

    def bytes_for(self, qtype: GGMLType) -> U8:
        vdt = VEC_DOT_TYPE[qtype]
        got = self._bytes.get(vdt)
        if got is None:
            got = self._bytes[vdt] = quantize_activation(qtype, self.x)
        return got

    def values_for(self, qtype: GGMLType) -> F32:
        vdt = VEC_DOT_TYPE[qtype]
        got = self._values.get(vdt)
        if got is None:
            got = self._values[vdt] = activation_values(vdt, self.bytes_for(qtype), self.x.shape[1])
        return got


class BlockProduct:
    """x @ W^T on W's ggml blocks: (T, n_in) -> (T, n_out), nothing of W kept in float."""

    def __init__(self, qtype: GGMLType, blocks: U8, n_in: int, keep_blocks: bool = True,
                 parts: list[U8] | None = None):
        """`parts` (fused legacy products): the weights stacked by rows, `blocks` then being unused (None)."""
        if qtype not in VEC_DOT_TYPE:
            raise ValueError(f"no CPU product for {qtype.name} weights")
        self.qtype = qtype
        self.blocks = blocks
        self.n_in = n_in
        self.n_out = sum(p.shape[0] for p in parts) if parts else blocks.shape[0]
        reg = _load()
        ks = reg.kernels.get(qtype, KernelSet())
        self.gemv, self.gemm, self.dequant = ks.gemv, ks.gemm, ks.dequant
        self._make: Callable[[], object] | None = None
        self._lock = threading.Lock()
        # which of ggml-cpu's kernels the numbers follow: "vec_dot", a repacked path (every call: "repack_8x8", "q2_k_x8",
        # "iq4_nl_x8", "q4_0_x8"), the tiled path (self.tiled, from TILED_MIN_ROWS rows) where llama.cpp takes them;
        # "q8_0_x16": vec_dot's numbers, one row through vpdpbusd across sixteen rows; "q8_0_rows": vec_dot's own
        # AVX2 sequence on the GGUF blocks (a CPU without AVX512-VNNI, or rows not in sixteens)
        self.path, self.tiled = "vec_dot", None
        self._int_rows = False  # the one-row product is legacy.gemv_int on (a copy of) the GGUF blocks
        lazy = reg.compiled and int(qtype) in paths.LEGACY_INT  # batches read the GGUF blocks (legacy_gemm)
        stacked = (lambda: np.concatenate(parts, axis=0)) if parts else (lambda: blocks)
        if lazy and qtype == _T.Q8_0 and self.n_out % 16 == 0 and paths.q8_0_x16() is not None:
            self._make, self.gemv = _released(paths.q8_0_x16().repack_q8_0_x16, stacked, parts or [blocks]), paths.gemv_x16
            self.path, self.repacked, self.planar = "q8_0_x16", True, False
        elif lazy and qtype == _T.Q8_0 and not parts:  # ggml's AVX2 vec_dot on the GGUF blocks, moved (_anon_rows)
            self._make, self.gemv = self._anon_rows([blocks]), paths.gemv_q8_0_rows()
            self.path, self.repacked, self.planar = "q8_0_rows", False, False
        elif lazy and (int_gemv := paths.gemv_int(paths.legacy_kind(qtype, self.n_out))) is not None:
            # Q4_0..Q5_1: the one-row product reads the GGUF blocks in integers (legacy.gemv_int: streams them at
            # the memory's speed, where the byte planes' float lanes were compute-bound), from a copy in anonymous
            # memory made at the first one-row product; batches read that copy too: resident once, no page faults
            self._make, self.gemv = self._anon_rows(parts or [blocks]), int_gemv
            self.path, self.repacked, self.planar, self._int_rows = "vec_dot", False, False, True
        elif lazy and ks.repack is not None:
            # the legacy quants' byte planes, made at the first one-row product (decode): batches read the GGUF
            # blocks, so a model that only reads prompts (a sweep, a measurement) never holds the second copy
            self._make, self.repacked, self.planar = _released(ks.repack, stacked, parts or [blocks]), True, True
        else:
            # the kernels read the repacked layout where the type has one (same bytes, SIMD-friendly order)
            self.weight = ks.repack(blocks) if ks.repack is not None else blocks
            self.repacked = ks.repack is not None
            # a repacked copy (not the float types' identity repack) is all the products read from now on, prefill
            # tiles and Q4_1/Q5_1 block mins included: the raw blocks' file pages can go (repack released them)
            self.planar = self.weight is not blocks
        # batches of legacy quants: the integer kernel of legacy_gemm on the GGUF blocks (raw_parts, stacked by rows)
        self.batch = paths.legacy_batch() if reg.compiled and int(qtype) in paths.LEGACY_INT else None
        # the kernels' type id: Q4_0 with rows in eights takes llama.cpp's repacked q4_0_8x8 numbers (legacy_dot)
        self.kind = paths.legacy_kind(qtype, self.n_out) if reg.compiled else int(qtype)
        if self.kind != int(qtype):
            self.path = "q4_0_x8"
            if not self._int_rows:
                self.gemv = paths.legacy_gemv(self.kind)
        # F16 / F32 / BF16 batches: llamafile's tinyBLAS, as llama.cpp
        self.float_batch = paths.tinyblas_gemm(qtype) if reg.compiled else None
        self.raw_parts: list[U8] | None = (parts or [blocks]) if self.batch is not None else None
        if reg.compiled and qtype in (_T.Q3_K, _T.Q4_K, _T.Q5_K, _T.Q6_K):
            self._llama_cpp_paths(blocks)
        if reg.compiled and paths.takes_tiled(qtype, self.n_out):
            self.tiled = paths.tiled_gemm(qtype)  # Q2_K and the Q8_K i-quants (iquant_tiled)
        elif reg.compiled and (own := paths.repacked_rows(qtype, self.n_out)) is not None:
            self.path, self.gemv, self.gemm = own  # llama.cpp repacks these rows: q2_K_8x8 / iq4_nl_8x8 numbers
        if self.repacked and not keep_blocks:
            self.blocks = None  # a temporary (a concatenation of fused weights): only the repacked copy stays
        if parts:
            self.blocks = None
        row_floats = max(1, n_in)
        self.tile_rows = max(1, min(self.n_out, TILE_BYTES // (4 * row_floats)))

    @property
    def weight(self) -> object:
        """What the kernels read: the repacked copy (made on first use for the legacy quants), or the blocks."""
        if self._make is not None:
            with self._lock:
                if self._make is not None:
                    self._weight, self._make = self._make(), None
        return self._weight

    def _anon_rows(self, parts: list[U8]) -> Callable[[], U8]:
        """The GGUF blocks (the parts stacked by rows) moved into anonymous memory (huge pages where Linux gives
        them) at the first one-row product, each part's file pages released as it is copied (pages.anon_concat), and
        batches reading the copy from then on (raw_parts): a decode step reads the whole weight every token, and from
        a file mapping each 4 KiB page costs a TLB miss (two page walks in a VM): Gemma 3's Q8_0 output head took
        15.2 ms a token from the mapping there, 11.6 ms from the copy. The same bytes, the same bits; resident once."""

        def make() -> U8:
            copy = pages.anon_concat(parts)
            copy.flags.writeable = False
            self.raw_parts = [copy]
            return copy

        return make

    @property
    def repack_made(self) -> bool:
        """False while a legacy quant's repack waits for its first one-row product."""
        return self._make is None

    @weight.setter
    def weight(self, value: object) -> None:
        self._weight, self._make = value, None

    def _llama_cpp_paths(self, blocks: U8) -> None:
        """Q4_K rows in eights: repacked as llama.cpp does (q4_K_8x8), its gemv and gemm; else the tiled kernels."""
        repacked = paths.q4_k_8x8(blocks) if self.qtype == _T.Q4_K else None
        if repacked is not None:
            self.weight, self.gemv, self.gemm = repacked
            self.path, self.repacked, self.planar = "repack_8x8", True, True
        else:
            self.tiled = paths.tiled_gemm(self.qtype)

    def __call__(self, x: F32 | Activation, out: F32 | None = None) -> F32:
        out = self._product(x, out)
        if out.shape[0] > 1:  # a batch: the file-backed blocks it read leave this process, under pages.streaming()
            # always for the legacy quants' GGUF blocks, which only batches read (one-row products read the planes):
            # they stay in the page cache and fault back in at the next prompt (~2 ms for SmolLM2's 94 MiB), and the
            # model is not resident twice (blocks and planes; llama.cpp holds one copy)
            raw = self.raw_parts is not None
            pages.after_batch(self.raw_parts if raw else (self._weight_now(),), always=raw)
        return out

    def _weight_now(self) -> object:
        """The weight the kernels read if it is made (a pending repack stays pending)."""
        return None if self._make is not None else self._weight

    def _product(self, x: F32 | Activation, out: F32 | None) -> F32:
        act = x if isinstance(x, Activation) else Activation(x)
        t = act.x.shape[0]
        if out is None:
            out = np.empty((t, self.n_out), np.float32)
        if precompile.is_dry():  # the first start's dry pass (engine.kernels.precompile): no product kernel runs
            out[:] = 0.0
        elif t == 1 and self.gemv is not None and (self.batch is None or precompile.late_ready()):
            xq = act.bytes_for(self.qtype).reshape(-1)
            if self._int_rows:  # legacy.gemv_int's one specialisation: a read-only activation
                xq = xq.view()
                xq.flags.writeable = False
            with KERNEL_LOCK:  # numba's workqueue threading layer must not be entered from two threads at once
                early(self.gemv)(self.weight, xq, out.reshape(-1))
        elif self.float_batch is not None and paths.tinyblas_takes(t, self.n_in, self.n_out, self.qtype):
            x = act.bytes_for(self.qtype).view(np.float32 if self.qtype == _T.F32 else np.uint16).reshape(t, -1)
            with KERNEL_LOCK:
                early(self.float_batch)(np.asarray(self.weight).view(x.dtype).reshape(self.n_out, -1), x, out)
        elif self.batch is not None and self.raw_parts is not None:  # one row too while the gemv compiles
            xq = act.bytes_for(self.qtype)
            if len(self.raw_parts) == 1:
                with KERNEL_LOCK:
                    self.batch(self.kind, self.raw_parts[0], xq, out)
            else:  # stacked parts: each one's rows, then into its columns
                row = 0
                for part in self.raw_parts:
                    n = part.shape[0]
                    part_out = np.empty((t, n), np.float32)
                    with KERNEL_LOCK:
                        self.batch(self.kind, part, xq, part_out)
                    out[:, row : row + n] = part_out
                    row += n
        elif self.gemm is not None:  # every row through ggml's own kernels, GEMV_MAX_ROWS rows a call
            gemm = early(self.gemm)
            if self.path in ("q2_k_x8", "repack_8x8"):  # one call: each row decoded once; the batch quantized as
                xq = act.q8k_mat_bytes()  # forward_mul_mat does it (takes KERNEL_LOCK itself)
                with KERNEL_LOCK:
                    gemm(self.weight, xq, out)
                return out
            xq = act.bytes_for(self.qtype)
            if self.tiled is not None and t >= TILED_MIN_ROWS:
                with KERNEL_LOCK:  # one call: each weight row decoded once for the whole batch
                    early(self.tiled)(self.weight, xq, out)
                return out
            for r0 in range(0, t, GEMV_MAX_ROWS):
                r1 = min(t, r0 + GEMV_MAX_ROWS)
                with KERNEL_LOCK:
                    gemm(self.weight, xq[r0:r1], out[r0:r1])
        else:
            fallback.tiled_product(self, act, out)
        return out

    def gemv_rows(self, xq: U8, out: F32) -> None:
        """Each activation row (m, bytes of the vec_dot_type) as the one-row product computes it, into out (m, n_out):
        ggml's MUL_MAT_ID for the rows of one expert. Q4_K rows in eights: one call reading each weight group once
        for all rows (the same bits), and MXFP4 rows in eights the same way; else a gemv per row. Compiled kernels only; the caller holds KERNEL_LOCK."""
        if self.path == "repack_8x8" and xq.shape[0] > 1:
            early(paths.q4_k_rows())(self.weight, np.ascontiguousarray(xq), out)
            return
        if self.path == "mxfp4_x8" and xq.shape[0] > 1:  # its gemm gives each row the gemv's value, blocks read once
            early(self.gemm)(self.weight, np.ascontiguousarray(xq), out)
            return
        rows = _kquant_rows().get(self.gemv) if xq.shape[0] > 1 else None
        if rows is not None:  # Q5_K / Q6_K: each weight row read once for all the rows (the same bits)
            early(rows)(self.weight, np.ascontiguousarray(xq), out)
            return
        weight, gemv = self.weight, early(self.gemv)
        for r in range(xq.shape[0]):
            gemv(weight, xq[r], out[r])

    def bind(self, xq: U8, out: F32) -> Callable[[], None] | None:
        """The one-row product reading the activation bytes in xq (1, bytes of the vec_dot_type) into out (1, n_out),
        every argument prepared once (a decode step reuses its buffers); None without compiled kernels.
        The caller holds KERNEL_LOCK around the calls."""
        if self.gemv is None:
            return None
        if precompile.is_dry():
            return lambda: None
        if self._int_rows:  # legacy.gemv_int: its one specialisation reads a read-only activation
            gemv, w, x1, o1 = self.gemv, self.weight, xq.reshape(-1).view(), out.reshape(-1)
            x1.flags.writeable = False
            return lambda: gemv(w, x1, o1)
        if self.qtype in K_QUANTS or self.qtype in I_QUANTS or self.path in ("q8_0_x16", "q8_0_rows"):
            gemv, w, x1, o1 = self.gemv, self.weight, xq.reshape(-1), out.reshape(-1)
            return lambda: gemv(w, x1, o1)
        from engine.kernels.legacy.family import bind_gemv  # noqa: PLC0415 - compiled kernels only

        return bind_gemv(self.kind, self.weight, xq, out)

    def dequantize_tile(self, r0: int, r1: int, scratch: F32) -> F32:
        """Rows [r0, r1) of W as float32 in `scratch` (compiled when available, else NumPy)."""
        tile = scratch[: r1 - r0]
        if self.dequant is not None:
            with KERNEL_LOCK, fallback.one_numba_thread():
                self.dequant(self.weight if self.planar or self.blocks is None else self.blocks, r0, r1, tile)
        else:
            tile[:] = dequantize_rows(self.blocks[r0:r1], self.qtype)
        return tile

    @classmethod
    def fused(cls, qtype: GGMLType, parts: list[U8], n_in: int) -> BlockProduct:
        """One product over several weights of one type stacked by rows (q/k/v, gate/up): one kernel call.

        Only for types the kernels repack (the stacked copy is the repacked one; the GGUF blocks stay mapped).
        The legacy quants' batches read each part's blocks; their stacked repack waits for a one-row product.
        """
        if _load().compiled and int(qtype) in paths.LEGACY_INT:
            return cls(qtype, parts[0], n_in, parts=list(parts))
        product = cls(qtype, np.concatenate(parts, axis=0), n_in, keep_blocks=False)
        for p in parts:  # read once, by the concatenation
            pages.release(p)
        return product

    def rows(self, ids: npt.ArrayLike) -> F32:
        """Rows `ids` of W as float32 (embedding look-ups of a tied output), from the repacked copy when there is one."""
        if self.path == "repack_8x8":
            from engine.kernels.kquant.repack import unpack_q4_k_8x8  # noqa: PLC0415

            return dequantize_rows(unpack_q4_k_8x8(self.weight, ids), self.qtype)
        if self.path == "q8_0_x16" and self._make is None:
            quants, scales = self.weight
            return dequantize_rows(paths.q8_0_x16().unpack_rows(quants, scales, ids), self.qtype)
        if self.planar and (self._make is None or self.blocks is None):  # a repack not made yet: the blocks
            return dequantize_rows(self.weight.rows(ids), self.qtype)
        if self.path == "q8_0_rows" and self._make is None:  # the moved blocks, not the released file pages
            return dequantize_rows(self.weight, self.qtype, np.asarray(ids, dtype=np.int64))
        return dequantize_rows(self.blocks, self.qtype, np.asarray(ids, dtype=np.int64))

    @staticmethod
    def can_fuse(qtype: GGMLType) -> bool:
        ks = _load().kernels.get(qtype)
        return ks is not None and ks.repack is not None and ks.gemv is not None


def _released(repack: Callable[[U8], object], stacked: Callable[[], U8], parts: list[U8]) -> Callable[[], object]:
    """A repack to make later: of the blocks (stacked when fused); each part's file pages then leave this process
    (they were read once; batches fault them back in as they read them)."""

    def make() -> object:
        weight = repack(stacked())
        for p in parts:
            pages.release(p)
        return weight

    return make


def warm_up(weights: Iterable[GGMLType | tuple[GGMLType, int]], progress: Callable[[float], None] | None = None,
            legacy_rows: tuple[int, ...] = (1, 2, GEMV_MAX_ROWS + 1)) -> None:
    """Compile (or load from numba's cache) every kernel these weights use, before the first token: weight types
    (as 16-row weights), or (type, rows) pairs, since the row count picks Q8_0's x16 and Q4_K's repacked paths.
    Each product runs on 1, 2 and 17 rows (the one-row product, the batch kernels up to and past one call); the
    legacy quants on `legacy_rows` (their one-row product is a late kernel, engine.kernels.precompile).

    Arrays are read-only like the memory map, so the specialisations built here are the ones the model calls.
    """
    if not _load().compiled:
        return
    pairs = {(w, 16) if isinstance(w, GGMLType) else (GGMLType(w[0]), int(w[1])) for w in weights}
    todo = sorted({(t, 16 if r % 16 == 0 else 8 if r % 8 == 0 else 4) for t, r in pairs if t in VEC_DOT_TYPE})
    n = 256  # one super-block: a whole number of blocks for every type
    for i, (qtype, n_rows) in enumerate(todo):
        if progress is not None:
            progress(i / max(1, len(todo)))
        blocks = np.zeros((n_rows, TYPES[qtype].row_bytes(n)), np.uint8)
        blocks.flags.writeable = False
        product = BlockProduct(qtype, blocks, n)
        for m in legacy_rows if int(qtype) in paths.LEGACY_INT else (1, 2, GEMV_MAX_ROWS + 1):
            product(np.zeros((m, n), np.float32))
    if not precompile.is_dry() and precompile.late_ready():  # all of their kernels, the late ones too, are in
        warmed.mark(todo)  # numba's cache now: the next process loads them (engine.kernels.warmed)
    if progress is not None:
        progress(1.0)
