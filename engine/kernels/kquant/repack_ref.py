"""NumPy reference of llama.cpp's repacked Q4_K products (q4_K_8x8_q8_K, ggml-cpu/repack.cpp, x86 build).

On an AVX2 (or AVX-512) CPU ggml-cpu keeps every Q4_K weight whose row count (ne[1]) is a multiple of 8 in
its CPU_REPACK buffer (ggml_repack_get_optimal_repack_type): at load the rows are interleaved eight at a
time into block_q4_Kx8, and every MUL_MAT on them runs tensor_traits<block_q4_K, 8, 8, Q8_K>::forward_mul_mat:

- activation rows [0, m - m % 4) are quantized four at a time by ggml_quantize_mat_q8_K_4x8 into
  block_q8_Kx4 and multiplied by ggml_gemm_q4_K_8x8_q8_K; the last m % 4 rows (all of them when m < 4) are
  quantized by quantize_row_q8_K (from_float) and multiplied one by one by ggml_gemv_q4_K_8x8_q8_K;
- gemv and gemm (arch/x86/repack.cpp, __AVX2__ / __AVX512BW__ branches) compute each output (activation a,
  weight row r) as one float recurrence over exact integers, with no horizontal sum:
      isum = sum_j scale_j * dot(q4 of sub-block j, q8 of sub-block j)        (exact int32)
      imin = sum_j min_j * (bsums[2j] + bsums[2j + 1])                          (exact int32)
      acc  = fma(float(isum), fp16(d) * d8, acc)      acc_min = fma(float(imin), fp16(dmin) * d8, acc_min)
      out  = acc - acc_min
  (d8 the activation block's scale; the products fp16 * d8 are rounded to float32 first). The gemv takes
  one step per super-block (j over its 8 sub-blocks); the gemm, in every branch (16 columns with AVX-512,
  8 with AVX2, 16 or 4 rows), one step per pair of sub-blocks (j = 2p, 2p + 1; four steps per super-block).
  So the two round differently, and the same row gives different floats through gemv and gemm;
- ggml_quantize_mat_q8_K_4x8 (its __AVX2__ branch) gives the same bytes as quantize_row_q8_K except for the
  sign of the scale: it takes iscale = -127 / amax when +amax occurs anywhere in the block, else
  +127 / amax, where quantize_row_q8_K follows the sign of the first element of largest magnitude; and
  it converts with _mm256_cvtps_epi32 and saturating packs (a product that is not a finite int32 becomes
  -128), where quantize_row_q8_K uses the 1.5 * 2^23 trick. For finite blocks the two differ only when
  both +amax and -amax occur and -amax comes first.

So the values the integer products see are fixed by (weight row, activation row) alone: this module
keeps the weight as plain Q4_K blocks and the activations as plain block_q8_K bytes (the interleaved
layouts only change where bytes live). kquant_repack.py is the compiled version; these functions define
what it must return bit for bit. Non-finite activations are not covered.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.quant.kquants import k4_scales_mins

from engine.kernels.legacy.ref import fma32_ref
from engine.kernels.q8k import Q8K_BLOCK_BYTES, q8k_fields, quantize_q8_k_ref

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]
QK_K = 256
Q4K_BYTES = 144
GROUP = 8  # weight rows interleaved per block_q4_Kx8 (NB_COLS)
MAT_ROWS = 4  # activation rows per block_q8_Kx4


def mat_rows(m: int) -> int:
    """How many of m activation rows llama.cpp sends through the 4-row gemm (the rest go through gemv)."""
    return m - m % MAT_ROWS


def repacks(n_rows: int, n_cols: int) -> bool:
    """Whether ggml-cpu (AVX2 / AVX-512) repacks a Q4_K weight of this shape (ne[1] = n_rows, ne[0] = n_cols).

    ggml_repack_get_optimal_repack_type asks only ne[1] % 8 == 0; a Q4_K row is always whole super-blocks.
    Otherwise the weight stays in the plain CPU buffer: ggml_vec_dot_q4_K_q8_K for fewer than 8 activation
    rows, the tiled k-quant path (ggml-cpu/tiled) for 8 or more."""
    return n_rows % GROUP == 0 and n_cols % QK_K == 0


# ---- activations


def quantize_q8_k_4x8_ref(x: npt.ArrayLike) -> U8:
    """Rows x (m, n) as ggml_quantize_mat_q8_K_4x8 quantizes them, in plain block_q8_K bytes (m, n / 256 * 292)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK_K:
        raise ValueError(f"expected (m, n) float32 rows with n a multiple of {QK_K}, got {x.shape}")
    m, n = x.shape
    blocks = x.reshape(-1, QK_K)
    amax = np.abs(blocks).max(axis=1)
    positive = (blocks == amax[:, None]).any(axis=1)
    nonzero = amax != 0
    with np.errstate(all="ignore"):
        safe = np.where(nonzero, amax, np.float32(1.0))
        iscale = np.where(positive, np.float32(-127.0) / safe, np.float32(127.0) / safe)
        iscale = np.where(nonzero, iscale, np.float32(0.0)).astype(np.float32)
        d = np.where(nonzero, np.float32(1.0) / iscale, np.float32(0.0)).astype(np.float32)
        v = np.rint((blocks * iscale[:, None]).astype(np.float32)).astype(np.float64)
    bad = ~np.isfinite(v) | (v >= 2.0**31) | (v < -(2.0**31))  # _mm256_cvtps_epi32: 0x80000000
    q = np.clip(np.where(bad, -(2.0**31), v), -128, 127).astype(np.int8)
    bsums = q.reshape(-1, 16, 16).astype(np.int32).sum(axis=2).astype(np.int16)
    out = np.empty((len(blocks), Q8K_BLOCK_BYTES), dtype=np.uint8)
    out[:, 0:4] = d.astype("<f4").reshape(-1, 1).view(np.uint8)
    out[:, 4 : 4 + QK_K] = q.view(np.uint8)
    out[:, 4 + QK_K :] = bsums.astype("<i2").view(np.uint8)
    return out.reshape(m, n // QK_K * Q8K_BLOCK_BYTES)


def quantize_q8_k_mat_ref(x: npt.ArrayLike) -> U8:
    """The Q8_K bytes forward_mul_mat multiplies for activation rows x (m, n): 4x8 rule for the first
    mat_rows(m) rows, quantize_row_q8_K for the rest, each row as plain block_q8_K (m, n / 256 * 292)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"expected (m, n) rows, got shape {x.shape}")
    k = mat_rows(x.shape[0])
    out = np.empty((x.shape[0], x.shape[1] // QK_K * Q8K_BLOCK_BYTES), dtype=np.uint8)
    if k:
        out[:k] = quantize_q8_k_4x8_ref(x[:k])
    if k < x.shape[0]:
        out[k:] = quantize_q8_k_ref(x[k:])
    return out


# ---- weights


def q4_k_fields(blocks: U8) -> tuple[F32, F32, I64, I64, I64]:
    """Q4_K rows (r, nb * 144) -> d, dmin (r, nb) float32, scales, mins (r, nb, 8), quants (r, nb, 8, 32)."""
    b = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(blocks.shape[0], -1, Q4K_BYTES)
    r, nb = b.shape[:2]
    d = np.ascontiguousarray(b[..., 0:2]).view("<f2")[..., 0].astype(np.float32)
    dmin = np.ascontiguousarray(b[..., 2:4]).view("<f2")[..., 0].astype(np.float32)
    sc, mn = k4_scales_mins(b[..., 4:16].reshape(-1, 12))
    qs = b[..., 16:].reshape(r, nb, 4, 32)
    q = np.stack([qs & np.uint8(15), qs >> np.uint8(4)], axis=3).reshape(r, nb, 8, 32)  # sub-blocks 2j, 2j + 1
    return (d, dmin, sc.reshape(r, nb, 8).astype(np.int64), mn.reshape(r, nb, 8).astype(np.int64),
            q.astype(np.int64))


def int_sums_q4_k_ref(blocks: U8, xq: U8) -> tuple[I64, I64]:
    """(isum, imin), each (m, r, nb, 4): the exact integers of every (activation, weight row, super-block,
    pair of sub-blocks 2p and 2p + 1), scale * dot and min * bsum summed over the pair."""
    _, _, sc, mn, q = q4_k_fields(blocks)
    _, qs, bsums = q8k_fields(np.atleast_2d(xq))
    m, nb = qs.shape[:2]
    x = qs.reshape(m, nb, 8, 32).astype(np.float64)
    dots = np.einsum("rnjk,mnjk->mrnj", q.astype(np.float64), x)  # exact: |sums| < 2^53
    isum = (dots.astype(np.int64) * sc[None]).reshape(m, -1, nb, 4, 2).sum(axis=4)
    pair = bsums.astype(np.int64).reshape(m, nb, 8, 2).sum(axis=3)  # (m, nb, 8): bsums of each 32 weights
    imin = (mn[None] * pair[:, None]).reshape(m, -1, nb, 4, 2).sum(axis=4)
    return isum, imin


def _products(blocks: U8, xq: U8, per_pair: bool) -> F32:
    xq = np.atleast_2d(xq)
    d, dmin, *_ = q4_k_fields(blocks)
    yd = q8k_fields(xq)[0]  # (m, nb)
    if yd.shape[1] != d.shape[1]:
        raise ValueError(f"activation has {yd.shape[1]} super-blocks per row, weight {d.shape[1]}")
    isum, imin = int_sums_q4_k_ref(blocks, xq)
    if not per_pair:  # the gemv: one step per super-block
        isum, imin = isum.sum(axis=3, keepdims=True), imin.sum(axis=3, keepdims=True)
    acc = np.zeros(isum.shape[:2], np.float32)
    acc_min = np.zeros(isum.shape[:2], np.float32)
    for i in range(d.shape[1]):
        scale = (d[None, :, i] * yd[:, i, None]).astype(np.float32)
        scale_min = (dmin[None, :, i] * yd[:, i, None]).astype(np.float32)
        for p in range(isum.shape[3]):
            acc = fma32_ref(isum[..., i, p].astype(np.float32), scale, acc)
            acc_min = fma32_ref(imin[..., i, p].astype(np.float32), scale_min, acc_min)
    return (acc - acc_min).astype(np.float32)


def gemv_q4_k_8x8_ref(blocks: U8, xq: U8) -> F32:
    """out (m, r) as ggml_gemv_q4_K_8x8_q8_K computes it for each Q4_K row of `blocks` (r, nb * 144) and each
    Q8_K row of xq (m, nb * 292): acc = fma(float(isum), d * d8, acc) once per super-block (isum over all 8
    sub-blocks), the same for the mins, out = acc - acc_min. Any r (llama.cpp needs r % 8 == 0)."""
    return _products(blocks, xq, per_pair=False)


def gemm_q4_k_8x8_ref(blocks: U8, xq: U8) -> F32:
    """out (m, r) as ggml_gemm_q4_K_8x8_q8_K computes it (every x86 branch): like the gemv, but one fused
    multiply-add per pair of sub-blocks (4 per super-block), for the quants and for the mins."""
    return _products(blocks, xq, per_pair=True)


def matmul_q4_k_8x8_ref(blocks: U8, x: npt.ArrayLike) -> F32:
    """y (m, r) = x @ W^T for float32 rows x (m, n), as ggml-cpu's MUL_MAT on a repacked Q4_K weight:
    rows [0, mat_rows(m)) through the 4x8 quantizer and the gemm, the others through quantize_row_q8_K and
    the gemv."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    xq = quantize_q8_k_mat_ref(x)
    k = mat_rows(x.shape[0])
    out = np.empty((x.shape[0], blocks.shape[0]), np.float32)
    if k:
        out[:k] = gemm_q4_k_8x8_ref(blocks, xq[:k])
    if k < x.shape[0]:
        out[k:] = gemv_q4_k_8x8_ref(blocks, xq[k:])
    return out


# ---- the interleaved layout of kquant_repack.repack_q4_k_8x8


def repack_q4_k_8x8_ref(blocks: U8) -> U8:
    """(r, nb * 144) Q4_K rows -> (r / 8, nb * 8 * 144): per group of 8 rows, super-block i of rows 0..7 in turn."""
    r, row_bytes = blocks.shape
    if r % GROUP or row_bytes % Q4K_BYTES:
        raise ValueError(f"Q4_K repack needs rows in multiples of {GROUP} and whole blocks, got {blocks.shape}")
    nb = row_bytes // Q4K_BYTES
    g = np.asarray(blocks, dtype=np.uint8).reshape(r // GROUP, GROUP, nb, Q4K_BYTES).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(g).reshape(r // GROUP, nb * GROUP * Q4K_BYTES)


def unpack_q4_k_8x8_ref(weight: U8) -> U8:
    """The plain Q4_K rows (r, nb * 144) of a repacked weight."""
    ng, nbytes = weight.shape
    nb = nbytes // (GROUP * Q4K_BYTES)
    g = np.asarray(weight).reshape(ng, nb, GROUP, Q4K_BYTES).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(g).reshape(ng * GROUP, nb * Q4K_BYTES)


def q8_kx4_rows_ref(raw: U8, n: int) -> U8:
    """llama.cpp's block_q8_Kx4 runs (k, n / 256 * 1168), four activation rows each, as plain block_q8_K
    rows (4k, n / 256 * 292). block_q8_Kx4 is | d: float32[4] | qs: int8[1024] | bsums: int16[64] |, the
    quants in 8-byte pieces of rows 0..3 in turn, bsum g of row r at (g // 4) * 16 + r * 4 + g % 4."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    k, nb = raw.shape[0], n // QK_K
    b = raw.reshape(k, nb, 1168)
    d = np.ascontiguousarray(b[..., :16]).view("<f4")  # (k, nb, 4)
    qs = b[..., 16:1040].reshape(k, nb, 32, 4, 8).transpose(0, 3, 1, 2, 4).reshape(k, 4, nb, QK_K)
    bs = np.ascontiguousarray(b[..., 1040:]).view("<i2").reshape(k, nb, 4, 4, 4).transpose(0, 3, 1, 2, 4)
    out = np.empty((k, 4, nb, Q8K_BLOCK_BYTES), np.uint8)
    out[..., 0:4] = d.transpose(0, 2, 1)[..., None].copy().view(np.uint8)
    out[..., 4 : 4 + QK_K] = qs
    out[..., 4 + QK_K :] = bs.reshape(k, 4, nb, 16).astype("<i2").view(np.uint8)
    return out.reshape(4 * k, nb * Q8K_BLOCK_BYTES)
