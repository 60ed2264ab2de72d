"""Which of ggml-cpu's kernels a weight takes, where that is not plain vec_dot, and the compiled kernels for them.

llama.cpp's CPU backend repacks Q4_K, Q4_0 and IQ4_NL weights with rows in eights (q4_K_8x8, q4_0_8x8 and
iq4_nl_8x8 gemv/gemm),
sends k-quant batches of 8+ rows of plain weights through its tiled path, and otherwise runs vec_dot (llamafile's
tinyBLAS for Q8_0 / Q4_0 / Q5_0 batches gives the same bits). The engine follows it: `q4_k_8x8`, `legacy_kind`
(Q4_0's q4_0_8x8 numbers in the legacy kernels), `iq4_nl_x8` and `tiled_gemm` here. Two more
kernels compute vec_dot's numbers faster: `legacy_batch` (integer prompt tiles on the GGUF blocks) and
`q8_0_x16` (one-row Q8_0 products across sixteen repacked rows, with AVX512-VNNI); elsewhere `gemv_q8_0_rows` runs
vec_dot's own AVX2 sequence on the GGUF blocks. Each module loads on first use.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.quant.types import GGMLType

from engine.kernels import isa, pages, precompile
from engine.kernels.variants import serial_twin

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
_T = GGMLType

LEGACY_INT = {int(t) for t in (_T.Q4_0, _T.Q4_1, _T.Q5_0, _T.Q5_1, _T.Q8_0)}
_X16: list[Any] = []


def q8_0_x16() -> Any:
    """engine.kernels.legacy.q8_0_x16 where the CPU has AVX512-VNNI, else None (the byte-plane kernel runs)."""
    if not _X16:
        from engine.kernels.legacy import q8_0_x16  # noqa: PLC0415 - compiled kernels only

        _X16.append(q8_0_x16 if q8_0_x16.available() else None)
    return _X16[0]


def gemv_int(kind: int) -> Callable | None:
    """The integer one-row product on the GGUF blocks (engine.kernels.legacy.gemv_int) of a legacy kernel type id
    (legacy_kind: Q4_0, Q4_1, Q5_0, Q5_1, Q4_0_X8) where numba targets AVX2 or AVX-512; else None (byte planes)."""
    from engine.kernels.legacy import gemv_int as gi  # noqa: PLC0415 - compiled kernels only

    return gi.GEMV_INT[kind] if kind in gi.KINDS and gi.available() else None


def gemv_q8_0_rows() -> Callable:
    """engine.kernels.legacy.q8_0_rows' one-row Q8_0 product on the GGUF blocks (ggml's AVX2 vec_dot sequence)."""
    from engine.kernels.legacy.q8_0_rows import gemv_q8_0_rows as gemv  # noqa: PLC0415 - compiled kernels only

    return gemv


def gemv_x16(weight: tuple[U8, npt.NDArray[np.uint16]], xq: U8, out: F32) -> None:
    q8_0_x16().gemv_q8_0_x16(weight[0], weight[1], xq, out)


def late_or(late: Callable, early: Callable) -> Callable:
    """`late` (a faster kernel of the same bits) once the late kernels may run (engine.kernels.precompile), the serial
    twin of `early` before (engine.kernels.variants.early): on a first start the AVX512-VNNI and AVX2 band batch
    kernels compile in the background, the plainer ones (a second or more each to compile instead of three to six)
    serve the first prompt."""
    def product(*args: Any) -> Any:
        return late(*args) if precompile.late_ready() else serial_twin(early)(*args)

    product.__name__, product.__doc__ = getattr(late, "__name__", "product"), late.__doc__
    return product


def legacy_batch() -> Callable[[int, U8, U8, F32], F32]:
    """The integer batch kernel of the legacy quants: legacy_gemm_vnni's where the CPU has AVX512-VNNI (the
    same bits in fewer instructions; legacy_gemm's while it compiles), legacy_gemm's elsewhere."""
    from engine.kernels.legacy.gemm import gemm_int  # noqa: PLC0415 - compiled kernels only

    if q8_0_x16() is not None:  # numba's target has AVX512-VNNI
        from engine.kernels.legacy.gemm_vnni import gemm_int_vnni  # noqa: PLC0415 - compiled kernels only

        return late_or(gemm_int_vnni, gemm_int)
    return gemm_int


def q4_k_8x8(blocks: U8) -> tuple[U8, Callable, Callable] | None:
    """(repacked weight, gemv, gemm) of llama.cpp's q4_K_8x8 path for Q4_K rows in eights, else None. The blocks'
    file pages are released: the products read the repacked copy only."""
    from engine.kernels.kquant import repack as kquant_repack  # noqa: PLC0415 - compiled kernels only

    if blocks.shape[0] % kquant_repack.GROUP:
        return None
    weight = kquant_repack.repack_q4_k_8x8(blocks)
    pages.release(blocks)
    if q8_0_x16() is not None:  # AVX512-VNNI: kquant_vnni's batches, the same bits
        from engine.kernels.kquant.vnni import gemm_q4_k_8x8_vnni  # noqa: PLC0415 - compiled kernels only

        return weight, kquant_repack.gemv_q4_k_8x8, late_or(gemm_q4_k_8x8_vnni, kquant_repack.gemm_q4_k_8x8)
    if isa.target() in ("avx2", "avx512"):  # AVX2: kquant_avx2_band's batches (no transposing reduction), the same bits
        from engine.kernels.kquant.avx2_band import gemm_q4_k_8x8_avx2  # noqa: PLC0415 - compiled kernels only

        return weight, kquant_repack.gemv_q4_k_8x8, late_or(gemm_q4_k_8x8_avx2, kquant_repack.gemm_q4_k_8x8)
    return weight, kquant_repack.gemv_q4_k_8x8, kquant_repack.gemm_q4_k_8x8


_ROWS: list[Callable] = []


def q4_k_rows() -> Callable[[U8, U8, F32], None]:
    """MUL_MAT_ID's rows of one repacked Q4_K expert with the gemv's bits: kquant_repack.gemv_rows_q4_k_8x8, or, from
    a register's worth of rows (16 with AVX512-VNNI, 8 on AVX2) and once the late kernels may run, the band kernel
    (the activations in the lanes: no transposing reduction; kquant_vnni, kquant_avx2_band)."""
    if _ROWS:
        return _ROWS[0]
    from engine.kernels.kquant.repack import gemv_rows_q4_k_8x8 as plain  # noqa: PLC0415 - compiled kernels only

    if q8_0_x16() is not None:
        from engine.kernels.kquant.vnni import gemv_rows_q4_k_8x8_vnni as band  # noqa: PLC0415
        least = 16
    elif isa.target() in ("avx2", "avx512"):
        from engine.kernels.kquant.avx2_band import gemv_rows_q4_k_8x8_avx2 as band  # noqa: PLC0415
        least = 8
    else:
        _ROWS.append(plain)
        return plain

    def rows(weight: U8, xq: U8, out: F32) -> None:
        (band if xq.shape[0] >= least and precompile.late_ready() else serial_twin(plain))(weight, xq, out)

    rows.least = least  # type: ignore[attr-defined]  # the rows from which the band kernel runs
    _ROWS.append(rows)
    return rows


def legacy_kind(qtype: GGMLType, n_rows: int) -> int:
    """The legacy kernels' type id for a weight: Q4_0_X8 for Q4_0 rows in eights (llama.cpp repacks those as
    q4_0_8x8 and multiplies every batch with one fma per block and row), else the type itself."""
    from engine.kernels.legacy.dot import Q4_0_X8  # noqa: PLC0415 - compiled kernels only

    return Q4_0_X8 if qtype == _T.Q4_0 and n_rows % 8 == 0 else int(qtype)


def legacy_gemv(kind: int) -> Callable:
    """The one-row product of the legacy kernels for a type id (legacy_kind)."""
    from engine.kernels.legacy.family import kind_gemv  # noqa: PLC0415 - compiled kernels only

    return kind_gemv(kind)


def tinyblas_gemm(qtype: GGMLType) -> Callable[[np.ndarray, np.ndarray, F32], None] | None:
    """llamafile's tinyBLAS order for F16 x F16, F32 x F32 and BF16 x BF16 batches (engine.kernels.floats.tinyblas;
    BF16: tinyBLAS<32> with AVX512_BF16, the AVX2 build's tinyBLAS<8> for its bits); None for other types, and for
    BF16 with AVX-512 bits on a CPU without AVX512_BF16 (the NumPy tiles run)."""
    from engine.kernels.floats import tinyblas  # noqa: PLC0415 - compiled kernels only

    if qtype in (_T.F16, _T.F32):
        return lambda w, x, out: tinyblas.gemm(w, x, out, isa.w8())
    if qtype == _T.BF16 and isa.bits() == "avx2":  # the AVX2 build: tinyBLAS<8, __m256, __m256, ggml_bf16_t>
        return tinyblas.gemm_bf16_8
    return tinyblas.gemm_bf16 if qtype == _T.BF16 and tinyblas.bf16_available() else None


def tinyblas_takes(n_rows: int, n: int, n_out: int, qtype: GGMLType = _T.F32) -> bool:
    """Whether llama.cpp takes tinyBLAS for a float batch: two rows or more, weight rows in fours, rows in
    sixteens (BF16: in 32s, tinyBLAS<32, __m512, __m512bh>'s step; the AVX2 build's F32 / F16 / BF16: in eights)."""
    step = 32 if qtype == _T.BF16 and isa.bits() != "avx2" else isa.lanes()
    return n_rows >= 2 and n_out % 4 == 0 and n % step == 0


def repacked_rows(qtype: GGMLType, n_rows: int) -> tuple[str, Callable, Callable] | None:
    """(path, gemv, gemm) with the numbers of llama.cpp's repacked kernels where its CPU_REPACK buffer takes the
    weight (computed on the GGUF blocks): IQ4_NL and MXFP4 rows in eights (iq4_nl_8x8, mxfp4_8x8,
    engine.kernels.iquant.dot), Q2_K
    rows in eights with AVX-512 (q2_K_8x8, engine.kernels.iquant.tiled); else None."""
    if qtype == _T.IQ4_NL and n_rows % 8 == 0:
        from engine.kernels.iquant import dot as iquant_dot  # noqa: PLC0415 - compiled kernels only

        return "iq4_nl_x8", iquant_dot.gemv_iq4_nl_x8, iquant_dot.gemm_iq4_nl_x8
    if qtype == _T.MXFP4 and n_rows % 8 == 0:  # mxfp4_8x8: the same template as iq4_nl_8x8's
        from engine.kernels.iquant import dot as iquant_dot  # noqa: PLC0415 - compiled kernels only

        return "mxfp4_x8", iquant_dot.gemv_mxfp4_x8, iquant_dot.gemm_mxfp4_x8
    if takes_q2_k_x8(qtype, n_rows):
        from engine.kernels.iquant.q2_k_gemv import gemv_q2_k_rows  # noqa: PLC0415 - compiled kernels only
        from engine.kernels.iquant.tiled import gemm_q2_k_x8  # noqa: PLC0415

        return "q2_k_x8", gemv_q2_k_rows, gemm_q2_k_x8  # the gemv's numbers, streamed in integers
    return None


def tiled_gemm(qtype: GGMLType) -> Callable:
    """The tiled gemm of a plain-buffer weight (batches of TILED_MIN_ROWS rows or more): Q3_K..Q6_K in
    kquant_tiled, Q2_K and the Q8_K i-quants in iquant_tiled."""
    if qtype.name in TILED_IQ:
        from engine.kernels.iquant.tiled import KINDS, gemm_tiled  # noqa: PLC0415 - compiled kernels only

        kind = KINDS[qtype.name]
        plain = lambda blocks, xq, out: gemm_tiled(kind, blocks, xq, out)  # noqa: E731
    else:
        from engine.kernels.kquant import tiled as kquant_tiled  # noqa: PLC0415 - compiled kernels only

        plain = getattr(kquant_tiled, f"gemm_tiled_{qtype.name.lower()}")
    if qtype in (_T.Q4_K, _T.Q5_K, _T.Q6_K, _T.IQ4_XS) and q8_0_x16() is not None:  # AVX512-VNNI: the same bits
        from engine.kernels.kquant import vnni as kquant_vnni  # noqa: PLC0415 - compiled kernels only

        return late_or(getattr(kquant_vnni, f"gemm_tiled_{qtype.name.lower()}_vnni"), plain)
    return plain


# the types of ggml-cpu's tiled path that iquant_tiled computes (Q2_K: with AVX-512 llama.cpp repacks rows in
# eights as q2_K_8x8, which the engine does not reproduce, so only other Q2_K weights take it)
TILED_IQ = ("IQ4_XS", "IQ3_S", "IQ3_XXS", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ1_S", "IQ1_M", "Q2_K")


def takes_q2_k_x8(qtype: GGMLType, n_rows: int) -> bool:
    """Q2_K rows in eights where the numerics follow llama.cpp's x86 AVX-512 build (its q2_K_8x8 repack; its AVX2
    build does not repack them; engine.kernels.isa), on x86."""
    if qtype != _T.Q2_K or n_rows % 8:
        return False
    return isa.bits() == "avx512" and isa.target() in isa.BUILDS


def takes_tiled(qtype: GGMLType, n_rows: int) -> bool:
    """Whether llama.cpp's batches of this weight (from TILED_MIN_ROWS activation rows) take the tiled path."""
    if qtype.name == "Q2_K":
        return not takes_q2_k_x8(qtype, n_rows)
    return qtype.name in TILED_IQ
