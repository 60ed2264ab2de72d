"""Compiled Q4_K products with the numerics of llama.cpp's repacked CPU path (q4_K_8x8_q8_K), bit for bit.

ggml-cpu on an AVX2 / AVX-512 CPU repacks every Q4_K weight whose row count is a multiple of 8 and
multiplies it with ggml_gemv_q4_K_8x8_q8_K (activation rows one by one) or ggml_gemm_q4_K_8x8_q8_K (rows
four at a time); kquant_repack_ref.py states what those compute and which rows go where. Each output is
one float recurrence over exact integers, so only those integers and the order of the fused
multiply-adds matter:

  gemv (one step per super-block)       acc = fma(float(isum), fp16(d) * d8, acc), the same for the mins
  gemm (one step per pair of sub-blocks)   four such steps per super-block
  out = acc - acc_min

The kernels here keep eight weight rows in the SIMD lanes, like block_q4_Kx8: the integer products of
each row are those of kquant_lanes.py (vpmaddubsw / vpmaddwd), the eight rows' sums are gathered into
one <8 x i32> by a transposing reduction, and the float steps run on <8 x float>, one lane per row.

  repack_q4_k_8x8(blocks)            (r, nb * 144) Q4_K rows, r % 8 == 0 -> (r / 8, nb * 1152): per group of
                                     eight rows, super-block i of rows 0..7 in turn (the 144-byte blocks
                                     themselves unchanged; llama.cpp's block_q4_Kx8 shuffles inside them)
  quantize_q8_k_mat(x)               (m, n) float32 -> (m, n / 256 * 292) block_q8_K bytes as forward_mul_mat
                                     makes them: ggml_quantize_mat_q8_K_4x8's values for the first
                                     m - m % 4 rows, quantize_row_q8_K's for the rest
  gemv_q4_k_8x8(weight, xq, out)     one activation (xq: quantize_q8_k bytes, (nb * 292,)) -> out (r,)
  gemm_q4_k_8x8(weight, xq, out)     m activations (xq from quantize_q8_k_mat, (m, nb * 292)) -> out (m, r):
                                     rows [0, m - m % 4) as the gemm, the last m % 4 as the gemv
  matmul_q4_k_8x8(weight, x)         both steps for float32 rows x: llama.cpp's MUL_MAT on this weight

llama.cpp repacks only when ne[1] (the weight's rows) % 8 == 0 (ggml_repack_get_optimal_repack_type, AVX2
or AVX-512 present); repack_q4_k_8x8 refuses other shapes: such a weight stays in the plain CPU buffer,
multiplied by ggml_vec_dot_q4_K_q8_K (kquant_dot.py) for fewer than 8 activation rows and by the tiled
k-quant path (ggml-cpu/tiled) for 8 or more.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.activations import bits_f32, f32_bits
from engine.kernels.kquant.lanes import V32, decode_q4_k
from engine.kernels.kquant.repack_ref import GROUP, MAT_ROWS, Q4K_BYTES, QK_K
from engine.kernels.q8k import Q8K_BLOCK_BYTES, quantize_q8_k
from engine.kernels.simd import (
    F32,
    I16,
    I32,
    I64,
    Ops,
    byte_ptr,
    call_intrinsic,
    half_to_float,
    has_feature,
    load,
    prefetch,
    vec,
)

_INLINE = {"forceinline": True, "error_model": "numpy", "cache": True}
_KERNEL = {"parallel": True, "error_model": "numpy", "cache": True}

U8 = npt.NDArray[np.uint8]
F32A = npt.NDArray[np.float32]
u64 = np.uint64
GROUP_BYTES = GROUP * Q4K_BYTES  # 1152: one super-block of eight rows
# super-blocks ahead that a group's loop prefetches: a one-row product of a large weight, 2 threads, ran at 23 GB/s
# with the hardware prefetcher alone and at 28 GB/s (this VM's bandwidth) with it
AHEAD = 4
TILE = 16  # activations whose accumulators live on the stack while a group's blocks are decoded once
_BSUMS = 4 + QK_K


# ---- LLVM IR: eight weight rows against m activations


def _pairs(b, u, v):
    """<8 x i32> u, v -> [u0+u1, u2+u3, u4+u5, u6+u7, v0+v1, v2+v3, v4+v5, v6+v7]."""
    ev = ir.Constant(vec(I32, 8), [ir.Constant(I32, k) for k in range(0, 16, 2)])
    od = ir.Constant(vec(I32, 8), [ir.Constant(I32, k) for k in range(1, 16, 2)])
    return b.add(b.shuffle_vector(u, v, ev), b.shuffle_vector(u, v, od))


def _row_sums(b, vs):
    """Eight <8 x i32> (one per weight row) -> one <8 x i32>: lane c = the sum of vs[c]'s lanes."""
    p = [_pairs(b, vs[k], vs[k + 1]) for k in range(0, 8, 2)]
    q = [_pairs(b, p[0], p[1]), _pairs(b, p[2], p[3])]
    return _pairs(b, q[0], q[1])


