"""Compiled i-quant products: gemv / gemm for IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M.

  gemv_<type>(blocks, xq, out)   one activation row (its vec_dot_type bytes, Q8_K or Q8_0 for IQ4_NL) against
                                 every weight row: out[r] = ggml_vec_dot_<type>_q8_K(row r, xq)
  gemm_<type>(blocks, xq, out)   m activation rows (m, bytes) -> out (m, n_rows), every value the one gemv gives
                                 (each weight row decoded once for all m, iquant_tiles.py; IQ1_S / IQ1_M per pair)

The one-row products (and IQ4_XS's small batches) run as SIMD code (iquant_simd.py: table look-ups, exact maddubs /
madd lanes), IQ1_S / IQ1_M and the other small batches as scalar lanes (iquant_rows.py, iquant_tiles.py); all give
vec_dot's bits.

`blocks` is the (n_rows, row_bytes) uint8 weight (the read-only memory map, used in place). Each value is
bit for bit ggml-cpu's vec_dot on x86 (iquant_rows.py), which llama.cpp's MUL_MAT runs for batches under
8 rows; from 8 rows llama.cpp sends the IQ2/IQ3/IQ1/IQ4_XS types through its tiled path (iquant_tiled.py,
which BlockProduct takes for those batches) and IQ4_NL through llamafile's tinyBLAS (not reproduced: rows not in
eights only), except for IQ4_NL rows in eights: llama.cpp repacks those
(block_iq4_nlx8) and multiplies them with ggml_gemv / gemm_iq4_nl_8x8_q8_0 for every batch, one fma per block
of the exact integer sum, which `gemv_iq4_nl_x8` / `gemm_iq4_nl_x8` reproduce. Threads run over weight rows (prange). The drivers are spelled
out one per type so that numba caches each on its own.
"""
from __future__ import annotations

import numpy as np

from engine.kernels.activations import f16_to_f32, njit, prange
from engine.kernels.iquant.rows import (
    row_iq1_m,
    row_iq1_s,
)
from engine.kernels.iquant.eights import (
    OFFSET_IQ4_NL,
    OFFSET_MXFP4,
    rows8_iq4_nl_x8,
    rows8_mxfp4_x8,
    tile8_iq4_nl_x8,
    tile8_mxfp4_x8,
    tile_iq4_nl_x8,
    tile_mxfp4_x8,
    vnni_target,
)
from engine.kernels.iquant.simd import (
    dot_iq2_s,
    dot_iq2_xs,
    dot_iq2_xxs,
    dot_iq3_s,
    dot_iq3_xxs,
    dot_iq4_nl,
    dot_iq4_nl_x8,
    dot_mxfp4,
    dot_mxfp4_x8,
    tile_iq4_xs,
)
from engine.kernels.iquant import iq4_xs_gemv
from engine.kernels.iquant.tiles import gemm_decoded
from engine.quant.types import GGMLType

u64 = np.uint64

_KERNEL = {"parallel": True, "cache": True, "error_model": "numpy"}
_CHECK = {"cache": True, "error_model": "numpy"}
# bytes of one weight block, weights per block, bytes of the activation block that covers them
TYPE_SIZES = {"iq2_xxs": (66, 256, 292), "iq2_xs": (74, 256, 292), "iq2_s": (82, 256, 292), "iq3_xxs": (98, 256, 292), "iq3_s": (110, 256, 292), "iq1_s": (50, 256, 292), "iq1_m": (56, 256, 292), "iq4_xs": (136, 256, 292), "iq4_nl": (18, 32, 34), "mxfp4": (17, 32, 34)}


@njit(**_CHECK)
def _check(blocks, xq, out, type_size, act_size):
    """Blocks per row; static messages (numba raises them as ValueError)."""
    if blocks.ndim != 2 or (blocks.size and blocks.strides[1] != 1):
        raise ValueError("weights must be a 2-D uint8 array of rows with contiguous bytes")
    if blocks.shape[1] % type_size:
        raise ValueError("weight row bytes are not a whole number of blocks of this type")
    nb = blocks.shape[1] // type_size
    if xq.shape[xq.ndim - 1] != nb * act_size or (xq.size and xq.strides[xq.ndim - 1] != 1):
        raise ValueError("the activation rows must be contiguous vec_dot_type bytes as long as the weight rows")
    if out.shape[out.ndim - 1] != blocks.shape[0] or (out.ndim == 2 and out.shape[0] != xq.shape[0]):
        raise ValueError("out must hold one float32 per weight row (and per activation row)")
    if out.size and out.strides[out.ndim - 1] != 4:
        raise ValueError("out's float32 values of an activation row must be contiguous")
    return nb


