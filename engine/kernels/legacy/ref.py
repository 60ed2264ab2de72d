"""NumPy references of the legacy-quant and float products: ggml-cpu's numbers, vectorised over rows.

The same arithmetic as legacy_dot.py / legacy_floats.py, written as whole-array NumPy: exact integer
lane sums, then ggml's float steps in ggml's order with a fused multiply-add emulated exactly
(`fma32_ref`). The tests hold the compiled kernels to these and both to llama.cpp's fixtures;
without numba these are the products (slow, but the same bits).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.quant.types import GGMLType

from engine.kernels.legacy.repack import split_activation

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
STEP = 64
_T = GGMLType
_ROW_CHUNK = 2048  # rows per NumPy pass, to bound the (m, rows, nb, 8) lane temporaries


def fma32_ref(a: npt.ArrayLike, b: npt.ArrayLike, c: npt.ArrayLike) -> F32:
    """float32 a * b + c with one rounding: exact product and sum in float64 rounded to odd, then to float32."""
    p = np.asarray(a, np.float32).astype(np.float64) * np.asarray(b, np.float32).astype(np.float64)
    c64 = np.asarray(c, np.float32).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        total = p + c64
        s = np.atleast_1d(total)
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)  # TwoSum: s + err is p + c exactly (p holds 48 bits, exact)
        bits = s.view(np.int64).copy()
        odd_fix = (err != 0) & np.isfinite(s) & ((bits & 1) == 0)
        bits += np.where(odd_fix, np.where(np.signbit(err) == np.signbit(s), 1, -1), 0)
    return bits.view(np.float64).astype(np.float32).reshape(np.shape(total))


def hsum8_ref(acc: F32) -> F32:
    """hsum_float_8 over the last axis: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))."""
    r = acc[..., 4:8] + acc[..., 0:4]
    return (r[..., 0] + r[..., 2]) + (r[..., 1] + r[..., 3])


def _f16(b: U8, at: int) -> F32:
    return np.ascontiguousarray(b[..., at : at + 2]).view("<f2")[..., 0].astype(np.float32)


def _nibbles(qs: U8) -> npt.NDArray[np.int64]:
    """(..., 16) packed bytes -> (..., 32): low nibbles are weights 0..15, high ones 16..31."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int64)


def _fifth_bits(qh: U8) -> npt.NDArray[np.int64]:
    """(..., 4) bytes of a little-endian uint32 -> (..., 32) bits, weight j at bit j."""
    u = np.ascontiguousarray(qh).view("<u4")
    return ((u >> np.arange(32, dtype=np.uint32)) & 1).astype(np.int64)


def weight_ints(qtype: GGMLType, b: U8) -> tuple[npt.NDArray[np.int64], F32, F32 | None]:
    """Blocks (..., type_size) -> (the 32 weight integers ggml multiplies, d, m or None)."""
    if qtype == _T.Q4_0:
        return _nibbles(b[..., 2:18]) - 8, _f16(b, 0), None
    if qtype == _T.Q4_1:
        return _nibbles(b[..., 4:20]), _f16(b, 0), _f16(b, 2)
    if qtype == _T.Q5_0:
        return _nibbles(b[..., 6:22]) + 16 * _fifth_bits(b[..., 2:6]) - 16, _f16(b, 0), None
    if qtype == _T.Q5_1:
        return _nibbles(b[..., 8:24]) + 16 * _fifth_bits(b[..., 4:8]), _f16(b, 0), _f16(b, 2)
    if qtype == _T.Q8_0:
        return b[..., 2:34].view(np.int8).astype(np.int64), _f16(b, 0), None
    raise ValueError(f"{qtype.name} is not a legacy quant type")


def _quant_dot(qtype: GGMLType, blocks: U8, xq: U8) -> F32:
    """ggml_vec_dot_<q>_q8_<0|1> for raw blocks (r, row_bytes) and activation bytes (m, bytes) -> (m, r)."""
    size = {_T.Q4_0: 18, _T.Q4_1: 20, _T.Q5_0: 22, _T.Q5_1: 24, _T.Q8_0: 34}[qtype]
    act = 36 if qtype in (_T.Q4_1, _T.Q5_1) else 34
    n_rows = blocks.shape[0]
    nb = blocks.shape[1] // size
    yd, ys, yf = split_activation(xq, act)  # (m, nb), (m, nb), (m, nb, 32)
    y = yf.astype(np.int64).reshape(len(xq), nb, 8, 4)
    w, dx, mx = weight_ints(qtype, blocks.reshape(n_rows, nb, size))
    lanes = np.einsum("rbkt,mbkt->mrbk", w.reshape(n_rows, nb, 8, 4), y).astype(np.float32)  # exact: |sum| < 2^24
    d = (dx[None, :, :] * yd[:, None, :]).astype(np.float32)  # (m, r, nb)
    acc = np.zeros((len(xq), n_rows, 8), np.float32)
    summs = np.zeros((len(xq), n_rows), np.float32)
    for b in range(nb):
        acc = fma32_ref(d[:, :, b, None], lanes[:, :, b, :], acc)
        if mx is not None:  # summs += m * s (fp16 x fp16 is exact in float32: fused or not, the same)
            summs = fma32_ref(mx[None, :, b], ys[:, None, b], summs)
    return hsum8_ref(acc) + summs


def _reduce16(v: F32) -> F32:
    """_mm512_reduce_add_ps over the last axis (16): halves added down to one."""
    t = v[..., :8] + v[..., 8:]
    u = t[..., :4] + t[..., 4:]
    return (u[..., 0] + u[..., 2]) + (u[..., 1] + u[..., 3])