def _shuf(b, u, v, mask):
    return b.shuffle_vector(u, v, ir.Constant(vec(I32, len(mask)), [ir.Constant(I32, k) for k in mask]))


def _transpose_mins(b, ms):
    """Eight <4 x i32> (row c: its four sub-block-pair min terms) -> four <8 x i32> (pair p: rows 0..7)."""
    s = [_shuf(b, ms[k], ms[k + 1], [0, 4, 1, 5, 2, 6, 3, 7]) for k in range(0, 8, 2)]  # pair-major, 2 rows
    lo = [_shuf(b, s[k], s[k + 1], [0, 1, 8, 9, 2, 3, 10, 11]) for k in (0, 2)]  # pairs 0, 1 of 4 rows
    hi = [_shuf(b, s[k], s[k + 1], [4, 5, 12, 13, 6, 7, 14, 15]) for k in (0, 2)]  # pairs 2, 3
    first, second = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    return [_shuf(b, lo[0], lo[1], first), _shuf(b, lo[0], lo[1], second),
            _shuf(b, hi[0], hi[1], first), _shuf(b, hi[0], hi[1], second)]


def _halves8(context, b, pws, at: int):
    """<8 x float>: the fp16 at byte `at` of each of the eight blocks."""
    if has_feature(context, "f16c"):
        v = ir.Constant(vec(I16, 8), None)
        for c, pw in enumerate(pws):
            v = b.insert_element(v, load(b, pw, I16, at), ir.Constant(I32, c))
        return b.fpext(b.bitcast(v, vec(ir.HalfType(), 8)), vec(F32, 8))
    v = ir.Constant(vec(F32, 8), None)
    for c, pw in enumerate(pws):
        v = b.insert_element(v, half_to_float(context, b, load(b, pw, I16, at)), ir.Constant(I32, c))
    return v


def _splat8(b, x):
    u = b.insert_element(ir.Constant(vec(F32, 8), None), x, ir.Constant(I32, 0))
    return b.shuffle_vector(u, u, ir.Constant(vec(I32, 8), [ir.Constant(I32, 0)] * 8))


def _fma8(b, ints, scale, acc):
    return call_intrinsic(b, "llvm.fma.v8f32", vec(F32, 8), [b.sitofp(ints, vec(F32, 8)), scale, acc])


