"""Compiled k-quant products on ggml blocks: gemv / gemm for Q2_K .. Q6_K with Q8_K activations.

Each `_dot_*` intrinsic emits, as LLVM vector IR, one weight row against one Q8_K activation row
the way ggml_vec_dot_q*_K_q8_K does on x86 (ggml-cpu/arch/x86/quants.c, AVX2 branch):

  per super-block: the int32 lanes of kquant_lanes.py, converted to float, and
  acc[L] = fma(d_x * d_y, float(lane[L]), acc[L]) with d_y * fp16(d) rounded first;
  Q2_K adds its min lanes into acc before the quants (acc = fma(-d_y * dmin, ...)),
  Q4_K keeps four min lanes acc_m, Q5_K one scalar summs = fma(-d_y * dmin, sum, summs)
  (GCC contracts ggml's `summs += dmin * sum` to an fma);
  at the end hsum_float_8(acc) (+ the min accumulators).

So every output is bit for bit what llama.cpp's CPU backend computes for that row (see
kquant_ref.py for the same in NumPy). `gemv_*` runs one activation against all rows, threads
over rows; `gemm_*` runs m activations: each weight block is read and decoded once for a tile
of GEMM_TILE activations, whose accumulators live on the stack, and every (row, activation)
result is the one gemv gives. The weights are (n_rows, row_bytes) uint8, typically a
read-only np.memmap view used in place; the activations are Q8_K bytes from q8k.quantize_q8_k.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.kquant.lanes import (
    Decoder,
    decode_q2_k,
    decode_q3_k,
    decode_q4_k,
    decode_q5_k,
    decode_q6_k,
    lanes,
)
from engine.kernels.simd import (
    F32,
    I16,
    I32,
    I64,
    Ops,
    byte_ptr,
    call_intrinsic,
    half_to_float,
    load,
    prefetch,
    shuffle,
    vec,
)

_INLINE = {"forceinline": True, "error_model": "numpy", "cache": True}
AHEAD = 8  # blocks ahead that a one-row product prefetches (from memory: 2 threads, Q6_K 21 -> 30 GB/s)
_KERNEL = {"parallel": True, "error_model": "numpy", "cache": True}

u64 = np.uint64
Q8K_BYTES = 292
_GEMM_ROWS = 16  # rows per parallel task of a gemm
GEMM_TILE = 16  # activations sharing one decode of each weight block (their accumulators live on the stack)


class _Type(NamedTuple):
    """How ggml_vec_dot_<type>_q8_K accumulates: block size, fp16 offsets, the lanes and the min term."""

    type_size: int
    d_at: int
    dmin_at: int | None
    decode: Decoder
    mins: str  # "" none, "fold" into acc (Q2_K), "lanes" acc_m (Q4_K), "scalar" summs (Q5_K)


_TYPES = {
    "q2_k": _Type(84, 80, 82, decode_q2_k, "fold"),
    "q3_k": _Type(110, 108, None, decode_q3_k, ""),
    "q4_k": _Type(144, 0, 2, decode_q4_k, "lanes"),
    "q5_k": _Type(176, 0, 2, decode_q5_k, "scalar"),
    "q6_k": _Type(210, 208, None, decode_q6_k, ""),
}


def _splat(b, v, n: int):
    u = b.insert_element(ir.Constant(vec(F32, n), None), v, ir.Constant(I32, 0))
    return b.shuffle_vector(u, u, ir.Constant(vec(I32, n), [ir.Constant(I32, 0)] * n))


def _fma(b, d, lanes, acc):
    """acc = fma(d, float(lanes), acc) lane by lane: _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(.), acc)."""
    n = lanes.type.count
    return call_intrinsic(b, f"llvm.fma.v{n}f32", vec(F32, n), [_splat(b, d, n), b.sitofp(lanes, vec(F32, n)), acc])


def _hsum4(b, v):
    """_mm_add_ps(v, _mm_movehl_ps(v, v)) then _mm_add_ss with _mm_movehdup_ps: (v0 + v2) + (v1 + v3)."""
    h = b.fadd(shuffle(b, v, [0, 1]), shuffle(b, v, [2, 3]))
    return b.fadd(b.extract_element(h, ir.Constant(I32, 0)), b.extract_element(h, ir.Constant(I32, 1)))


def _hsum8(b, v):
    """hsum_float_8: the high half added to the low, then _hsum4: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))."""
    return _hsum4(b, b.fadd(shuffle(b, v, [4, 5, 6, 7]), shuffle(b, v, [0, 1, 2, 3])))


class _Acc:
    """The float accumulators of one (row, activation) pair: acc, acc_m, summs, as stack slots."""

    def __init__(self, b, n: int):
        self.acc = cgutils.alloca_once(b, vec(F32, 8), size=n)
        self.accm = cgutils.alloca_once(b, vec(F32, 4), size=n)
        self.summs = cgutils.alloca_once(b, F32, size=n)

    def zero(self, b, a) -> None:
        b.store(ir.Constant(vec(F32, 8), None), b.gep(self.acc, [a]))
        b.store(ir.Constant(vec(F32, 4), None), b.gep(self.accm, [a]))
        b.store(ir.Constant(F32, 0.0), b.gep(self.summs, [a]))

    def total(self, b, spec: _Type, a):
        """hsum_float_8(acc) + the min accumulator, as the end of ggml_vec_dot_*_q8_K."""
        total = _hsum8(b, b.load(b.gep(self.acc, [a])))
        if spec.mins == "lanes":
            total = b.fadd(total, _hsum4(b, b.load(b.gep(self.accm, [a]))))
        elif spec.mins == "scalar":
            total = b.fadd(total, b.load(b.gep(self.summs, [a])))
        return total


def _accumulate(spec: _Type, context, b, block, pw, px, acc: _Acc, a) -> None:
    """One super-block of one (row, activation) pair into its accumulators."""
    quants, mins = lanes(Ops(context, b), b, block, px)
    yd = load(b, px, F32)
    acc_p = b.gep(acc.acc, [a])
    total = b.load(acc_p)
    if spec.dmin_at is not None:
        dmin = b.fmul(b.fneg(yd), half_to_float(context, b, load(b, pw, I16, spec.dmin_at)))
        if spec.mins == "fold":
            total = _fma(b, dmin, mins, total)
        elif spec.mins == "lanes":
            p = b.gep(acc.accm, [a])
            b.store(_fma(b, dmin, mins, b.load(p)), p)
        else:  # ggml's `summs += dmin * sum`, contracted to an fma by GCC
            p = b.gep(acc.summs, [a])
            b.store(b.fma(dmin, b.sitofp(mins, F32), b.load(p)), p)
    d = b.fmul(yd, half_to_float(context, b, load(b, pw, I16, spec.d_at)))
    b.store(_fma(b, d, quants, total), acc_p)


def _row_dot(spec: _Type, context, b, pw0, nb, px0):
    """One weight row (nb super-blocks at pw0) against one Q8_K row at px0, as ggml_vec_dot_*_q8_K."""
    acc = _Acc(b, 1)
    zero = ir.Constant(I64, 0)
    acc.zero(b, zero)
    with cgutils.for_range(b, nb) as loop:
        pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, spec.type_size))])
        for line in range(0, spec.type_size, 64):  # the block AHEAD on (a one-row product streams from memory)
            prefetch(b, b.gep(pw, [ir.Constant(I64, AHEAD * spec.type_size + line)]))
        px = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, Q8K_BYTES))])
        _accumulate(spec, context, b, spec.decode(Ops(context, b), b, pw), pw, px, acc, zero)
    return acc.total(b, spec, zero)


def _row_tile(spec: _Type, context, b, pw0, nb, px0, x_stride, m, po, o_stride) -> None:
    """One weight row against m <= GEMM_TILE Q8_K rows (px0 + a * x_stride), each block decoded once."""
    acc = _Acc(b, GEMM_TILE)
    with cgutils.for_range(b, m) as act:
        acc.zero(b, act.index)
    with cgutils.for_range(b, nb) as loop:
        pw = b.gep(pw0, [b.mul(loop.index, ir.Constant(I64, spec.type_size))])
        block = spec.decode(Ops(context, b), b, pw)
        px_i = b.gep(px0, [b.mul(loop.index, ir.Constant(I64, Q8K_BYTES))])
        with cgutils.for_range(b, m) as act:
            px = b.gep(px_i, [b.mul(act.index, x_stride)])
            _accumulate(spec, context, b, block, pw, px, acc, act.index)
    with cgutils.for_range(b, m) as act:
        out = b.bitcast(b.gep(po, [b.mul(act.index, o_stride)]), F32.as_pointer())
        b.store(acc.total(b, spec, act.index), out, align=4)


def _i64(b, v):
    return v if v.type == I64 else b.sext(v, I64)


def _valid(arrays, ints) -> bool:
    return (all(isinstance(a, types.Array) and a.dtype == types.uint8 for a in arrays)
            and all(isinstance(v, types.Integer) for v in ints))


def _row_dot_intrinsic(name: str):
    spec = _TYPES[name]

    def typer(typingctx, w, wo, nb, x, xo):
        if not _valid((w, x), (wo, nb, xo)):
            return None

        def codegen(context, builder, signature, args):
            pw = byte_ptr(context, builder, signature.args[0], args[0], args[1])
            px = byte_ptr(context, builder, signature.args[3], args[3], args[4])
            return _row_dot(spec, context, builder, pw, _i64(builder, args[2]), px)

        return types.float32(w, wo, nb, x, xo), codegen

    typer.__name__ = f"row_dot_{name}"
    typer.__doc__ = f"ggml_vec_dot_{name}_q8_K of the row at byte wo of w with the Q8_K row at byte xo of x."
    return intrinsic(typer)


def _row_tile_intrinsic(name: str):
    spec = _TYPES[name]

    def typer(typingctx, w, wo, nb, x, xo, xs, m, out, oo, os):
        ok = isinstance(out, types.Array) and out.dtype == types.float32
        if not (ok and _valid((w, x), (wo, nb, xo, xs, m, oo, os))):
            return None

        def codegen(context, builder, signature, args):
            w_, wo_, nb_, x_, xo_, xs_, m_, out_, oo_, os_ = args
            pw = byte_ptr(context, builder, signature.args[0], w_, wo_)
            px = byte_ptr(context, builder, signature.args[3], x_, xo_)
            po = byte_ptr(context, builder, signature.args[7], out_, oo_)
            _row_tile(spec, context, builder, pw, _i64(builder, nb_), px, _i64(builder, xs_), _i64(builder, m_),
                      po, _i64(builder, os_))
            return context.get_dummy_value()

        return types.void(w, wo, nb, x, xo, xs, m, out, oo, os), codegen

    typer.__name__ = f"row_tile_{name}"
    typer.__doc__ = (f"ggml_vec_dot_{name}_q8_K of the row at byte wo of w with m Q8_K rows from byte xo of x, "
                     "xs bytes apart; result a at byte oo + a * os of out.")
    return intrinsic(typer)


_dot_q2_k = _row_dot_intrinsic("q2_k")
_dot_q4_k = _row_dot_intrinsic("q4_k")
_dot_q5_k = _row_dot_intrinsic("q5_k")
_dot_q6_k = _row_dot_intrinsic("q6_k")
_tile_q2_k = _row_tile_intrinsic("q2_k")
_tile_q3_k = _row_tile_intrinsic("q3_k")
_tile_q4_k = _row_tile_intrinsic("q4_k")
_tile_q5_k = _row_tile_intrinsic("q5_k")
_tile_q6_k = _row_tile_intrinsic("q6_k")


# ---- argument checks shared by the drivers (static messages: numba raises them as ValueError)


@njit(**_INLINE)
def _blocks_per_row(blocks, type_size):
    if blocks.ndim != 2 or (blocks.size and blocks.strides[1] != 1):
        raise ValueError("weights must be a 2-D uint8 array of rows with contiguous bytes")
    if blocks.shape[1] % type_size:
        raise ValueError("weight row bytes are not a whole number of blocks of this type")
    return blocks.shape[1] // type_size


@njit(**_INLINE)
def _check_gemv(blocks, xq, out, type_size):
    nb = _blocks_per_row(blocks, type_size)
    if xq.ndim != 1 or (xq.size and xq.strides[0] != 1) or xq.shape[0] != nb * 292:
        raise ValueError("xq must be the contiguous Q8_K bytes of one row as long as the weight rows")
    if out.shape[0] != blocks.shape[0]:
        raise ValueError("out must have one float32 per weight row")
    return nb


@njit(**_INLINE)
def _check_gemm(blocks, xq, out, type_size):
    nb = _blocks_per_row(blocks, type_size)
    if xq.ndim != 2 or (xq.size and xq.strides[1] != 1) or xq.shape[1] != nb * 292:
        raise ValueError("xq must be (m, bytes) Q8_K rows as long as the weight rows")
    if out.shape[0] != xq.shape[0] or out.shape[1] != blocks.shape[0] or (out.size and out.strides[1] != 4):
        raise ValueError("out must be (m, n_rows) float32 with contiguous rows")
    return nb


# ---- drivers: one pair per type, spelled out so that numba caches each on its own


@njit(**_KERNEL)
def gemv_q2_k(blocks, xq, out):
    """out[r] = ggml_vec_dot_q2_k_q8_K(row r of the Q2_K blocks, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check_gemv(blocks, xq, out, np.int64(84))
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = _dot_q2_k(blocks, u64(r) * rs, nb, xq, u64(0))
    return out


@njit(**_KERNEL)
def gemv_q4_k(blocks, xq, out):
    """out[r] = ggml_vec_dot_q4_k_q8_K(row r of the Q4_K blocks, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check_gemv(blocks, xq, out, np.int64(144))
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = _dot_q4_k(blocks, u64(r) * rs, nb, xq, u64(0))
    return out


@njit(**_KERNEL)
def gemv_q5_k(blocks, xq, out):
    """out[r] = ggml_vec_dot_q5_k_q8_K(row r of the Q5_K blocks, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check_gemv(blocks, xq, out, np.int64(176))
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = _dot_q5_k(blocks, u64(r) * rs, nb, xq, u64(0))
    return out


@njit(**_KERNEL)
def gemv_q6_k(blocks, xq, out):
    """out[r] = ggml_vec_dot_q6_k_q8_K(row r of the Q6_K blocks, xq): blocks (n_rows, row_bytes), xq (nb * 292,)."""
    nb = _check_gemv(blocks, xq, out, np.int64(210))
    rs = u64(blocks.strides[0])
    for r in prange(blocks.shape[0]):
        out[r] = _dot_q6_k(blocks, u64(r) * rs, nb, xq, u64(0))
    return out


@njit(**_KERNEL)
def gemv_rows_q5_k(blocks, xq, out):
    """out[a] = gemv_q5_k of each Q8_K row xq[a] (m, nb * 292): MUL_MAT_ID's few rows routed to one expert (a vec_dot
    per row and weight row, the same bits), each weight row read once for all m rows."""
    nb = _check_gemm(blocks, xq, out, np.int64(176))
    rs, xs = u64(blocks.strides[0]), u64(xq.strides[0])
    for r in prange(blocks.shape[0]):
        for a in range(xq.shape[0]):
            out[a, r] = _dot_q5_k(blocks, u64(r) * rs, nb, xq, u64(a) * xs)
    return out


@njit(**_KERNEL)
def gemv_rows_q6_k(blocks, xq, out):
    """out[a] = gemv_q6_k of each Q8_K row xq[a] (m, nb * 292), each weight row read once for all m rows (see
    gemv_rows_q5_k)."""
    nb = _check_gemm(blocks, xq, out, np.int64(210))
    rs, xs = u64(blocks.strides[0]), u64(xq.strides[0])
    for r in prange(blocks.shape[0]):
        for a in range(xq.shape[0]):
            out[a, r] = _dot_q6_k(blocks, u64(r) * rs, nb, xq, u64(a) * xs)
    return out


@njit(**_KERNEL)
def gemv_experts_q6_k(weights, xq, rows, out):
    """out[i] = gemv_q6_k of weights[i] (a tuple of same-shaped Q6_K experts) with the Q8_K row xq[rows[i]]: a
    decode step's routed experts in one parallel region instead of one each (the same bits)."""
    k = len(weights)
    nb = _blocks_per_row(weights[0], np.int64(210))
    if xq.ndim != 2 or (xq.size and xq.strides[1] != 1) or xq.shape[1] != nb * 292:
        raise ValueError("xq must be (m, bytes) Q8_K rows as long as the weight rows")
    n = weights[0].shape[0]
    if out.ndim != 2 or out.shape[0] != k or out.shape[1] != n or (out.size and out.strides[1] != 4):
        raise ValueError("out must be (experts, n_rows) float32 with contiguous rows")
    for i in range(k):
        if weights[i].shape[0] != n or weights[i].shape[1] != weights[0].shape[1] or not 0 <= rows[i] < xq.shape[0]:
            raise ValueError("every expert must have the first one's shape, every row index a row of xq")
    xs = u64(xq.strides[0])
    for task in prange(k * n):
        e = task // n
        r = task % n
        w = weights[e]
        out[e, r] = _dot_q6_k(w, u64(r) * u64(w.strides[0]), nb, xq, u64(rows[e]) * xs)
    return out


@njit(**_INLINE)
def _gemm_tasks(n_rows):
    return (n_rows + _GEMM_ROWS - 1) // _GEMM_ROWS


@njit(**_KERNEL)
def gemm_q2_k(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_q2_k_q8_K(row r of the Q2_K blocks, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    nb = _check_gemm(blocks, xq, out, np.int64(84))
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    n, m = blocks.shape[0], xq.shape[0]
    for task in prange(_gemm_tasks(n)):
        for a0 in range(0, m, GEMM_TILE):
            for r in range(task * _GEMM_ROWS, min(n, (task + 1) * _GEMM_ROWS)):
                _tile_q2_k(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(GEMM_TILE, m - a0), out,
                          u64(a0) * os + u64(4 * r), os)
    return out


@njit(**_KERNEL)
def gemm_q3_k(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_q3_k_q8_K(row r of the Q3_K blocks, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    nb = _check_gemm(blocks, xq, out, np.int64(110))
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    n, m = blocks.shape[0], xq.shape[0]
    for task in prange(_gemm_tasks(n)):
        for a0 in range(0, m, GEMM_TILE):
            for r in range(task * _GEMM_ROWS, min(n, (task + 1) * _GEMM_ROWS)):
                _tile_q3_k(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(GEMM_TILE, m - a0), out,
                          u64(a0) * os + u64(4 * r), os)
    return out


@njit(**_KERNEL)
def gemm_q4_k(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_q4_k_q8_K(row r of the Q4_K blocks, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    nb = _check_gemm(blocks, xq, out, np.int64(144))
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    n, m = blocks.shape[0], xq.shape[0]
    for task in prange(_gemm_tasks(n)):
        for a0 in range(0, m, GEMM_TILE):
            for r in range(task * _GEMM_ROWS, min(n, (task + 1) * _GEMM_ROWS)):
                _tile_q4_k(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(GEMM_TILE, m - a0), out,
                          u64(a0) * os + u64(4 * r), os)
    return out


@njit(**_KERNEL)
def gemm_q5_k(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_q5_k_q8_K(row r of the Q5_K blocks, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    nb = _check_gemm(blocks, xq, out, np.int64(176))
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    n, m = blocks.shape[0], xq.shape[0]
    for task in prange(_gemm_tasks(n)):
        for a0 in range(0, m, GEMM_TILE):
            for r in range(task * _GEMM_ROWS, min(n, (task + 1) * _GEMM_ROWS)):
                _tile_q5_k(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(GEMM_TILE, m - a0), out,
                          u64(a0) * os + u64(4 * r), os)
    return out


@njit(**_KERNEL)
def gemm_q6_k(blocks, xq, out):
    """out[a, r] = ggml_vec_dot_q6_k_q8_K(row r of the Q6_K blocks, xq[a]): xq (m, nb * 292), out (m, n_rows)."""
    nb = _check_gemm(blocks, xq, out, np.int64(210))
    rs, xs, os = u64(blocks.strides[0]), u64(xq.strides[0]), u64(out.strides[0])
    n, m = blocks.shape[0], xq.shape[0]
    for task in prange(_gemm_tasks(n)):
        for a0 in range(0, m, GEMM_TILE):
            for r in range(task * _GEMM_ROWS, min(n, (task + 1) * _GEMM_ROWS)):
                _tile_q6_k(blocks, u64(r) * rs, nb, xq, u64(a0) * xs, xs, min(GEMM_TILE, m - a0), out,
                          u64(a0) * os + u64(4 * r), os)
    return out
