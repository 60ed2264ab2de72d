"""Batches of the Q8_K i-quants and Q2_K with the numbers of ggml-cpu's tiled MUL_MAT path, bit for bit.

From 8 activation rows llama.cpp multiplies a weight it keeps in the plain CPU buffer by its tiled path
(ggml-cpu/tiled) when the type is IQ4_XS, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_S, IQ1_M or Q2_K (rows
not in eights; with AVX-512 rows in eights are repacked). Per activation a, weight row r and super-block i,
in order from acc = 0:

  isum = sum of (integer weight * its sub-block scale) * q8 over the block's 256 weights    (exact)
  res  = float(isum) * d0          d0 = fp16(d) * c   (c: 0.125 for IQ2_* and IQ1_*, 0.25 for IQ3_XXS, else 1)
  Q2_K: res = fma(-fp16(dmin), float(sum of min * bsum per 16), float(isum) * fp16(d))
  acc  = fma(res, d8_i, acc)

(the tile's d0 * float(s1), its fnmadd for the min term, and `buf + res * d1`, which GCC contracts). IQ1_S /
IQ1_M weights are 8 * grid + delta there (the 1/8 is in c), so their delta terms are part of isum. vec_dot's
order differs (eight lanes, one fma each, a horizontal sum at the end): batches under 8 rows keep it
(iquant_dot.py). Each weight row is decoded once per call into int16 products weight * scale (|value| < 2^12)
and fp32 d0; the 256-weight integer dot with the Q8_K bytes is vpmaddwd work (`_dot256`).

  gemm_tiled(kind, blocks, xq, out)   kind: KINDS[type name]; blocks (n_rows, nb * block bytes),
                                      xq (m, nb * 292) Q8_K rows -> out (m, n_rows)
  gemm_q2_k_x8 / gemv_q2_k_x8         Q2_K rows in eights as llama.cpp's repacked q2_K_8x8 kernels compute them
                                      (AVX-512 builds): one fma per 128 weights in the gemm, per super-block in
                                      the gemv, on the same decoded rows
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from engine.kernels.activations import bits_f32, f16_to_f32, fma32, njit, prange
from engine.kernels.iquant.rows import _IQ1S, Q8K, _f16, _i16, _u16, _u32
from engine.kernels.iquant.tiles import _decode
from engine.kernels.simd import I8, I16, I32, Ops, byte_ptr, call_intrinsic, load, vec

# type name -> kind: 0..5 are iquant_tiles._decode's, 8 / 9 the IQ1 types, 10 Q2_K
KINDS = {"IQ2_XXS": 0, "IQ2_XS": 1, "IQ2_S": 2, "IQ3_XXS": 3, "IQ3_S": 4, "IQ4_XS": 5, "IQ1_S": 8, "IQ1_M": 9,
         "Q2_K": 10}
# by kind: block bytes (0: no such kind), and the constant c of d0
_SIZE = np.array([66, 74, 82, 98, 110, 136, 0, 0, 50, 56, 84], np.int64)
_C = np.array([0.125, 0.125, 0.125, 0.25, 1.0, 1.0, 0, 0, 0.125, 0.125, 1.0], np.float32)
_H = {"cache": True, "forceinline": True, "error_model": "numpy"}
_ROWS = 4  # weight rows per parallel task: their decoded int16 rows stay in cache while every activation passes


def _int_sums(context, b, pws, px, n: int):
    """i32 sums over k < n of int16 w[k] * int8 x[k] for each w pointer in pws (exact); each x vector is loaded
    and widened once for all of them."""
    ops = Ops(context, b)
    accs = [ir.Constant(vec(I32, 8), None)] * len(pws)
    for c in range(n // 16):
        xv = b.sext(load(b, px, vec(I8, 16), 16 * c), vec(I16, 16))
        accs = [b.add(acc, ops.madd(load(b, pw, vec(I16, 16), 32 * c), xv)) for acc, pw in zip(accs, pws)]
    return [call_intrinsic(b, "llvm.vector.reduce.add.v8i32", I32, [acc]) for acc in accs]


def _int_dot(n: int):
    """An intrinsic: sum over k < n of int16 w[k] * int8 x[k], w's bytes from byte wo, x's from byte xo (exact)."""
    def typer(typingctx, w, wo, x, xo):
        def codegen(context, b, sig, args):
            pw = byte_ptr(context, b, sig.args[0], args[0], args[1])
            px = byte_ptr(context, b, sig.args[2], args[2], args[3])
            return _int_sums(context, b, [pw], px, n)[0]
        return types.int32(w, wo, x, xo), codegen
    typer.__name__ = f"dot{n}"
    return intrinsic(typer)


_dot256, _dot128 = _int_dot(256), _int_dot(128)


@intrinsic
def _dot256x4(typingctx, w, wo, ws, x, xo, isum):
    """isum[j] = sum over k < 256 of int16 w[k] * int8 x[k] for the four w rows at bytes wo + j * ws (each x
    vector loaded and widened once for the four rows)."""
    def codegen(context, b, sig, args):
        px = byte_ptr(context, b, sig.args[3], args[3], args[4])
        ws_ = args[2]
        pws = [byte_ptr(context, b, sig.args[0], args[0], b.add(args[1], b.mul(ws_, ir.Constant(ws_.type, j))))
               for j in range(4)]
        out = byte_ptr(context, b, sig.args[5], args[5], ir.Constant(ir.IntType(64), 0))
        out = b.bitcast(out, I32.as_pointer())
        for j, total in enumerate(_int_sums(context, b, pws, px, 256)):
            b.store(total, b.gep(out, [ir.Constant(I32, j)]))
        return context.get_dummy_value()
    return types.void(w, wo, ws, x, xo, isum), codegen


@njit(**_H)
def _decode_iq1(kind, w, b, wq, s16, e0, j16):
    """One IQ1_S (kind 8) / IQ1_M (9) block as the tile holds it: 8 * grid + delta, the 3-bit scales; fp16 d."""
    if kind == 8:
        for ib in range(8):
            hw = _u16(w, b + 34 + 2 * ib)
            s16[j16 + 2 * ib] = s16[j16 + 2 * ib + 1] = 2 * ((hw >> 12) & 7) + 1
            delta = -1 if hw & 0x8000 else 1
            for g in range(4):
                gi = np.int32(w[b + 2 + 4 * ib + g]) | (((hw >> (3 * g)) & 7) << 8)
                for k in range(8):
                    wq[e0 + 32 * ib + 8 * g + k] = 8 * _IQ1S[gi, k] + delta
        return _f16(w, b)
    for ib in range(8):
        hw = _u16(w, b + 48 + 2 * (ib // 2)) >> (6 * (ib % 2))
        s16[j16 + 2 * ib], s16[j16 + 2 * ib + 1] = 2 * (hw & 7) + 1, 2 * ((hw >> 3) & 7) + 1
        h0, h1 = np.int32(w[b + 32 + 2 * ib]), np.int32(w[b + 33 + 2 * ib])
        for g in range(4):
            h = h0 if g < 2 else h1
            sh = 4 * (g % 2)
            gi = np.int32(w[b + 4 * ib + g]) | (((h >> sh) & 7) << 8)
            delta = -1 if (h >> (sh + 3)) & 1 else 1
            for k in range(8):
                wq[e0 + 32 * ib + 8 * g + k] = 8 * _IQ1S[gi, k] + delta
    sc = (_u16(w, b + 48) >> 12) | ((_u16(w, b + 50) >> 8) & 0xF0) | ((_u16(w, b + 52) >> 4) & 0xF00)
    sc |= _u16(w, b + 54) & 0xF000
    return f16_to_f32(np.uint16(sc))


@njit(**_H)
def _decode_q2_k(w, b, wq, s16, mins, j16):
    """One Q2_K block: quants 0..3 in wq, the 4-bit scales in s16 and mins; fp16 d (dmin is read apart)."""
    e0 = 16 * j16
    for s in range(16):
        sc = np.int32(w[b + s])
        s16[j16 + s], mins[j16 + s] = sc & 15, sc >> 4
    for h in range(2):
        for j in range(4):
            for k in range(32):
                q = np.int32(w[b + 16 + 32 * h + k])
                wq[e0 + 128 * h + 32 * j + k] = (q >> (2 * j)) & 3
    return _f16(w, b + 80)


@njit(**_H)
def _row(kind, w, nb, wq, s16, mins, w16, d0, dmin):
    """Decode a whole weight row: w16 = weight * scale (int16), d0 per block; Q2_K's mins and dmin too."""
    size, c = _SIZE[kind], _C[kind]
    for i in range(nb):
        if kind == 10:
            d = _decode_q2_k(w, size * i, wq, s16, mins, 16 * i)
            dmin[i] = _f16(w, size * i + 82)
        elif kind >= 8:
            d = _decode_iq1(kind, w, size * i, wq, s16, 256 * i, 16 * i)
        else:
            d = _decode(kind, w, size * i, wq, s16, 256 * i, 16 * i)
        d0[i] = d * c
    for e in range(256 * nb):
        w16[e] = np.int16(np.int32(wq[e]) * s16[e >> 4])


