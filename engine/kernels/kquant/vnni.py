"""Q4_K (repacked), Q4_K / Q5_K / Q6_K / IQ4_XS (tiled) batches on AVX512-VNNI, with the bits of the plain kernels.

Those kernels form each (weight row, activation) integer with vpmaddubsw / vpmaddwd, one activation at a time.
Here the integers come the way llama.cpp's tiled VNNI microkernel gets them: eight weight rows by sixteen
activations, the activations' Q8_K quants transposed so that one zmm holds four consecutive quants of each
of the 16 (`pack`), and per group of four weights one vpdpbusd per row with that row's four unsigned codes
broadcast: sixteen exact four-product sums at once. Per sub-block the row's scale multiplies the sums
(vpmulld); Q6_K's codes carry +32, taken off through the sub-block's bsums as vpdpbusd's starting value.

The integers are the same, so the float steps give the same bits as before:

  Q4_K, rows in eights (q4_K_8x8 gemm, per pair of sub-blocks p): acc = fma(float(isum_p), fp16(d) * d8, acc),
      accm = fma(float(imin_p), fp16(dmin) * d8, accm), out = acc - accm (the last m % 4 rows: kquant_repack's
      gemv numerics, as forward_mul_mat splits them)
  Q6_K (tiled, per super-block): acc = fma(float(isum) * fp16(d), d8, acc)
  Q4_K / Q5_K (tiled, rows not repacked): acc = fma(fma(-fp16(dmin), float(imin), float(isum) * fp16(d)), d8, acc)
  IQ4_XS (tiled): as Q6_K, the codes kvalues_iq4nl + 128 and the 128 taken off through the 32-quant sums

Each band of eight weight rows is decoded once per product into a scratch of codes and scales (`_decode_*`),
then meets every tile of 16 activations; a short last tile is padded with zero activations.

  gemm_q4_k_8x8_vnni(weight, xq, out)   as kquant_repack.gemm_q4_k_8x8
  gemm_tiled_q{4,5,6}_k_vnni(blocks, xq, out)  as kquant_tiled.gemm_tiled_q{4,5,6}_k
  gemm_tiled_iq4_xs_vnni(blocks, xq, out)     as iquant_tiled.gemm_tiled for IQ4_XS
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.quant.iquant_grids import kvalues_iq4nl

from engine.kernels.activations import f16_to_f32
from engine.kernels.kquant.band import BAND, decode_q4_k_group, pack
from engine.kernels.kquant.dot import _splat
from engine.kernels.kquant.repack import GROUP_BYTES, _i64, gemv_q4_k_8x8
from engine.kernels.kquant.repack_ref import GROUP, MAT_ROWS
from engine.kernels.simd import F32, I32, I64, byte_ptr, call_intrinsic, load, splat_const, vec

u64 = np.uint64
_IQ4 = (kvalues_iq4nl().astype(np.int32) + 128).astype(np.uint8)  # the IQ4_XS codes
TILE = 16  # activations per zmm lane set
I32X16 = vec(I32, 16)
F32X16 = vec(F32, 16)
ACT_BYTES = 64 * 64  # one super-block of a tile's transposed quants: 64 groups x 16 activations x 4 bytes
# kind -> (sub-blocks per super-block, code bias taken off through bsums)
# ("q4_k": the repacked gemm's numbers; "q4_kt" / "q5_kt": the tiled path's, one step per super-block)
# ("iq4_xs": codes kvalues_iq4nl + 128, the 128 taken off through the 32-quant sums; Q6_K's float step)
# ("q4_kv": the repacked gemv's numbers, one step per super-block, for MUL_MAT_ID's rows of one expert)
_KIND = {"q4_k": (8, 0), "q6_k": (16, 32), "q4_kt": (8, 0), "q5_kt": (8, 0), "iq4_xs": (8, 128), "q4_kv": (8, 0)}


def _splat_i32(b, v):
    u = b.insert_element(ir.Constant(I32X16, None), v, ir.Constant(I32, 0))
    return b.shuffle_vector(u, u, ir.Constant(I32X16, [ir.Constant(I32, 0)] * 16))


def _fma(b, x, y, z):
    return call_intrinsic(b, "llvm.fma.v16f32", F32X16, [x, y, z])


def _band_tile(kind, b, nb, pc0, crs, ps0, srs, pm0, pd0, drs, px0, pb0, pe0, m, rows, po, os) -> None:
    """Eight decoded weight rows (codes pc0 + r * crs, scales ps0 + r * srs, mins pm0 + r * srs, d / dmin
    pd0 + r * drs; per super-block 256 codes, 16 int32 scales, 8 int32 mins, 2 floats) against one tile of
    TILE activations (transposed quants px0, bsums pb0: per super-block 16 x TILE int32 of the 16-quant sums,
    then 8 x TILE of the 32-quant sums; d8 pe0: per super-block TILE floats). out (a, r) at po + a * os + 4r."""
    n_sub, bias = _KIND[kind]
    width = 256 // n_sub // 4  # groups of four weights per sub-block
    acc = [cgutils.alloca_once_value(b, ir.Constant(F32X16, None)) for _ in range(BAND)]
    accm = [cgutils.alloca_once_value(b, ir.Constant(F32X16, None)) for _ in range(BAND)] if kind in ("q4_k", "q4_kv") else None
    zero = ir.Constant(I32X16, None)
    with cgutils.for_range(b, nb) as loop:
        i = loop.index
        pc = [b.gep(pc0, [b.add(b.mul(ir.Constant(I64, r), crs), b.mul(i, ir.Constant(I64, 256)))]) for r in range(BAND)]
        ps = [b.gep(ps0, [b.add(b.mul(ir.Constant(I64, r), srs), b.mul(i, ir.Constant(I64, 64)))]) for r in range(BAND)]
        pm = [b.gep(pm0, [b.add(b.mul(ir.Constant(I64, r), srs), b.mul(i, ir.Constant(I64, 64)))]) for r in range(BAND)]
        pd = [b.gep(pd0, [b.add(b.mul(ir.Constant(I64, r), drs), b.mul(i, ir.Constant(I64, 8)))]) for r in range(BAND)]
        px = b.gep(px0, [b.mul(i, ir.Constant(I64, ACT_BYTES))])
        pb = b.gep(pb0, [b.mul(i, ir.Constant(I64, 24 * TILE * 4))])
        d8 = load(b, b.gep(pe0, [b.mul(i, ir.Constant(I64, TILE * 4))]), F32X16)
        # two sub-blocks a step, the steps a loop (an unrolled super-block compiles for many seconds); Q6_K and
        # the tiled Q4_K / Q5_K sum the super-block's integers across the steps in s1
        s1 = [cgutils.alloca_once_value(b, zero) for _ in range(BAND)]
        for r in range(BAND):
            b.store(zero, s1[r])
        with cgutils.for_range(b, ir.Constant(I64, n_sub // 2)) as step:
            j = step.index
            pc_j = [b.gep(pc[r], [b.mul(j, ir.Constant(I64, 8 * width))]) for r in range(BAND)]
            ps_j = [b.gep(ps[r], [b.mul(j, ir.Constant(I64, 8))]) for r in range(BAND)]
            px_j = b.gep(px, [b.mul(j, ir.Constant(I64, 128 * width))])
            pb_j = b.gep(pb, [b.mul(j, ir.Constant(I64, 128))])
            pair = [zero] * BAND
            for h in range(2):
                sums_at = 64 * (16 + h) if width == 8 else 64 * h  # the 32-quant sums, or the 16-quant bsums
                start = b.mul(load(b, pb_j, I32X16, sums_at), splat_const(I32, -bias, 16)) if bias else zero
                raw = [start] * BAND
                for gg in range(h * width, (h + 1) * width):
                    a = load(b, px_j, I32X16, 64 * gg)
                    for r in range(BAND):
                        w = _splat_i32(b, load(b, pc_j[r], I32, 4 * gg))
                        raw[r] = call_intrinsic(b, "llvm.x86.avx512.vpdpbusd.512", I32X16, [raw[r], w, a])
                for r in range(BAND):
                    pair[r] = b.add(pair[r], b.mul(raw[r], _splat_i32(b, load(b, ps_j[r], I32, 4 * h))))
            if kind == "q4_k":  # the end of a pair of sub-blocks: one float step for the sums and mins
                pm_j = [b.gep(pm[r], [b.mul(j, ir.Constant(I64, 8))]) for r in range(BAND)]
                b32 = [load(b, pb_j, I32X16, 64 * (16 + h)) for h in (0, 1)]
                for r in range(BAND):
                    d = _splat(b, load(b, pd[r], F32, 0), 16)
                    dmin = _splat(b, load(b, pd[r], F32, 4), 16)
                    b.store(_fma(b, b.sitofp(pair[r], F32X16), b.fmul(d, d8), b.load(acc[r])), acc[r])
                    imin = b.add(b.mul(_splat_i32(b, load(b, pm_j[r], I32, 0)), b32[0]),
                                 b.mul(_splat_i32(b, load(b, pm_j[r], I32, 4)), b32[1]))
                    b.store(_fma(b, b.sitofp(imin, F32X16), b.fmul(dmin, d8), b.load(accm[r])), accm[r])
            else:
                for r in range(BAND):
                    b.store(b.add(b.load(s1[r]), pair[r]), s1[r])
        s1 = [b.load(v) for v in s1]
        if kind in ("q6_k", "iq4_xs"):  # res = float(isum) * fp16(d); acc = fma(res, d8, acc)
            for r in range(BAND):
                res = b.fmul(b.sitofp(s1[r], F32X16), _splat(b, load(b, pd[r], F32, 0), 16))
                b.store(_fma(b, res, d8, b.load(acc[r])), acc[r])
        elif kind != "q4_k":  # tiled Q4_K / Q5_K: res = fma(-fp16(dmin), float(imin), float(isum) * fp16(d))
            b32 = [load(b, pb, I32X16, 64 * (16 + j)) for j in range(8)]
            for r in range(BAND):
                imin = zero
                for j in range(8):
                    imin = b.add(imin, b.mul(_splat_i32(b, load(b, pm[r], I32, 4 * j)), b32[j]))
                if kind == "q4_kv":  # the gemv: acc = fma(float(isum), d * d8, acc), the same for the mins
                    d = _splat(b, load(b, pd[r], F32, 0), 16)
                    dmin = _splat(b, load(b, pd[r], F32, 4), 16)
                    b.store(_fma(b, b.sitofp(s1[r], F32X16), b.fmul(d, d8), b.load(acc[r])), acc[r])
                    b.store(_fma(b, b.sitofp(imin, F32X16), b.fmul(dmin, d8), b.load(accm[r])), accm[r])
                    continue
                res = b.fmul(b.sitofp(s1[r], F32X16), _splat(b, load(b, pd[r], F32, 0), 16))
                res = _fma(b, b.fneg(_splat(b, load(b, pd[r], F32, 4), 16)), b.sitofp(imin, F32X16), res)
                b.store(_fma(b, res, d8, b.load(acc[r])), acc[r])
    for r in range(BAND):
        with b.if_then(b.icmp_signed(">", rows, ir.Constant(I64, r)), likely=True):
            total = b.load(acc[r]) if accm is None else b.fsub(b.load(acc[r]), b.load(accm[r]))
            for a in range(TILE):
                with b.if_then(b.icmp_signed(">", m, ir.Constant(I64, a)), likely=True):
                    dst = b.gep(po, [b.add(b.mul(ir.Constant(I64, a), os), ir.Constant(I64, 4 * r))])
                    b.store(b.extract_element(total, ir.Constant(I32, a)), b.bitcast(dst, F32.as_pointer()), align=4)


def _make(kind: str):
    def typer(typingctx, nb, codes, crs, sc, mn, srs, dd, drs, xt, xo, bs, bo, d8, eo, m, rows, out, oo, os):
        def codegen(context, builder, sig, args):
            nb_, c_, crs_, sc_, mn_, srs_, dd_, drs_, xt_, xo_, bs_, bo_, d8_, eo_, m_, rows_, out_, oo_, os_ = args
            zero = ir.Constant(I64, 0)
            ptr = lambda k, v, off=zero: byte_ptr(context, builder, sig.args[k], v, off)  # noqa: E731
            i = lambda v: _i64(builder, v)  # noqa: E731
            _band_tile(kind, builder, i(nb_), ptr(1, c_), i(crs_), ptr(3, sc_), i(srs_), ptr(4, mn_), ptr(6, dd_),
                       i(drs_), ptr(8, xt_, xo_), ptr(10, bs_, bo_), ptr(12, d8_, eo_), i(m_), i(rows_),
                       ptr(16, out_, oo_), i(os_))
            return context.get_dummy_value()

        return types.void(nb, codes, crs, sc, mn, srs, dd, drs, xt, xo, bs, bo, d8, eo, m, rows, out, oo, os), codegen

    typer.__name__ = f"vnni_band_{kind}"
    return intrinsic(typer)


_band_q4_k = _make("q4_k")
_band_q6_k = _make("q6_k")
_band_q4_kt = _make("q4_kt")
_band_q5_kt = _make("q5_kt")
_band_iq4_xs = _make("iq4_xs")
_band_q4_kv = _make("q4_kv")


@njit(cache=True, error_model="numpy", inline="always")
def _decode_q4_k(blk, codes, sc, mn, dd):
    """One 144-byte Q4_K block: 256 codes (0..15), 8 scales and 8 mins (get_scale_min_k4), d and dmin."""
    _decode_q4_k_scales(blk, sc, mn, dd)
    for p in range(4):
        for e in range(32):
            v = blk[16 + 32 * p + e]
            codes[64 * p + e] = v & 15
            codes[64 * p + 32 + e] = v >> 4


@njit(cache=True, error_model="numpy", inline="always")
def _decode_q4_k_scales(blk, sc, mn, dd):
    """d, dmin and the 8 six-bit scales and mins of a Q4_K / Q5_K block (get_scale_min_k4)."""
    dd[0] = f16_to_f32(np.uint16(blk[0]) | (np.uint16(blk[1]) << np.uint16(8)))
    dd[1] = f16_to_f32(np.uint16(blk[2]) | (np.uint16(blk[3]) << np.uint16(8)))
    q = blk[4:16]
    for j in range(8):
        if j < 4:
            sc[j] = q[j] & 63
            mn[j] = q[j + 4] & 63
        else:
            sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)
            mn[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


@njit(cache=True, error_model="numpy", inline="always")
def _decode_q5_k(blk, codes, sc, mn, dd):
    """One 176-byte Q5_K block: Q4_K's scales, mins, d and dmin, and bit s of qh as the fifth bit of sub-block s."""
    _decode_q4_k_scales(blk, sc, mn, dd)
    for p in range(4):
        for e in range(32):
            v, h = blk[48 + 32 * p + e], blk[16 + e]
            codes[64 * p + e] = (v & 15) | (((h >> (2 * p)) & 1) << 4)
            codes[64 * p + 32 + e] = (v >> 4) | (((h >> (2 * p + 1)) & 1) << 4)