def _group_tile(context, b, pw0, rs, bs, nb, px0, xs, m, po, os, per_pair: bool) -> None:
    """Eight weight rows (row c, super-block i at pw0 + c * rs + i * bs) against m <= TILE block_q8_K rows
    (activation a at px0 + a * xs); the eight results of activation a are stored at po + a * os."""
    ops = Ops(context, b)
    acc = cgutils.alloca_once(b, vec(F32, 8), size=TILE)
    accm = cgutils.alloca_once(b, vec(F32, 8), size=TILE)
    zero8 = ir.Constant(vec(F32, 8), None)
    with cgutils.for_range(b, m) as act:
        b.store(zero8, b.gep(acc, [act.index]))
        b.store(zero8, b.gep(accm, [act.index]))
    with cgutils.for_range(b, nb) as loop:
        base = b.gep(pw0, [b.mul(loop.index, bs)])
        pws = [b.gep(base, [b.mul(ir.Constant(I64, c), rs)]) for c in range(GROUP)]
        for line in range(0, GROUP_BYTES, 64):  # the super-block AHEAD on: a decode step reads at the memory's pace
            prefetch(b, b.gep(base, [b.add(b.mul(bs, ir.Constant(I64, AHEAD)), ir.Constant(I64, line))]))
        blocks = [decode_q4_k(ops, b, pw) for pw in pws]  # decoded once for all m activations
        d8, dmin8 = _halves8(context, b, pws, 0), _halves8(context, b, pws, 2)
        px_i = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, Q8K_BLOCK_BYTES))])
        with cgutils.for_range(b, m) as act:
            px = b.gep(px_i, [b.mul(act.index, xs)])
            yd = _splat8(b, load(b, px, F32))
            scale, scale_min = b.fmul(d8, yd), b.fmul(dmin8, yd)  # _mm256_mul_ps(col_scale, row_scale)
            bsums = load(b, px, vec(I16, 16), _BSUMS)
            prods, mins = [], []
            for blk in blocks:  # the activation's loads are the same for every row: LLVM reads them once
                prods.append([ops.madd(ch.scales, ops.maddubs(ch.plus, load(b, px, V32, ch.x_at)))
                              for ch in blk.chunks])
                mins.append(ops.madd(blk.min_weights, ops.pair_add(bsums)))  # lane p: sub-blocks 2p, 2p + 1
            mins_t = _transpose_mins(b, mins)
            pa, pm = b.gep(acc, [act.index]), b.gep(accm, [act.index])
            a_v, m_v = b.load(pa), b.load(pm)
            if per_pair:  # ggml_gemm_q4_K_8x8_q8_K: one step per pair of sub-blocks (chunks 2p, 2p + 1)
                for p in range(4):
                    isum = _row_sums(b, [b.add(pr[2 * p], pr[2 * p + 1]) for pr in prods])
                    a_v = _fma8(b, isum, scale, a_v)
                    m_v = _fma8(b, mins_t[p], scale_min, m_v)
            else:  # ggml_gemv_q4_K_8x8_q8_K: one step per super-block
                sums = []
                for pr in prods:
                    t = pr[0]
                    for v in pr[1:]:
                        t = b.add(t, v)
                    sums.append(t)
                imin = b.add(b.add(mins_t[0], mins_t[1]), b.add(mins_t[2], mins_t[3]))
                a_v = _fma8(b, _row_sums(b, sums), scale, a_v)
                m_v = _fma8(b, imin, scale_min, m_v)
            b.store(a_v, pa)
            b.store(m_v, pm)
    with cgutils.for_range(b, m) as act:
        out = b.fsub(b.load(b.gep(acc, [act.index])), b.load(b.gep(accm, [act.index])))
        dst = b.gep(po, [b.mul(act.index, os)])
        b.store(out, b.bitcast(dst, vec(F32, 8).as_pointer()), align=4)


def _i64(b, v):
    return v if v.type == I64 else b.sext(v, I64)


def _tile_intrinsic(per_pair: bool):
    def typer(typingctx, w, wo, rs, bs, nb, x, xo, xs, m, out, oo, os):
        ints = (wo, rs, bs, nb, xo, xs, m, oo, os)
        ok = (isinstance(w, types.Array) and w.dtype == types.uint8 and isinstance(x, types.Array)
              and x.dtype == types.uint8 and isinstance(out, types.Array) and out.dtype == types.float32
              and all(isinstance(v, types.Integer) for v in ints))
        if not ok:
            return None

        def codegen(context, builder, signature, args):
            w_, wo_, rs_, bs_, nb_, x_, xo_, xs_, m_, out_, oo_, os_ = args
            pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
            px = byte_ptr(context, builder, signature.args[5], x_, xo_)
            po = byte_ptr(context, builder, signature.args[9], out_, oo_)
            i = lambda v: _i64(builder, v)
            _group_tile(context, builder, pw, i(rs_), i(bs_), i(nb_), px, i(xs_), i(m_), po, i(os_), per_pair)
            return context.get_dummy_value()

        return types.void(w, wo, rs, bs, nb, x, xo, xs, m, out, oo, os), codegen

    typer.__name__ = "tile_q4_k_8x8_gemm" if per_pair else "tile_q4_k_8x8_gemv"
    return intrinsic(typer)


