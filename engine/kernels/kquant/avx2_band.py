"""Q4_K (repacked) batches on AVX2 without AVX512-VNNI, with the bits of kquant_repack's gemm.

kquant_repack's tile meets one activation at a time: each of the eight weight rows gives an <8 x i32> of
partial sums, and the eight rows' totals are gathered into one vector by a transposing reduction (21
shuffles and adds per pair of sub-blocks, a third of the work on an AVX2 target). Here the activations
are transposed instead, as kquant_vnni does on zmm: one ymm holds four consecutive Q8_K quants of each of
eight activations (`pack`), and a weight row's four codes (0..15) are broadcast against it, so
vpmaddubsw leaves each activation's sums in its own lanes and nothing needs gathering:

  per sub-block and row   raw = sum over its eight groups of four of maddubs(codes, quants)   (<16 x i16>,
                          at most 8 * 2 * 15 * 128 = 30720: no saturation)
                          pair += madd(raw, scale)   (<8 x i32>: the row's six-bit scale times the sums)
  per pair of sub-blocks  acc = fma(float(pair), fp16(d) * d8, acc); accm = fma(float(imin), fp16(dmin) * d8,
                          accm) with imin the row's two mins times the activations' 32-quant sums
  out = acc - accm        ggml_gemm_q4_K_8x8_q8_K's recurrence, as kquant_repack's tile

The integers are exact either way, so the float steps, in the same order, give the same bits.

  gemm_q4_k_8x8_avx2(weight, xq, out)        as kquant_repack.gemm_q4_k_8x8 (its gemv for the last m % 4 rows;
                                             kquant_repack's kernel for fewer than 8 rows)
  gemv_rows_q4_k_8x8_avx2(weight, xq, out)   as kquant_repack.gemv_rows_q4_k_8x8 (a gemv per row, the same bits)
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.kquant.dot import _splat
from engine.kernels.kquant.band import BAND, I32X8, decode_q4_k_group, pack
from engine.kernels.kquant.repack import GROUP_BYTES, _i64, _mat_shape, gemm_q4_k_8x8, gemv_q4_k_8x8
from engine.kernels.kquant.repack_ref import GROUP, MAT_ROWS
from engine.kernels.simd import F32, I8, I16, I32, I64, Ops, byte_ptr, call_intrinsic, load, vec

u64 = np.uint64
TILE = 8  # activations per ymm
F32X8 = vec(F32, 8)
ACT_BYTES = 64 * TILE * 4  # one super-block of a tile's transposed quants: 64 groups x 8 activations x 4 bytes


def _splat_int(b, v, t, n):
    u = b.insert_element(ir.Constant(vec(t, n), None), v, ir.Constant(I32, 0))
    return b.shuffle_vector(u, u, ir.Constant(vec(I32, n), [ir.Constant(I32, 0)] * n))


def _band_tile(context, b, nb, pc0, crs, ps0, srs, pm0, pd0, drs, px0, pb0, pe0, m, po, os, per_pair: bool) -> None:
    """Eight decoded Q4_K rows (codes pc0 + r * crs, scales ps0 + r * srs, mins pm0 + r * srs, d / dmin
    pd0 + r * drs; per super-block 256 codes, 16 int32 scales and mins, 2 floats) against one tile of TILE
    activations (transposed quants px0, sums pb0: per super-block 24 x TILE int32, the 32-quant sums at 16..23;
    d8 pe0: TILE floats a super-block). out (a, r) at po + a * os + 4r for a < m. One float step per pair of
    sub-blocks (per_pair: the gemm's numbers) or per super-block (the gemv's)."""
    ops = Ops(context, b)
    acc = [cgutils.alloca_once_value(b, ir.Constant(F32X8, None)) for _ in range(BAND)]
    accm = [cgutils.alloca_once_value(b, ir.Constant(F32X8, None)) for _ in range(BAND)]
    zero16, zero32 = ir.Constant(vec(I16, 16), None), ir.Constant(I32X8, None)
    isum = [cgutils.alloca_once_value(b, zero32) for _ in range(BAND)]  # the gemv's super-block integers
    imins = [cgutils.alloca_once_value(b, zero32) for _ in range(BAND)]
    fma = lambda x, y, z: call_intrinsic(b, "llvm.fma.v8f32", F32X8, [x, y, z])  # noqa: E731
    with cgutils.for_range(b, nb) as loop:
        i = loop.index
        pc = [b.gep(pc0, [b.add(b.mul(ir.Constant(I64, r), crs), b.mul(i, ir.Constant(I64, 256)))]) for r in range(BAND)]
        ps = [b.gep(ps0, [b.add(b.mul(ir.Constant(I64, r), srs), b.mul(i, ir.Constant(I64, 64)))]) for r in range(BAND)]
        pm = [b.gep(pm0, [b.add(b.mul(ir.Constant(I64, r), srs), b.mul(i, ir.Constant(I64, 64)))]) for r in range(BAND)]
        pd = [b.gep(pd0, [b.add(b.mul(ir.Constant(I64, r), drs), b.mul(i, ir.Constant(I64, 8)))]) for r in range(BAND)]
        px = b.gep(px0, [b.mul(i, ir.Constant(I64, ACT_BYTES))])
        pb = b.gep(pb0, [b.mul(i, ir.Constant(I64, 24 * TILE * 4))])
        d8 = load(b, b.gep(pe0, [b.mul(i, ir.Constant(I64, TILE * 4))]), F32X8)
        scale = [b.fmul(_splat(b, load(b, pd[r], F32, 0), 8), d8) for r in range(BAND)]  # _mm256_mul_ps(d, d8)
        scale_min = [b.fmul(_splat(b, load(b, pd[r], F32, 4), 8), d8) for r in range(BAND)]
        if not per_pair:
            for r in range(BAND):
                b.store(zero32, isum[r])
                b.store(zero32, imins[r])
        with cgutils.for_range(b, ir.Constant(I64, 4)) as step:  # a pair of sub-blocks a step
            j = step.index
            pc_j = [b.gep(pc[r], [b.mul(j, ir.Constant(I64, 64))]) for r in range(BAND)]
            px_j = b.gep(px, [b.mul(j, ir.Constant(I64, 16 * TILE * 4))])
            pair = [zero32] * BAND
            for h in range(2):
                raw = [zero16] * BAND
                for gg in range(8 * h, 8 * h + 8):
                    a = load(b, px_j, vec(I8, 32), TILE * 4 * gg)
                    for r in range(BAND):
                        w = b.bitcast(_splat_int(b, load(b, pc_j[r], I32, 4 * gg), I32, 8), vec(I8, 32))
                        raw[r] = b.add(raw[r], ops.maddubs(w, a))
                for r in range(BAND):
                    s = load(b, b.gep(ps[r], [b.mul(j, ir.Constant(I64, 8))]), I32, 4 * h)
                    pair[r] = b.add(pair[r], ops.madd(raw[r], _splat_int(b, b.trunc(s, I16), I16, 16)))
            b32 = [load(b, b.gep(pb, [b.mul(j, ir.Constant(I64, 2 * TILE * 4))]), I32X8, (16 * TILE + h * TILE) * 4)
                   for h in (0, 1)]
            for r in range(BAND):
                pm_j = b.gep(pm[r], [b.mul(j, ir.Constant(I64, 8))])
                imin = b.add(b.mul(_splat_int(b, load(b, pm_j, I32, 0), I32, 8), b32[0]),
                             b.mul(_splat_int(b, load(b, pm_j, I32, 4), I32, 8), b32[1]))
                if per_pair:
                    b.store(fma(b.sitofp(pair[r], F32X8), scale[r], b.load(acc[r])), acc[r])
                    b.store(fma(b.sitofp(imin, F32X8), scale_min[r], b.load(accm[r])), accm[r])
                else:
                    b.store(b.add(b.load(isum[r]), pair[r]), isum[r])
                    b.store(b.add(b.load(imins[r]), imin), imins[r])
        if not per_pair:
            for r in range(BAND):
                b.store(fma(b.sitofp(b.load(isum[r]), F32X8), scale[r], b.load(acc[r])), acc[r])
                b.store(fma(b.sitofp(b.load(imins[r]), F32X8), scale_min[r], b.load(accm[r])), accm[r])
    for r in range(BAND):
        total = b.fsub(b.load(acc[r]), b.load(accm[r]))
        for a in range(TILE):
            with b.if_then(b.icmp_signed(">", m, ir.Constant(I64, a)), likely=True):
                dst = b.gep(po, [b.add(b.mul(ir.Constant(I64, a), os), ir.Constant(I64, 4 * r))])
                b.store(b.extract_element(total, ir.Constant(I32, a)), b.bitcast(dst, F32.as_pointer()), align=4)


def _make(per_pair: bool):
    def typer(typingctx, nb, codes, crs, sc, mn, srs, dd, drs, xt, xo, bs, bo, d8, eo, m, out, oo, os):
        def codegen(context, builder, sig, args):
            nb_, c_, crs_, sc_, mn_, srs_, dd_, drs_, xt_, xo_, bs_, bo_, d8_, eo_, m_, out_, oo_, os_ = args
            zero = ir.Constant(I64, 0)
            ptr = lambda k, v, off=zero: byte_ptr(context, builder, sig.args[k], v, off)  # noqa: E731
            i = lambda v: _i64(builder, v)  # noqa: E731
            _band_tile(context, builder, i(nb_), ptr(1, c_), i(crs_), ptr(3, sc_), i(srs_), ptr(4, mn_), ptr(6, dd_),
                       i(drs_), ptr(8, xt_, xo_), ptr(10, bs_, bo_), ptr(12, d8_, eo_), i(m_), ptr(15, out_, oo_), i(os_),
                       per_pair)
            return context.get_dummy_value()

        return types.void(nb, codes, crs, sc, mn, srs, dd, drs, xt, xo, bs, bo, d8, eo, m, out, oo, os), codegen

    typer.__name__ = "avx2_band_q4_k_gemm" if per_pair else "avx2_band_q4_k_gemv"
    return intrinsic(typer)


_band_gemm = _make(True)
_band_gemv = _make(False)


def gemm_q4_k_8x8_avx2(weight, xq, out):
    """out[a, r] for Q8_K rows xq (m, nb * 292) from quantize_q8_k_mat and a repack_q4_k_8x8 weight: rows
    a < m - m % 4 as ggml_gemm_q4_K_8x8_q8_K (the band kernel), the others as its gemv (kquant_repack's)."""
    m = xq.shape[0]
    k = m - m % MAT_ROWS
    if k < TILE:  # a ymm of activations or none: half-empty tiles cost more than the reduction
        return gemm_q4_k_8x8(weight, xq, out)
    _gemm_rows(weight, xq[:k], out[:k])
    for a in range(k, m):
        gemv_q4_k_8x8(weight, xq[a], out[a])
    return out


@njit(cache=True, error_model="numpy", inline="always")
def _group(weight, g, nb):
    """The band scratch of repacked group g, decoded."""
    codes = np.empty((BAND, nb, 256), np.uint8)
    sc = np.empty((BAND, nb, 16), np.int32)
    mn = np.empty((BAND, nb, 16), np.int32)
    dd = np.empty((BAND, nb, 2), np.float32)
    decode_q4_k_group(weight, u64(g) * u64(weight.strides[0]), nb, codes, sc, mn, dd)
    return codes, sc, mn, dd


@njit(cache=True, parallel=True, error_model="numpy")
def _gemm_rows(weight, xq, out):
    """out[a, r] = ggml_gemm_q4_K_8x8_q8_K for every row of xq (their count a multiple of 4)."""
    nb, k = weight.shape[1] // GROUP_BYTES, xq.shape[0]
    xt, bs, d8 = pack(xq, nb, k, TILE)
    os = u64(out.strides[0])
    for g in prange(weight.shape[0]):
        codes, sc, mn, dd = _group(weight, g, nb)
        for t in range(xt.shape[0]):
            _band_gemm(nb, codes, u64(codes.strides[0]), sc, mn, u64(sc.strides[0]), dd, u64(dd.strides[0]),
                       xt, u64(t) * u64(xt.strides[0]), bs, u64(t) * u64(bs.strides[0]), d8, u64(t) * u64(d8.strides[0]),
                       min(TILE, k - t * TILE), out, u64(t * TILE) * os + u64(4 * GROUP * g), os)
    return out


@njit(cache=True, parallel=True, error_model="numpy")
def gemv_rows_q4_k_8x8_avx2(weight, xq, out):
    """out[a] = ggml_gemv_q4_K_8x8_q8_K of each Q8_K row xq[a] (m, nb * 292) from quantize_q8_k, as
    kquant_repack.gemv_rows_q4_k_8x8 (MUL_MAT_ID's rows of one expert): the same bits, eight rows a ymm."""
    nb, m = _mat_shape(weight, xq, out)
    xt, bs, d8 = pack(xq, nb, m, TILE)
    os = u64(out.strides[0])
    for g in prange(weight.shape[0]):
        codes, sc, mn, dd = _group(weight, g, nb)
        for t in range(xt.shape[0]):
            _band_gemv(nb, codes, u64(codes.strides[0]), sc, mn, u64(sc.strides[0]), dd, u64(dd.strides[0]),
                       xt, u64(t) * u64(xt.strides[0]), bs, u64(t) * u64(bs.strides[0]), d8, u64(t) * u64(d8.strides[0]),
                       min(TILE, m - t * TILE), out, u64(t * TILE) * os + u64(4 * GROUP * g), os)
    return out