@njit(cache=True, error_model="numpy", inline="always")
def _decode_q6_k(blk, codes, sc, dd):
    """One 210-byte Q6_K block: 256 codes (0..63, the weight + 32), 16 int8 scales, d."""
    dd[0] = f16_to_f32(np.uint16(blk[208]) | (np.uint16(blk[209]) << np.uint16(8)))
    for s in range(16):
        sc[s] = (np.int32(blk[192 + s]) ^ 128) - 128
    for n in range(2):
        for e in range(32):
            lo0, lo1, h = blk[64 * n + e], blk[64 * n + 32 + e], blk[128 + 32 * n + e]
            w = 128 * n + e
            codes[w] = (lo0 & 15) | ((h & 3) << 4)
            codes[w + 32] = (lo1 & 15) | (((h >> 2) & 3) << 4)
            codes[w + 64] = (lo0 >> 4) | (((h >> 4) & 3) << 4)
            codes[w + 96] = (lo1 >> 4) | (((h >> 6) & 3) << 4)


def gemm_q4_k_8x8_vnni(weight, xq, out):
    """out[a, r] for Q8_K rows xq (m, nb * 292) from quantize_q8_k_mat and a repack_q4_k_8x8 weight: rows
    a < m - m % 4 as ggml_gemm_q4_K_8x8_q8_K (the band kernel), the others as ggml_gemv_q4_K_8x8_q8_K
    (kquant_repack's gemv, which a decode step compiles anyway: one kernel less to compile here)."""
    m = xq.shape[0]
    k = m - m % MAT_ROWS
    if k:
        _gemm_q4_k_rows(weight, xq[:k], out[:k])
    for a in range(k, m):
        gemv_q4_k_8x8(weight, xq[a], out[a])
    return out