@njit(**_H)
def _min_sum(mins, i, s0, s1, x, y):
    """Q2_K's min term of sub-blocks s0..s1-1 of block i: sum of min * the Q8_K block's bsum (at byte y of x)."""
    imin = np.int32(0)
    for s in range(s0, s1):
        imin += np.int32(mins[16 * i + s] * _i16(x, y + 260 + 2 * s))
    return imin


@njit(**_H)
def _tiled_dot(kind, w16, d0, mins, dmin, nb, x):
    acc = np.float32(0.0)
    for i in range(nb):
        y = Q8K * i
        res = np.float32(_dot256(w16, 512 * i, x, y + 4)) * d0[i]
        if kind == 10:
            res = fma32(-dmin[i], np.float32(_min_sum(mins, i, 0, 16, x, y)), res)
        acc = fma32(res, bits_f32(_u32(x, y)), acc)
    return acc


@njit(parallel=True, cache=True, error_model="numpy")
def gemm_tiled(kind, blocks, xq, out):
    """out[a, r] = the tiled path's value of weight row r (type `kind`) times Q8_K row xq[a]."""
    size = _SIZE[kind]
    if size == 0 or blocks.ndim != 2 or blocks.shape[1] % size:
        raise ValueError("weight row bytes are not a whole number of blocks of this type")
    nb = blocks.shape[1] // size
    n_rows, m = blocks.shape[0], xq.shape[0]
    if xq.shape[1] != nb * Q8K or out.shape[0] != m or out.shape[1] != n_rows:
        raise ValueError("the activations must be Q8_K rows as long as the weight rows, out (m, n_rows)")
    for task in prange((n_rows + _ROWS - 1) // _ROWS):
        r0 = task * _ROWS
        r1 = min(n_rows, r0 + _ROWS)
        wq = np.empty(256 * nb, np.int8)
        s16 = np.empty(16 * nb, np.int32)
        w16 = np.empty((r1 - r0, 256 * nb), np.int16)
        d0 = np.empty((r1 - r0, nb), np.float32)
        dmin = np.zeros((r1 - r0, nb), np.float32)
        allmins = np.zeros((r1 - r0, 16 * nb), np.int32)  # Q2_K's only; zeros for the others
        for r in range(r0, r1):
            _row(kind, blocks[r], nb, wq, s16, allmins[r - r0], w16[r - r0], d0[r - r0], dmin[r - r0])
        if r1 - r0 < _ROWS or kind == 10:
            for a in range(m):
                x = xq[a]
                for r in range(r0, r1):
                    out[a, r] = _tiled_dot(kind, w16[r - r0], d0[r - r0], allmins[r - r0], dmin[r - r0], nb, x)
            continue
        isum = np.empty(4, np.int32)
        ws = np.int64(w16.strides[0])
        for a in range(m):
            x = xq[a]
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for i in range(nb):
                y = Q8K * i
                _dot256x4(w16, np.int64(512 * i), ws, x, np.int64(y + 4), isum)
                d8 = bits_f32(_u32(x, y))
                a0 = fma32(np.float32(isum[0]) * d0[0, i], d8, a0)
                a1 = fma32(np.float32(isum[1]) * d0[1, i], d8, a1)
                a2 = fma32(np.float32(isum[2]) * d0[2, i], d8, a2)
                a3 = fma32(np.float32(isum[3]) * d0[3, i], d8, a3)
            out[a, r0], out[a, r0 + 1], out[a, r0 + 2], out[a, r0 + 3] = a0, a1, a2, a3
    return out


# ---- Q2_K rows in eights: llama.cpp (AVX-512) repacks them (q2_K_8x8) and multiplies every batch with
# ggml_gemv / gemm_q2_K_8x8_q8_K: per super-block acc = fma(float(isum), d * d8, acc) and
# acc_min = fma(float(imin), dmin * d8, acc_min) with the exact integers of the block, then acc - acc_min


@njit(**_H)
def _dot_q2_k_x8(w16, d0, mins, dmin, nb, x, halves):
    """One row: the gemv's one fma per super-block, or (halves: the gemm's rows in fours) one per 128 weights."""
    acc = acc_min = np.float32(0.0)
    for i in range(nb):
        y = Q8K * i
        d8 = bits_f32(_u32(x, y))
        for h in range(2 if halves else 1):
            n16 = 8 if halves else 16
            imin = _min_sum(mins, i, n16 * h, n16 * (h + 1), x, y)
            if halves:
                isum = _dot128(w16, 512 * i + 256 * h, x, y + 4 + 128 * h)
            else:
                isum = _dot256(w16, 512 * i, x, y + 4)
            acc = fma32(np.float32(isum), d0[i] * d8, acc)
            acc_min = fma32(np.float32(imin), dmin[i] * d8, acc_min)
    return acc - acc_min


@njit(parallel=True, cache=True, error_model="numpy")
def gemm_q2_k_x8(blocks, xq, out):
    """out[a, r] = llama.cpp's q2_K_8x8 value of Q2_K row r with Q8_K row xq[a] (the activations of a batch as
    forward_mul_mat quantizes them: kquant_repack.quantize_q8_k_mat): the gemm's numbers for the first m - m % 4
    rows, the gemv's for the rest (and for a single row)."""
    if blocks.ndim != 2 or blocks.shape[1] % 84:
        raise ValueError("weight row bytes are not a whole number of Q2_K blocks")
    nb = blocks.shape[1] // 84
    n_rows, m = blocks.shape[0], xq.shape[0]
    if xq.shape[1] != nb * Q8K or out.shape[0] != m or out.shape[1] != n_rows:
        raise ValueError("the activations must be Q8_K rows as long as the weight rows, out (m, n_rows)")
    for r in prange(n_rows):
        wq = np.empty(256 * nb, np.int8)
        s16 = np.empty(16 * nb, np.int32)
        mins = np.zeros(16 * nb, np.int32)
        w16 = np.empty(256 * nb, np.int16)
        d0 = np.empty(nb, np.float32)
        dmin = np.zeros(nb, np.float32)
        _row(10, blocks[r], nb, wq, s16, mins, w16, d0, dmin)
        for a in range(m):  # forward_mul_mat: gemm for the first m - m % 4 rows, gemv for the rest
            out[a, r] = _dot_q2_k_x8(w16, d0, mins, dmin, nb, xq[a], a < m - m % 4)
    return out


@njit(cache=True, error_model="numpy")
def gemv_q2_k_x8(blocks, xq, out):
    """One Q8_K row xq (bytes,) -> out (n_rows,): the q2_K_8x8 gemv's value of every row."""
    return gemm_q2_k_x8(blocks, xq.reshape(1, -1), out.reshape(1, -1))
