"""One-row products of Q8_0 weights with `vpdpbusd` across sixteen rows: ggml_vec_dot_q8_0_q8_0's bits, faster.

The byte-plane kernel (legacy_dot.py) forms each lane's four products in float, one conversion and one fused
multiply-add per weight; for a wide Q8_0 matrix (an output head of 262,144 rows) that is the whole cost of a
decode step. Here each 16-row group is repacked once so that one 64-byte load holds lane k (weights 4k..4k+3)
of sixteen rows, each weight stored as w + 128 (unsigned). One vpdpbusd against the activation's four quants of
that lane, started at -128 * (their sum), gives the exact integer lane of all sixteen rows; then ggml's float
steps, vectorised across the rows:

  acc[k] = fma(fp16(d_w) * fp16(d_x), float(lane k), acc[k])     block after block
  out = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))

Integer lanes are exact, so this equals ggml's value bit for bit (ggml's _mm256_sign_epi8 differs only for an
activation quant of -128 against a weight of -128, which quantize_row_q8_0 makes only for non-finite rows).
Needs AVX512-VNNI (`available()`); elsewhere the byte-plane kernel runs.

  repack_q8_0_x16(blocks) -> (quants (n/16, nb * 512) uint8, scales (n/16, nb * 16) uint16)   n % 16 == 0
  gemv_q8_0_x16(quants, scales, xq, out)    xq: one block_q8_0 activation row (nb * 34,) -> out (n,)
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels import pages
from engine.kernels.activations import f16_to_f32
from engine.kernels.kquant.dot import _splat
from engine.kernels.simd import (
    F32,
    I8,
    I16,
    I32,
    I64,
    byte_ptr,
    call_intrinsic,
    has_vnni,
    load,
    vec,
)

ROWS = 16
U8 = npt.NDArray[np.uint8]
_HAS_VNNI: list[bool] = []


def _group(context, b, pq, ps, nb, pxq, pxd, pxb, po) -> None:
    """Sixteen rows: quants at pq (nb * 512 bytes), fp16 scales at ps (nb * 16), activation quants pxq (nb * 32),
    its scales as float pxd (nb), lane biases pxb (nb * 8 int32); sixteen float32 outputs at po."""
    f16 = vec(F32, ROWS)
    i16 = vec(I32, ROWS)
    accs = [cgutils.alloca_once_value(b, ir.Constant(f16, None)) for _ in range(8)]
    with cgutils.for_range(b, nb) as loop:
        i = loop.index
        half = b.bitcast(load(b, b.gep(ps, [b.mul(i, ir.Constant(I64, 2 * ROWS))]), vec(I16, ROWS)), vec(ir.HalfType(), ROWS))
        dx = b.load(b.bitcast(b.gep(pxd, [b.mul(i, ir.Constant(I64, 4))]), F32.as_pointer()))
        d = b.fmul(b.fpext(half, f16), _splat(b, dx, ROWS))  # fp16(d_w) * fp16(d_x) for each row
        qx = b.gep(pxq, [b.mul(i, ir.Constant(I64, 32))])
        bias = b.gep(pxb, [b.mul(i, ir.Constant(I64, 32))])
        wq = b.gep(pq, [b.mul(i, ir.Constant(I64, 8 * 64))])
        for k in range(8):
            w = load(b, wq, vec(I8, 64), 64 * k)
            x4 = load(b, qx, I32, 4 * k)
            xs = b.shuffle_vector(b.insert_element(ir.Constant(i16, None), x4, ir.Constant(I32, 0)), ir.Constant(i16, None),
                                  ir.Constant(vec(I32, ROWS), [ir.Constant(I32, 0)] * ROWS))
            c = load(b, bias, I32, 4 * k)
            cs = b.shuffle_vector(b.insert_element(ir.Constant(i16, None), c, ir.Constant(I32, 0)), ir.Constant(i16, None),
                                  ir.Constant(vec(I32, ROWS), [ir.Constant(I32, 0)] * ROWS))
            lane = call_intrinsic(b, "llvm.x86.avx512.vpdpbusd.512", i16, [cs, b.bitcast(w, i16), xs])
            acc = call_intrinsic(b, f"llvm.fma.v{ROWS}f32", f16, [d, b.sitofp(lane, f16), b.load(accs[k])])
            b.store(acc, accs[k])
    a = [b.load(p) for p in accs]
    total = b.fadd(b.fadd(b.fadd(a[0], a[4]), b.fadd(a[2], a[6])), b.fadd(b.fadd(a[1], a[5]), b.fadd(a[3], a[7])))
    b.store(total, b.bitcast(po, f16.as_pointer()), align=4)


def _i64(b, v):
    return v if v.type == I64 else b.sext(v, I64)


@intrinsic
def _group_dot(typingctx, q, qo, s, so, nb, xq, xd, xb, out, oo):
    def codegen(context, builder, signature, args):
        q_, qo_, s_, so_, nb_, xq_, xd_, xb_, out_, oo_ = args
        pq = byte_ptr(context, builder, signature.args[0], q_, qo_)
        ps = byte_ptr(context, builder, signature.args[2], s_, so_)
        zero = ir.Constant(I64, 0)
        pxq = byte_ptr(context, builder, signature.args[5], xq_, zero)
        pxd = byte_ptr(context, builder, signature.args[6], xd_, zero)
        pxb = byte_ptr(context, builder, signature.args[7], xb_, zero)
        po = byte_ptr(context, builder, signature.args[8], out_, oo_)
        _group(context, builder, pq, ps, _i64(builder, nb_), pxq, pxd, pxb, po)
        return context.get_dummy_value()

    return types.void(q, qo, s, so, nb, xq, xd, xb, out, oo), codegen


@intrinsic
def _vnni(typingctx):
    def codegen(context, builder, signature, args):
        return ir.Constant(ir.IntType(1), int(has_vnni(context)))

    return types.boolean(), codegen


@njit(cache=True)
def _has_vnni():
    return _vnni()


def available() -> bool:
    """Whether numba's target has AVX512-VNNI (the kernel's vpdpbusd)."""
    if not _HAS_VNNI:
        try:
            _HAS_VNNI.append(bool(_has_vnni()))
        except Exception:  # noqa: BLE001 - any compile failure means: use the byte-plane kernel
            _HAS_VNNI.append(False)
    return _HAS_VNNI[0]


@njit(cache=True, parallel=True, error_model="numpy")
def gemv_q8_0_x16(quants, scales, xq, out):
    """out (n,) = ggml_vec_dot_q8_0_q8_0 of each row of the repacked weight with the activation xq (nb * 34,)."""
    nb = xq.shape[0] // 34
    xs = np.empty(nb * 32, np.int8)
    xd = np.empty(nb, np.float32)
    xb = np.empty(nb * 8, np.int32)
    for blk in range(nb):
        o = blk * 34
        xd[blk] = f16_to_f32(np.uint16(xq[o]) | (np.uint16(xq[o + 1]) << np.uint16(8)))
        for k in range(8):
            total = 0
            for j in range(4):
                v = np.int8(xq[o + 2 + 4 * k + j])
                xs[blk * 32 + 4 * k + j] = v
                total += np.int32(v)
            xb[blk * 8 + k] = -128 * total
    qs, ss, os = np.uint64(quants.strides[0]), np.uint64(scales.strides[0]), np.uint64(4 * ROWS)
    for g in prange(quants.shape[0]):
        _group_dot(quants, np.uint64(g) * qs, scales, np.uint64(g) * ss, nb, xs, xd, xb, out, np.uint64(g) * os)
    return out


def repack_q8_0_x16(blocks: U8) -> tuple[U8, npt.NDArray[np.uint16]]:
    """Q8_0 rows (n, nb * 34), n % 16 == 0 -> (quants (n/16, nb * 512) as w + 128, scales (n/16, nb * 16) fp16 bits):
    per group and block, lane k (weights 4k..4k+3) of the sixteen rows side by side."""
    n, row_bytes = blocks.shape
    if n % ROWS or row_bytes % 34:
        raise ValueError(f"Q8_0 x16 needs rows in multiples of {ROWS} and whole blocks, got {blocks.shape}")
    nb, ng = row_bytes // 34, n // ROWS
    b = np.asarray(blocks).reshape(ng, ROWS, nb, 34)
    quants = np.empty((ng, nb * 512), np.uint8)
    scales = np.empty((ng, nb * ROWS), np.uint16)
    step = max(1, (4 << 20) // (ROWS * row_bytes))  # a few MiB at a time: no temporary as large as the weight
    for g0 in range(0, ng, step):
        part = b[g0 : g0 + step]
        k = part.shape[0]
        scales[g0 : g0 + k] = np.ascontiguousarray(part[..., 0:2].transpose(0, 2, 1, 3)).view(np.uint16).reshape(k, -1)
        q = part[..., 2:].reshape(k, ROWS, nb, 8, 4) ^ np.uint8(0x80)  # int8 w as the byte of w + 128
        quants[g0 : g0 + k] = q.transpose(0, 2, 3, 1, 4).reshape(k, nb * 512)
        pages.release(blocks[g0 * ROWS : (g0 + k) * ROWS])  # these rows' file pages: the copy holds them now
    return quants, scales


def unpack_rows(quants: U8, scales: npt.NDArray[np.uint16], ids: npt.ArrayLike) -> U8:
    """The Q8_0 blocks (len(ids), nb * 34) of rows `ids` of a repacked copy, byte for byte the GGUF's: a tied
    model's token embedding looks its rows up here instead of mapping the file's pages a second time."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    nb = scales.shape[1] // ROWS
    g, j = ids // ROWS, ids % ROWS
    out = np.empty((ids.size, nb, 34), np.uint8)
    out[..., 0:2] = scales.reshape(-1, nb, ROWS)[g, :, j].view(np.uint8).reshape(ids.size, nb, 2)
    q = quants.reshape(-1, nb, 8, ROWS, 4)[g, :, :, j, :]  # (ids, nb, 8, 4): lane k of each block
    out[..., 2:] = q.reshape(ids.size, nb, 32) ^ np.uint8(0x80)
    return out.reshape(ids.size, nb * 34)