@njit(cache=True, parallel=True, error_model="numpy")
def _gemm_q4_k_rows(weight, xq, out):
    """out[a, r] = ggml_gemm_q4_K_8x8_q8_K for every row of xq (their count a multiple of 4)."""
    nb = weight.shape[1] // GROUP_BYTES
    k = xq.shape[0]
    xt, bs, d8 = pack(xq, nb, k, TILE)
    os = u64(out.strides[0])
    for g in prange(weight.shape[0]):
        codes, sc, mn, dd = _scratch(nb)
        decode_q4_k_group(weight, u64(g) * u64(weight.strides[0]), nb, codes, sc, mn, dd)
        for t in range(xt.shape[0]):
            _band_q4_k(nb, codes, u64(codes.strides[0]), sc, mn, u64(sc.strides[0]), dd, u64(dd.strides[0]),
                       xt, u64(t) * u64(xt.strides[0]), bs, u64(t) * u64(bs.strides[0]), d8, u64(t) * u64(d8.strides[0]),
                       min(TILE, k - t * TILE), BAND, out, u64(t * TILE) * os + u64(4 * GROUP * g), os)
    return out


@njit(cache=True, parallel=True, error_model="numpy")
def gemv_rows_q4_k_8x8_vnni(weight, xq, out):
    """out[a] = ggml_gemv_q4_K_8x8_q8_K of each Q8_K row xq[a] (m, nb * 292) from quantize_q8_k, as
    kquant_repack.gemv_rows_q4_k_8x8 (MUL_MAT_ID's rows of one expert): the same bits, sixteen rows a zmm."""
    nb, m = weight.shape[1] // GROUP_BYTES, xq.shape[0]
    if xq.shape[1] != nb * 292 or out.shape[0] != m or out.shape[1] != weight.shape[0] * GROUP:
        raise ValueError("xq must be (m, nb * 292) Q8_K rows and out (m, n_rows) for this weight")
    xt, bs, d8 = pack(xq, nb, m, TILE)
    os = u64(out.strides[0])
    for g in prange(weight.shape[0]):
        codes, sc, mn, dd = _scratch(nb)
        decode_q4_k_group(weight, u64(g) * u64(weight.strides[0]), nb, codes, sc, mn, dd)
        for t in range(xt.shape[0]):
            _band_q4_kv(nb, codes, u64(codes.strides[0]), sc, mn, u64(sc.strides[0]), dd, u64(dd.strides[0]),
                        xt, u64(t) * u64(xt.strides[0]), bs, u64(t) * u64(bs.strides[0]), d8, u64(t) * u64(d8.strides[0]),
                        min(TILE, m - t * TILE), BAND, out, u64(t * TILE) * os + u64(4 * GROUP * g), os)
    return out