@njit(**_KERNEL)
def gemv_iq2_xxs(blocks, xq, out):
    """out[r] = ggml_vec_dot_iq2_xxs_q8_K(row r, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check(blocks, xq, out, 66, 292)
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = np.float32(0.125) * dot_iq2_xxs(blocks, u64(r) * rs, nb, xq, u64(0))  # iquant_simd
    return out


@njit(**_CHECK)
def gemm_iq2_xxs(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_iq2_xxs_q8_K(row r, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    _check(blocks, xq, out, 66, 292)
    return gemm_decoded(0, blocks, xq, out)  # each row decoded once (iquant_tiles.py)


@njit(**_KERNEL)
def gemv_iq2_xs(blocks, xq, out):
    """out[r] = ggml_vec_dot_iq2_xs_q8_K(row r, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check(blocks, xq, out, 74, 292)
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = np.float32(0.125) * dot_iq2_xs(blocks, u64(r) * rs, nb, xq, u64(0))  # iquant_simd
    return out


@njit(**_CHECK)
def gemm_iq2_xs(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_iq2_xs_q8_K(row r, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    _check(blocks, xq, out, 74, 292)
    return gemm_decoded(1, blocks, xq, out)  # each row decoded once (iquant_tiles.py)


@njit(**_KERNEL)
def gemv_iq2_s(blocks, xq, out):
    """out[r] = ggml_vec_dot_iq2_s_q8_K(row r, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check(blocks, xq, out, 82, 292)
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = np.float32(0.125) * dot_iq2_s(blocks, u64(r) * rs, nb, xq, u64(0))  # iquant_simd
    return out


@njit(**_CHECK)
def gemm_iq2_s(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_iq2_s_q8_K(row r, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    _check(blocks, xq, out, 82, 292)
    return gemm_decoded(2, blocks, xq, out)  # each row decoded once (iquant_tiles.py)


@njit(**_KERNEL)
def gemv_iq3_xxs(blocks, xq, out):
    """out[r] = ggml_vec_dot_iq3_xxs_q8_K(row r, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check(blocks, xq, out, 98, 292)
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = np.float32(0.25) * dot_iq3_xxs(blocks, u64(r) * rs, nb, xq, u64(0))  # iquant_simd
    return out


@njit(**_CHECK)
def gemm_iq3_xxs(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_iq3_xxs_q8_K(row r, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    _check(blocks, xq, out, 98, 292)
    return gemm_decoded(3, blocks, xq, out)  # each row decoded once (iquant_tiles.py)


@njit(**_KERNEL)
def gemv_iq3_s(blocks, xq, out):
    """out[r] = ggml_vec_dot_iq3_s_q8_K(row r, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check(blocks, xq, out, 110, 292)
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = np.float32(1.0) * dot_iq3_s(blocks, u64(r) * rs, nb, xq, u64(0))  # iquant_simd
    return out


@njit(**_CHECK)
def gemm_iq3_s(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_iq3_s_q8_K(row r, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    _check(blocks, xq, out, 110, 292)
    return gemm_decoded(4, blocks, xq, out)  # each row decoded once (iquant_tiles.py)


@njit(**_KERNEL)
def gemv_iq1_s(blocks, xq, out):
    """out[r] = ggml_vec_dot_iq1_s_q8_K(row r, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check(blocks, xq, out, 50, 292)
    for r in prange(blocks.shape[0]):
        out[r] = row_iq1_s(blocks[r], 0, nb, xq, 0)
    return out


@njit(**_KERNEL)
def gemm_iq1_s(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_iq1_s_q8_K(row r, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    nb = _check(blocks, xq, out, 50, 292)
    for r in prange(blocks.shape[0]):
        for a in range(xq.shape[0]):
            out[a, r] = row_iq1_s(blocks[r], 0, nb, xq[a], 0)
    return out


@njit(**_KERNEL)
def gemv_iq1_m(blocks, xq, out):
    """out[r] = ggml_vec_dot_iq1_m_q8_K(row r, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check(blocks, xq, out, 56, 292)
    for r in prange(blocks.shape[0]):
        out[r] = row_iq1_m(blocks[r], 0, nb, xq, 0)
    return out


@njit(**_KERNEL)
def gemm_iq1_m(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_iq1_m_q8_K(row r, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    nb = _check(blocks, xq, out, 56, 292)
    for r in prange(blocks.shape[0]):
        for a in range(xq.shape[0]):
            out[a, r] = row_iq1_m(blocks[r], 0, nb, xq[a], 0)
    return out


@njit(**_KERNEL)
def gemv_iq4_xs(blocks, xq, out):
    """out[r] = ggml_vec_dot_iq4_xs_q8_K(row r, xq): blocks (n_rows, row_bytes), xq (nb * 292,) (iq4_xs_gemv)."""
    nb = _check(blocks, xq, out, 136, 292)
    rs = u64(blocks.strides[0])
    xp = iq4_xs_gemv.permuted(xq, nb)  # two sub-blocks a step, the activation's quants in their order
    for r in prange(blocks.shape[0]):
        out[r] = iq4_xs_gemv.row_iq4_xs_pairs(blocks, u64(r) * rs, nb, xp)
    return out


@njit(**_KERNEL)
def gemm_iq4_xs(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_iq4_xs_q8_K(row r, xq[a]): xq (m, nb * 292), out (m, n_rows); each super-block
    decoded once for up to 16 activation rows (iquant_simd)."""
    nb = _check(blocks, xq, out, 136, 292)
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    n, m = blocks.shape[0], xq.shape[0]
    for task in prange((n + 15) // 16):
        for a0 in range(0, m, 16):
            for r in range(task * 16, min(n, (task + 1) * 16)):
                tile_iq4_xs(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(16, m - a0), out,
                            u64(a0) * os + u64(4 * r), os)
    return out


@njit(**_KERNEL)
def gemv_iq4_nl(blocks, xq, out):
    """out[r] = ggml_vec_dot_iq4_nl_q8_0(row r, xq): blocks (n_rows, row_bytes), xq (nb * 34,) (iquant_simd)."""
    nb = _check(blocks, xq, out, 18, 34)
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = dot_iq4_nl(blocks, u64(r) * rs, nb, xq, u64(0))
    return out


@njit(**_KERNEL)
def gemm_iq4_nl(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_iq4_nl_q8_0(row r, xq[a]): xq (m, nb * 34), out (m, n_rows)."""
    nb = _check(blocks, xq, out, 18, 34)
    rs, xs = u64(blocks.strides[0]), u64(xq.strides[0])
    for r in prange(blocks.shape[0]):
        for a in range(xq.shape[0]):
            out[a, r] = dot_iq4_nl(blocks, u64(r) * rs, nb, xq, u64(a) * xs)
    return out


# ---- IQ4_NL as llama.cpp's repacked iq4_nl_8x8 path multiplies it (gemv_q4_b32_8x8_q8_0_lut_avx in
# ggml-cpu/arch/x86/repack.cpp): per block acc = fma(float(sumi), d_w * d_x, acc), sumi the block's exact sum


@njit(**_KERNEL)
def gemv_iq4_nl_x8(blocks, xq, out):
    """out[r] = ggml_gemv_iq4_nl_8x8_q8_0's value for row r (rows in eights, as llama.cpp repacks them)."""
    nb = _check(blocks, xq, out, 18, 34)
    rs = u64(blocks.strides[0])
    n = blocks.shape[0]
    for g in prange((n + 7) // 8):  # eight rows at once (simd.rows8_*), the same values as one by one
        if 8 * g + 8 <= n:
            rows8_iq4_nl_x8(blocks, u64(8 * g) * rs, rs, nb, xq, u64(0), out, u64(32 * g))
        else:
            for r in range(8 * g, n):
                out[r] = dot_iq4_nl_x8(blocks, u64(r) * rs, nb, xq, u64(0))
    return out


@njit(cache=True, error_model="numpy")
def block_sums(xq, nb, offset):
    """For the VNNI tiles (simd.tile8_*): (sx, dx, xp). sx[j, a] = offset * the sum of activation a's 32 int8 values
    in Q8_0 block j, dx[j, a] its fp16 d as float32 (zero past the activations); xp: xq with its rows padded to a
    multiple of eight with zero rows (xq itself when they are)."""
    m, row = xq.shape
    mp = (m + 7) // 8 * 8
    sx = np.zeros((nb, mp), np.int32)
    dx = np.zeros((nb, mp), np.float32)
    for a in range(m):
        for j in range(nb):
            t = 0
            for i in range(34 * j + 2, 34 * j + 34):
                v = np.int32(xq[a, i])
                t += v - 256 if v > 127 else v
            sx[j, a] = offset * t
            dx[j, a] = f16_to_f32(np.uint16(xq[a, 34 * j]) | (np.uint16(xq[a, 34 * j + 1]) << np.uint16(8)))
    if mp == m:
        return sx, dx, xq
    xp = np.zeros((mp, row), np.uint8)
    xp[:m] = xq
    return sx, dx, xp


@njit(**_KERNEL)
def gemm_iq4_nl_x8(blocks, xq, out):
    """out[a, r] = ggml_gemm_iq4_nl_8x8_q8_0's value (the gemv's, per activation row); each block decoded once for
    up to 16 activation rows (iquant_simd)."""
    nb = _check(blocks, xq, out, 18, 34)
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    n, m = blocks.shape[0], xq.shape[0]
    if vnni_target():  # eight activations a step, every block's sums and scales gathered first
        sx, dx, xp = block_sums(xq, nb, OFFSET_IQ4_NL)
        xps, ss = u64(xp.strides[0]), u64(sx.strides[0])
        for task in prange((n + 15) // 16):
            for a0 in range(0, m, 8):
                for r in range(task * 16, min(n, (task + 1) * 16)):
                    tile8_iq4_nl_x8(blocks, u64(r) * rs, nb, xp, u64(a0) * xps, xps, out, u64(a0) * os + u64(4 * r),
                                    os, min(8, m - a0), sx, dx, u64(4 * a0), ss)
        return out
    for task in prange((n + 15) // 16):
        for a0 in range(0, m, 16):
            for r in range(task * 16, min(n, (task + 1) * 16)):
                tile_iq4_nl_x8(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(16, m - a0), out,
                               u64(a0) * os + u64(4 * r), os)
    return out


# ---- MXFP4 (gpt-oss's experts) against Q8_0 activations: ggml_vec_dot_mxfp4_q8_0 (IQ4_NL's code with an E8M0
# exponent and kvalues_mxfp4), and rows in eights as llama.cpp's mxfp4_8x8 repack multiplies them (the same
# template as iq4_nl_8x8's, gemv_q4_b32_8x8_q8_0_lut_avx / gemm_...): per block acc = fma(float(sumi), d_w * d_x, acc)


@njit(**_KERNEL)
def gemv_mxfp4(blocks, xq, out):
    """out[r] = ggml_vec_dot_mxfp4_q8_0(row r, xq): blocks (n_rows, row_bytes), xq (nb * 34,)."""
    nb = _check(blocks, xq, out, 17, 34)
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = dot_mxfp4(blocks, u64(r) * rs, nb, xq, u64(0))
    return out


@njit(**_KERNEL)
def gemm_mxfp4(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_mxfp4_q8_0(row r, xq[a]) (no tinyBLAS kernel takes MXFP4)."""
    nb = _check(blocks, xq, out, 17, 34)
    rs, xs = u64(blocks.strides[0]), u64(xq.strides[0])
    for r in prange(blocks.shape[0]):
        for a in range(xq.shape[0]):
            out[a, r] = dot_mxfp4(blocks, u64(r) * rs, nb, xq, u64(a) * xs)
    return out


@njit(**_KERNEL)
def gemv_mxfp4_x8(blocks, xq, out):
    """out[r] = ggml_gemv_mxfp4_8x8_q8_0's value for row r (rows in eights, as llama.cpp repacks them)."""
    nb = _check(blocks, xq, out, 17, 34)
    rs = u64(blocks.strides[0])
    n = blocks.shape[0]
    for g in prange((n + 7) // 8):  # eight rows at once, as gemv_iq4_nl_x8
        if 8 * g + 8 <= n:
            rows8_mxfp4_x8(blocks, u64(8 * g) * rs, rs, nb, xq, u64(0), out, u64(32 * g))
        else:
            for r in range(8 * g, n):
                out[r] = dot_mxfp4_x8(blocks, u64(r) * rs, nb, xq, u64(0))
    return out


@njit(**_KERNEL)
def gemv_experts_mxfp4_x8(weights, xq, rows, out):
    """out[i] = gemv_mxfp4_x8 of weights[i] (a tuple of same-shaped MXFP4 experts) with the Q8_0 row xq[rows[i]]:
    a decode step's routed experts in one parallel region instead of one each (the same bits)."""
    k = len(weights)
    n = weights[0].shape[0]
    nb = _check(weights[0], xq[0], out[0], 17, 34)
    if out.ndim != 2 or out.shape[0] != k or (out.size and out.strides[1] != 4) or xq.ndim != 2:
        raise ValueError("out must be (experts, n_rows) float32 with contiguous rows, xq (m, bytes)")
    for i in range(k):
        if weights[i].shape[0] != n or weights[i].shape[1] != weights[0].shape[1] or not 0 <= rows[i] < xq.shape[0]:
            raise ValueError("every expert must have the first one's shape, every row index a row of xq")
    xs, os, ng = u64(xq.strides[0]), u64(out.strides[0]), (n + 7) // 8
    for task in prange(k * ng):  # eight rows of an expert at once
        e = task // ng
        g = task % ng
        w = weights[e]
        rs = u64(w.strides[0])
        if 8 * g + 8 <= n:
            rows8_mxfp4_x8(w, u64(8 * g) * rs, rs, nb, xq, u64(rows[e]) * xs, out, u64(e) * os + u64(32 * g))
        else:
            for r in range(8 * g, n):
                out[e, r] = dot_mxfp4_x8(w, u64(r) * rs, nb, xq, u64(rows[e]) * xs)
    return out


@njit(**_KERNEL)
def gemm_mxfp4_x8(blocks, xq, out):
    """out[a, r] = ggml_gemm_mxfp4_8x8_q8_0's value (the gemv's, per activation row); each block decoded once for
    up to 16 activation rows, their block sums gathered eight at a time (eights._tile_nl_x8; eights.tile8_* on AVX512-VNNI)."""
    nb = _check(blocks, xq, out, 17, 34)
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    n, m = blocks.shape[0], xq.shape[0]
    if vnni_target():  # as gemm_iq4_nl_x8
        sx, dx, xp = block_sums(xq, nb, OFFSET_MXFP4)
        xps, ss = u64(xp.strides[0]), u64(sx.strides[0])
        for task in prange((n + 15) // 16):
            for a0 in range(0, m, 8):
                for r in range(task * 16, min(n, (task + 1) * 16)):
                    tile8_mxfp4_x8(blocks, u64(r) * rs, nb, xp, u64(a0) * xps, xps, out, u64(a0) * os + u64(4 * r),
                                   os, min(8, m - a0), sx, dx, u64(4 * a0), ss)
        return out
    for task in prange((n + 15) // 16):
        for a0 in range(0, m, 16):
            for r in range(task * 16, min(n, (task + 1) * 16)):
                tile_mxfp4_x8(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(16, m - a0), out,
                              u64(a0) * os + u64(4 * r), os)
    return out


_T = GGMLType
GEMV = {_T.IQ4_NL: gemv_iq4_nl, _T.IQ4_XS: gemv_iq4_xs, _T.IQ3_XXS: gemv_iq3_xxs, _T.IQ3_S: gemv_iq3_s,
        _T.IQ2_XXS: gemv_iq2_xxs, _T.IQ2_XS: gemv_iq2_xs, _T.IQ2_S: gemv_iq2_s, _T.IQ1_S: gemv_iq1_s, _T.IQ1_M: gemv_iq1_m,
        _T.MXFP4: gemv_mxfp4}
GEMM = {_T.IQ4_NL: gemm_iq4_nl, _T.IQ4_XS: gemm_iq4_xs, _T.IQ3_XXS: gemm_iq3_xxs, _T.IQ3_S: gemm_iq3_s,
        _T.IQ2_XXS: gemm_iq2_xxs, _T.IQ2_XS: gemm_iq2_xs, _T.IQ2_S: gemm_iq2_s, _T.IQ1_S: gemm_iq1_s, _T.IQ1_M: gemm_iq1_m,
        _T.MXFP4: gemm_mxfp4}