_tile_gemv = _tile_intrinsic(False)
_tile_gemm = _tile_intrinsic(True)


# ---- drivers


@njit(**_INLINE)
def _blocks(weight):
    if weight.ndim != 2 or (weight.size and weight.strides[1] != 1) or weight.shape[1] % GROUP_BYTES:
        raise ValueError("weight must be a repack_q4_k_8x8 array: (n_rows / 8, nb * 1152) uint8, contiguous rows")
    return weight.shape[1] // GROUP_BYTES


@njit(**_INLINE)
def _mat_shape(weight, xq, out):
    """(blocks per row, activation rows) of a batch product's arguments, checked."""
    nb = _blocks(weight)
    if xq.ndim != 2 or (xq.size and xq.strides[1] != 1) or xq.shape[1] != nb * Q8K_BLOCK_BYTES:
        raise ValueError("xq must be (m, bytes) Q8_K rows as long as the weight rows")
    m = xq.shape[0]
    if out.ndim != 2 or out.shape[0] != m or out.shape[1] != weight.shape[0] * GROUP or (out.size and out.strides[1] != 4):
        raise ValueError("out must be (m, n_rows) float32 with contiguous rows")
    return nb, m


@njit(**_KERNEL)
def gemv_q4_k_8x8(weight, xq, out):
    """out[r] = ggml_gemv_q4_K_8x8_q8_K of weight row r with one Q8_K row xq (nb * 292,) (quantize_q8_k)."""
    nb = _blocks(weight)
    if xq.ndim != 1 or (xq.size and xq.strides[0] != 1) or xq.shape[0] != nb * Q8K_BLOCK_BYTES:
        raise ValueError("xq must be the contiguous Q8_K bytes of one row as long as the weight rows")
    if out.ndim != 1 or out.shape[0] != weight.shape[0] * GROUP or (out.size and out.strides[0] != 4):
        raise ValueError("out must be (n_rows,) contiguous float32")
    gs = u64(weight.strides[0])
    for g in prange(weight.shape[0]):
        _tile_gemv(weight, u64(g) * gs, Q4K_BYTES, GROUP_BYTES, nb, xq, u64(0), 0, 1, out, u64(32 * g), 0)
    return out