@njit(cache=True, error_model="numpy", inline="always")
def _decode_iq4_xs(blk, codes, sc, dd):
    """One 136-byte IQ4_XS block: 256 codes kvalues_iq4nl[nibble] + 128, 8 scales (6 bits) - 32, d."""
    dd[0] = f16_to_f32(np.uint16(blk[0]) | (np.uint16(blk[1]) << np.uint16(8)))
    high = np.int32(blk[2]) | (np.int32(blk[3]) << 8)
    for ib in range(8):
        low = (np.int32(blk[4 + ib // 2]) >> (4 * (ib % 2))) & 15
        sc[ib] = (low | (((high >> (2 * ib)) & 3) << 4)) - 32
        for j in range(16):
            v = blk[8 + 16 * ib + j]
            codes[32 * ib + j] = _IQ4[v & 15]
            codes[32 * ib + 16 + j] = _IQ4[v >> 4]


@njit(cache=True, error_model="numpy", inline="always")
def _scratch(nb):
    """A band's decoded codes, scales, mins and d / dmin."""
    return (np.zeros((BAND, nb, 256), np.uint8), np.zeros((BAND, nb, 16), np.int32), np.zeros((BAND, nb, 16), np.int32),
            np.zeros((BAND, nb, 2), np.float32))


# one driver per type, each compiling its own band kernel only
@njit(cache=True, parallel=True, error_model="numpy")
def gemm_tiled_q6_k_vnni(blocks, xq, out):
    """out (m, n_rows) = tiled Q6_K numerics of blocks (n_rows, nb * 210) with Q8_K rows xq (m, nb * 292)."""
    n, m, nb = blocks.shape[0], xq.shape[0], blocks.shape[1] // 210
    xt, bs, d8 = pack(xq, nb, m, TILE)
    os = u64(out.strides[0])
    for g in prange((n + BAND - 1) // BAND):
        rows = min(BAND, n - g * BAND)
        codes, sc, mn, dd = _scratch(nb)
        for c in range(rows):  # each driver decodes its own type only (less to compile)
            r = g * BAND + c
            for i in range(nb):
                _decode_q6_k(blocks[r, i * 210:(i + 1) * 210], codes[c, i], sc[c, i], dd[c, i])
        for t in range(xt.shape[0]):
            _band_q6_k(nb, codes, u64(codes.strides[0]), sc, mn, u64(sc.strides[0]), dd, u64(dd.strides[0]),
                       xt, u64(t) * u64(xt.strides[0]), bs, u64(t) * u64(bs.strides[0]), d8, u64(t) * u64(d8.strides[0]),
                       min(TILE, m - t * TILE), rows, out, u64(t * TILE) * os + u64(4 * BAND * g), os)
    return out


@njit(cache=True, parallel=True, error_model="numpy")
def gemm_tiled_q4_k_vnni(blocks, xq, out):
    """out (m, n_rows) = tiled Q4_K numerics of plain blocks (n_rows, nb * 144), rows not in eights."""
    n, m, nb = blocks.shape[0], xq.shape[0], blocks.shape[1] // 144
    xt, bs, d8 = pack(xq, nb, m, TILE)
    os = u64(out.strides[0])
    for g in prange((n + BAND - 1) // BAND):
        rows = min(BAND, n - g * BAND)
        codes, sc, mn, dd = _scratch(nb)
        for c in range(rows):  # each driver decodes its own type only (less to compile)
            r = g * BAND + c
            for i in range(nb):
                _decode_q4_k(blocks[r, i * 144:(i + 1) * 144], codes[c, i], sc[c, i], mn[c, i], dd[c, i])
        for t in range(xt.shape[0]):
            _band_q4_kt(nb, codes, u64(codes.strides[0]), sc, mn, u64(sc.strides[0]), dd, u64(dd.strides[0]),
                        xt, u64(t) * u64(xt.strides[0]), bs, u64(t) * u64(bs.strides[0]), d8, u64(t) * u64(d8.strides[0]),
                        min(TILE, m - t * TILE), rows, out, u64(t * TILE) * os + u64(4 * BAND * g), os)
    return out


@njit(cache=True, parallel=True, error_model="numpy")
def gemm_tiled_q5_k_vnni(blocks, xq, out):
    """out (m, n_rows) = tiled Q5_K numerics of blocks (n_rows, nb * 176)."""
    n, m, nb = blocks.shape[0], xq.shape[0], blocks.shape[1] // 176
    xt, bs, d8 = pack(xq, nb, m, TILE)
    os = u64(out.strides[0])
    for g in prange((n + BAND - 1) // BAND):
        rows = min(BAND, n - g * BAND)
        codes, sc, mn, dd = _scratch(nb)
        for c in range(rows):  # each driver decodes its own type only (less to compile)
            r = g * BAND + c
            for i in range(nb):
                _decode_q5_k(blocks[r, i * 176:(i + 1) * 176], codes[c, i], sc[c, i], mn[c, i], dd[c, i])
        for t in range(xt.shape[0]):
            _band_q5_kt(nb, codes, u64(codes.strides[0]), sc, mn, u64(sc.strides[0]), dd, u64(dd.strides[0]),
                        xt, u64(t) * u64(xt.strides[0]), bs, u64(t) * u64(bs.strides[0]), d8, u64(t) * u64(d8.strides[0]),
                        min(TILE, m - t * TILE), rows, out, u64(t * TILE) * os + u64(4 * BAND * g), os)
    return out


@njit(cache=True, parallel=True, error_model="numpy")
def gemm_tiled_iq4_xs_vnni(blocks, xq, out):
    """out (m, n_rows) = tiled IQ4_XS numerics (iquant_tiled's) of blocks (n_rows, nb * 136)."""
    n, m, nb = blocks.shape[0], xq.shape[0], blocks.shape[1] // 136
    xt, bs, d8 = pack(xq, nb, m, TILE)
    os = u64(out.strides[0])
    for g in prange((n + BAND - 1) // BAND):
        rows = min(BAND, n - g * BAND)
        codes, sc, mn, dd = _scratch(nb)
        for c in range(rows):  # each driver decodes its own type only (less to compile)
            r = g * BAND + c
            for i in range(nb):
                _decode_iq4_xs(blocks[r, i * 136:(i + 1) * 136], codes[c, i], sc[c, i], dd[c, i])
        for t in range(xt.shape[0]):
            _band_iq4_xs(nb, codes, u64(codes.strides[0]), sc, mn, u64(sc.strides[0]), dd, u64(dd.strides[0]),
                         xt, u64(t) * u64(xt.strides[0]), bs, u64(t) * u64(bs.strides[0]), d8, u64(t) * u64(d8.strides[0]),
                         min(TILE, m - t * TILE), rows, out, u64(t * TILE) * os + u64(4 * BAND * g), os)
    return out