def _float_dot(qtype: GGMLType, w: F32, y: F32, step: int = STEP) -> F32:
    """ggml_vec_dot_f32 / _f16 of float rows w (r, n) with y (m, n) (values already widened) -> (m, r); step 64 for
    the AVX-512 build's four 16-lane accumulators, 32 for the AVX2 build's four 8-lane ones (GGML_F32x8_REDUCE)."""
    n = w.shape[1]
    body = n - n % step
    acc = np.zeros((len(y), len(w), step), np.float32)
    for c in range(0, body, step):
        acc = fma32_ref(w[None, :, c : c + step], y[:, None, c : c + step], acc)
    q = step // 4
    acc = (acc[..., 0:q] + acc[..., 2 * q : 3 * q]) + (acc[..., q : 2 * q] + acc[..., 3 * q : 4 * q])
    if step == 32:
        t = acc[..., 0:4] + acc[..., 4:8]
        s = (t[..., 0] + t[..., 1]) + (t[..., 2] + t[..., 3])
    else:
        s = _reduce16(acc)
    if qtype == _T.F32:
        for e in range(body, n):
            s = s + w[None, :, e] * y[:, None, e]
        return s
    s64 = s.astype(np.float64)
    for e in range(body, n):
        s64 = s64 + (w[None, :, e] * y[:, None, e]).astype(np.float64)
    return s64.astype(np.float32)


def _bf16_dot_avx2(w_bits: npt.NDArray[np.uint16], y_bits: npt.NDArray[np.uint16]) -> F32:
    """ggml_vec_dot_bf16 as the AVX2 build runs it (see legacy_floats.py), bits (r, n) and (m, n) -> (m, r)."""
    wf = (w_bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    yf = (y_bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
    n = w_bits.shape[1]
    body = n - n % 32
    acc = np.zeros((len(y_bits), len(w_bits), 32), np.float32)
    for c in range(0, body, 32):
        acc = acc + wf[None, :, c : c + 32] * yf[:, None, c : c + 32]
    v = (acc[..., 0:8] + acc[..., 16:24]) + (acc[..., 8:16] + acc[..., 24:32])
    g = v[..., 4:8] + v[..., 0:4]
    s = ((g[..., 0] + g[..., 2]) + (g[..., 1] + g[..., 3])).astype(np.float64)
    for e in range(body, n):
        s = s + (wf[None, :, e] * yf[:, None, e]).astype(np.float64)
    return s.astype(np.float32)


def _bf16_dot(w_bits: npt.NDArray[np.uint16], y_bits: npt.NDArray[np.uint16]) -> F32:
    """ggml_vec_dot_bf16, AVX512_BF16 path (see legacy_floats.py), for bits (r, n) and (m, n) -> (m, r)."""
    def widen(bits: npt.NDArray[np.uint16], daz: bool) -> F32:
        u = bits.astype(np.uint32) << np.uint32(16)
        if daz:
            u = np.where((u & np.uint32(0x7F800000)) == 0, u & np.uint32(0x80000000), u)
        return u.view(np.float32)

    def ftz(v: F32) -> F32:
        return np.where((np.abs(v) < np.float32(1.17549435e-38)) & (v != 0), np.float32(0.0) * v, v)

    n = w_bits.shape[1]
    body = n - n % STEP
    wz, yz = widen(w_bits, True), widen(y_bits, True)
    acc = np.zeros((len(y_bits), len(w_bits), 32), np.float32)
    for c in range(0, body, STEP):
        even, odd = slice(c, c + STEP, 2), slice(c + 1, c + STEP, 2)
        acc = ftz(fma32_ref(wz[None, :, odd], yz[:, None, odd], acc))
        acc = ftz(fma32_ref(wz[None, :, even], yz[:, None, even], acc))
    s = _reduce16(acc[..., :16]).astype(np.float64) + _reduce16(acc[..., 16:]).astype(np.float64)
    wf, yf = widen(w_bits, False), widen(y_bits, False)
    for e in range(body, n):
        s = s + (wf[None, :, e] * yf[:, None, e]).astype(np.float64)
    return s.astype(np.float32)


def dot_ref(qtype: GGMLType, blocks: U8, xq: U8, step: int = STEP) -> F32:
    """ggml-cpu's vec_dot of every row of raw `blocks` (n_rows, row_bytes) with activations xq (m, bytes) -> (m, n_rows);
    step: the float products' (see _float_dot)."""
    qtype = GGMLType(int(qtype))
    blocks = np.asarray(blocks)
    xq = np.atleast_2d(np.asarray(xq))
    out = np.empty((len(xq), len(blocks)), np.float32)
    with np.errstate(all="ignore"):  # inf * 0 and the like make NaN here as in C, without warnings
        for r0 in range(0, len(blocks), _ROW_CHUNK):
            part = blocks[r0 : r0 + _ROW_CHUNK]
            if qtype == _T.F32:
                val = _float_dot(qtype, np.ascontiguousarray(part).view(np.float32), xq.view(np.float32), step)
            elif qtype == _T.F16:
                val = _float_dot(qtype, np.ascontiguousarray(part).view("<f2").astype(np.float32),
                                 xq.view("<f2").astype(np.float32), step)
            elif qtype == _T.BF16:
                bf16_dot = _bf16_dot_avx2 if step == 32 else _bf16_dot
                val = bf16_dot(np.ascontiguousarray(part).view("<u2"), xq.view("<u2"))
            else:
                val = _quant_dot(qtype, part, xq)
            out[:, r0 : r0 + len(part)] = val
    return out