@njit(**_KERNEL)
def gemv_rows_q4_k_8x8(weight, xq, out):
    """out[a] = gemv_q4_k_8x8 of each Q8_K row xq[a] (m, nb * 292) from quantize_q8_k: what forward_mul_mat_id
    computes for the rows routed to one expert (a gemv per row, the same bits), each weight group read once for
    all m rows."""
    nb, m = _mat_shape(weight, xq, out)
    gs, xs, os = u64(weight.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    for g in prange(weight.shape[0]):
        for a0 in range(0, m, TILE):  # a tile holds at most TILE activation rows
            _tile_gemv(weight, u64(g) * gs, Q4K_BYTES, GROUP_BYTES, nb, xq, u64(a0) * xs, xs, min(TILE, m - a0),
                       out, u64(a0) * os + u64(32 * g), os)
    return out


@njit(**_KERNEL)
def gemv_experts_q4_k_8x8(weights, xq, rows, out):
    """out[i] = gemv_q4_k_8x8 of weights[i] (a tuple of same-shaped repacked experts) with the Q8_K row
    xq[rows[i]]: a decode step's routed experts in one parallel region instead of one each (the same bits)."""
    k = len(weights)
    w0 = weights[0]
    nb = _blocks(w0)
    ng = w0.shape[0]
    if xq.ndim != 2 or xq.shape[1] != nb * Q8K_BLOCK_BYTES or (xq.size and xq.strides[1] != 1):
        raise ValueError("xq must be (m, bytes) Q8_K rows as long as the weight rows")
    if out.ndim != 2 or out.shape[0] != k or out.shape[1] != ng * GROUP or (out.size and out.strides[1] != 4):
        raise ValueError("out must be (experts, n_rows) float32 with contiguous rows")
    for i in range(k):
        if weights[i].shape[0] != ng or weights[i].shape[1] != w0.shape[1] or not 0 <= rows[i] < xq.shape[0]:
            raise ValueError("every expert must have the first one's shape, every row index a row of xq")
    gs, xs, os = u64(w0.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    for task in prange(k * ng):
        e = task // ng
        g = task % ng
        _tile_gemv(weights[e], u64(g) * gs, Q4K_BYTES, GROUP_BYTES, nb, xq, u64(rows[e]) * xs, 0, 1, out,
                   u64(e) * os + u64(32 * g), 0)
    return out


@njit(**_KERNEL)
def gemm_q4_k_8x8(weight, xq, out):
    """out[a, r] for Q8_K rows xq (m, nb * 292) from quantize_q8_k_mat: rows a < m - m % 4 as
    ggml_gemm_q4_K_8x8_q8_K, the others as ggml_gemv_q4_K_8x8_q8_K (forward_mul_mat's split)."""
    nb, m = _mat_shape(weight, xq, out)
    k = m - m % MAT_ROWS
    gs, xs, os = u64(weight.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    for g in prange(weight.shape[0]):
        for a0 in range(0, k, TILE):
            _tile_gemm(weight, u64(g) * gs, Q4K_BYTES, GROUP_BYTES, nb, xq, u64(a0) * xs, xs, min(TILE, k - a0),
                       out, u64(a0) * os + u64(32 * g), os)
        if k < m:
            _tile_gemv(weight, u64(g) * gs, Q4K_BYTES, GROUP_BYTES, nb, xq, u64(k) * xs, xs, m - k,
                       out, u64(k) * os + u64(32 * g), os)
    return out


# ---- activations: the 4x8 quantizer where it differs from quantize_row_q8_K


@njit(**_INLINE)
def _get_f32(row, o):
    return bits_f32(np.uint32(row[o]) | (np.uint32(row[o + 1]) << 8) | (np.uint32(row[o + 2]) << 16)
                    | (np.uint32(row[o + 3]) << 24))


@njit(**_INLINE)
def _quantize_block_4x8(xr, i, row):
    """ggml_quantize_mat_q8_K_4x8 (__AVX2__) of the 256 floats xr[256 i:] into the block_q8_K at row[292 i:]."""
    x0 = QK_K * i
    amax = np.float32(0.0)
    for j in range(QK_K):
        amax = max(amax, abs(xr[x0 + j]))
    positive = False
    for j in range(QK_K):
        positive |= xr[x0 + j] == amax
    iscale = np.float32(0.0)
    if amax != 0:
        iscale = np.float32(-127.0) / amax if positive else np.float32(127.0) / amax
    d = np.float32(1.0) / iscale if amax != 0 else np.float32(0.0)
    o = Q8K_BLOCK_BYTES * i
    bits = f32_bits(d)
    for t in range(4):
        row[o + t] = np.uint8((bits >> np.uint32(8 * t)) & np.uint32(255))
    for g in range(16):
        s = 0
        for j in range(16):
            v = np.float64(np.float32(xr[x0 + 16 * g + j] * iscale))
            r = np.rint(v)
            q = -128 if not (r >= -2147483648.0 and r < 2147483648.0) else min(127, max(-128, int(r)))
            row[o + 4 + 16 * g + j] = np.uint8(q & 255)
            s += q
        row[o + _BSUMS + 2 * g] = np.uint8(s & 255)
        row[o + _BSUMS + 2 * g + 1] = np.uint8((s >> 8) & 255)


@njit(cache=True, error_model="numpy")
def _fix_mat_rows(x, xq, k):
    """Rows [0, k) of xq hold quantize_row_q8_K's bytes of x; redo the blocks where the 4x8 quantizer differs:
    a positive max that follows a negative one of the same magnitude (d > 0 and some quant +127), or a
    scale that overflowed (d == 0 with a nonzero value)."""
    nb = x.shape[1] // QK_K
    for r in range(k):
        xr, row = x[r], xq[r]
        for i in range(nb):
            o = Q8K_BLOCK_BYTES * i
            d = _get_f32(row, o)
            redo = False
            if d > 0:
                n127 = 0
                for j in range(QK_K):
                    n127 += row[o + 4 + j] == 127
                if n127:
                    amax = np.float32(0.0)
                    for j in range(QK_K):
                        amax = max(amax, abs(xr[QK_K * i + j]))
                    for j in range(QK_K):
                        redo |= xr[QK_K * i + j] == amax
            elif d == 0:
                for j in range(QK_K):
                    redo |= xr[QK_K * i + j] != 0
            if redo:
                _quantize_block_4x8(xr, i, row)


def quantize_q8_k_mat(x: npt.ArrayLike) -> U8:
    """The block_q8_K bytes (m, n / 256 * 292) forward_mul_mat multiplies for float32 rows x (m, n): the first
    m - m % 4 rows as ggml_quantize_mat_q8_K_4x8 quantizes them, the rest as quantize_row_q8_K."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"quantize_q8_k_mat expects (m, n) rows, got shape {x.shape}")
    xq = quantize_q8_k(x)
    k = x.shape[0] - x.shape[0] % MAT_ROWS
    if k:
        _fix_mat_rows(x, xq, k)
    return xq


# ---- the weight layout


def repack_q4_k_8x8(blocks: U8) -> U8:
    """Q4_K rows (r, nb * 144), r % 8 == 0, -> (r / 8, nb * 1152): per group of eight rows, super-block i of
    rows 0..7 one after another. A new array; the blocks can be released afterwards.

    Raises ValueError when r % 8 != 0: llama.cpp does not repack such a weight (see the module docstring)."""
    blocks = np.asarray(blocks)
    if blocks.ndim != 2 or blocks.dtype != np.uint8 or blocks.shape[1] % Q4K_BYTES:
        raise ValueError(f"expected (n_rows, row_bytes) uint8 Q4_K rows, got {blocks.dtype} {blocks.shape}")
    r, row_bytes = blocks.shape
    if r % GROUP:
        raise ValueError(f"llama.cpp repacks Q4_K only with rows a multiple of {GROUP}; this weight has {r}")
    nb = row_bytes // Q4K_BYTES
    out = np.empty((r // GROUP, nb * GROUP_BYTES), np.uint8)
    out.reshape(r // GROUP, nb, GROUP, Q4K_BYTES)[:] = blocks.reshape(r // GROUP, GROUP, nb, Q4K_BYTES).transpose(0, 2, 1, 3)
    return out


def unpack_q4_k_8x8(weight: U8, ids: npt.ArrayLike | None = None) -> U8:
    """The plain Q4_K rows (all, or rows `ids`) of a repacked weight, (k, nb * 144)."""
    ng, nbytes = weight.shape
    nb = nbytes // GROUP_BYTES
    g = weight.reshape(ng, nb, GROUP, Q4K_BYTES)
    if ids is None:
        return np.ascontiguousarray(g.transpose(0, 2, 1, 3)).reshape(ng * GROUP, nb * Q4K_BYTES)
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    return np.ascontiguousarray(g[ids // GROUP, :, ids % GROUP]).reshape(len(ids), nb * Q4K_BYTES)


def matmul_q4_k_8x8(weight: U8, x: npt.ArrayLike) -> F32A:
    """y (m, r) = x @ W^T for float32 rows x (m, n) with llama.cpp's numbers for a repacked Q4_K weight."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], weight.shape[0] * GROUP), np.float32)
    if x.shape[0] == 1:
        gemv_q4_k_8x8(weight, quantize_q8_k(x[0]), out[0])
    else:
        gemm_q4_k_8x8(weight, quantize_q8_k_mat(x), out)
    return out
