"""Reference quantizers for Q2_K .. Q6_K, byte-exact with llama.cpp without an importance matrix.

Each maps (n_blocks, 256) float32 -> (n_blocks, type_size) uint8 as quantize_row_q*_K_ref in
ggml-quants.c, which ggml_quantize_chunk runs for these types when imatrix is NULL: search a
scale (and min) per sub-block, quantize those to 4/6/8 bits against the fp16 super-block
scale(s), then requantize the weights with the scales as stored. Block layouts are drawn in
kquants.py.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from .floats import f16_bits_to_f32, f32_to_f16_bits
from .ggml_math import GROUP_MAX_EPS, first_absmax, max_from_zero, nearest_int, seq_sum, wrap_i8
from .kquant_search import make_q3_quants, make_qkx2_quants, make_qx_quants
from .kquants import (
    QK_K,
    k4_scales_mins,
    pack_bits,
    pack_k4_scales_mins,
    pack_nibble_pairs,
    pack_q3_k_scales,
    pack_q6_k_quants,
    pack_two_bit,
    q3_k_scales,
)

U8 = npt.NDArray[np.uint8]
F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]
_f = np.float32


# super-blocks searched at once: the searches' ~10 (n, N) float32 buffers then stay in L2 cache
_BLOCKS_AT_ONCE = 512


def _in_pieces(kernel: Callable[[F32], U8]) -> Callable[[F32], U8]:
    """Run a super-block kernel on at most _BLOCKS_AT_ONCE blocks at a time (blocks are independent)."""

    @functools.wraps(kernel)
    def run(x: F32) -> U8:
        if len(x) <= _BLOCKS_AT_ONCE:
            return kernel(x)
        return np.concatenate([kernel(x[i : i + _BLOCKS_AT_ONCE]) for i in range(0, len(x), _BLOCKS_AT_ONCE)])

    return run


def _sub_blocks(x: F32, size: int) -> F32:
    """(nb, 256) -> (size, nb * 256 / size): sub-blocks element-major for the searches."""
    return np.ascontiguousarray(x.reshape(-1, size).T)


def _by_block(v: npt.NDArray, nb: int) -> npt.NDArray:
    """(size, N) element-major quants, or (N,) per-sub-block values, back to per-super-block rows."""
    return v.T.reshape(nb, -1) if v.ndim == 2 else v.reshape(nb, -1)


def _f16(v: F32) -> tuple[U8, F32]:
    """(fp16 bytes (n, 2), the value they hold as float32 (n, 1)) of a float32 column."""
    bits = f32_to_f16_bits(v)
    return bits.astype("<u2").view(np.uint8).reshape(-1, 2), f16_bits_to_f32(bits).reshape(-1, 1)


def _requantize(x: F32, quants: I32, d: F32, offset: F32 | None, lo: int, hi: int) -> I32:
    """Redo the quants of sub-blocks whose stored scale d is non-zero: clamp(round((x + offset) / d)).

    x, quants: (nb, n_sub, size); d, offset: (nb, n_sub). Sub-blocks with d == 0 keep `quants`.
    """
    d3 = d[:, :, None]
    v = x if offset is None else x + offset[:, :, None]
    redone = np.clip(nearest_int(v / d3), lo, hi)
    return np.where(d3 != 0, redone, quants)


def _pick(cond: npt.NDArray[np.bool_], value: F32) -> F32:
    """`cond ? value : 0.0f` as float32."""
    return np.where(cond, value, _f(0.0)).astype(np.float32)


@_in_pieces
def quantize_q2_k(x: F32) -> U8:
    """float32 super-blocks to Q2_K, as quantize_row_q2_K_ref."""
    nb = len(x)
    xs = _sub_blocks(x, 16)
    scales, mins, quants = make_qkx2_quants(xs, np.abs(xs), 3, -0.5, 0.1, 15, use_mad=True)
    scales, mins = _by_block(scales, nb), _by_block(mins, nb)  # (nb, 16)
    max_scale, max_min = max_from_zero(scales, axis=1), max_from_zero(mins, axis=1)
    has_scale, has_min = (max_scale > 0)[:, None], (max_min > 0)[:, None]
    l_scale = np.where(has_scale, nearest_int((_f(15) / max_scale)[:, None] * scales), 0)
    l_min = np.where(has_min, nearest_int((_f(15) / max_min)[:, None] * mins), 0)
    packed = ((l_scale | (l_min << 4)) & 0xFF).astype(np.uint8)
    d_bytes, d = _f16(_pick(has_scale[:, 0], max_scale / _f(15)))
    dmin_bytes, dmin = _f16(_pick(has_min[:, 0], max_min / _f(15)))
    dl = d * (packed & np.uint8(0x0F)).astype(np.float32)
    ml = dmin * (packed >> np.uint8(4)).astype(np.float32)
    q = _requantize(x.reshape(nb, 16, 16), _by_block(quants, nb).reshape(nb, 16, 16), dl, ml, 0, 3)
    return np.concatenate([packed, pack_two_bit(q.reshape(nb, QK_K)), d_bytes, dmin_bytes], axis=1)


@_in_pieces
def quantize_q3_k(x: F32) -> U8:
    """float32 super-blocks to Q3_K, as quantize_row_q3_K_ref."""
    nb = len(x)
    scales, quants = make_q3_quants(_sub_blocks(x, 16), 4)
    scales = _by_block(scales, nb)  # (nb, 16)
    _, max_scale = first_absmax(scales, axis=1)
    has_scale = max_scale != 0  # NaN counts as set, as `if (max_scale)` does
    with np.errstate(all="ignore"):
        iscale = (_f(-32) / max_scale)[:, None]
        l6 = np.clip(wrap_i8(nearest_int(iscale * scales)), -32, 31) + 32
        packed = np.where(has_scale[:, None], pack_q3_k_scales(l6), np.uint8(0))
        d_bytes, d = _f16(_pick(has_scale, _f(1.0) / iscale[:, 0]))
    dl = d * q3_k_scales(packed).astype(np.float32)
    q = _requantize(x.reshape(nb, 16, 16), _by_block(quants, nb).reshape(nb, 16, 16) - 4, dl, None, -4, 3)
    q = q.reshape(nb, QK_K) + 4  # 0..7: low two bits in qs, the third in hmask
    return np.concatenate([pack_bits(q >> 2), pack_two_bit(q & 3), packed, d_bytes], axis=1)


def _quantize_k4(x: F32, nmax: int, rmin: float, nstep: int) -> tuple[U8, U8, I32]:
    """The shared Q4_K/Q5_K path: (d, dmin and scales bytes (nb, 16), quants (nb, 256) in [0, nmax])."""
    nb = len(x)
    xs = _sub_blocks(x, 32)
    av_x = np.sqrt(seq_sum(xs * xs) / _f(32))
    scales, mins, quants = make_qkx2_quants(xs, av_x + np.abs(xs), nmax, rmin, 0.1, nstep, use_mad=False)
    scales, mins = _by_block(scales, nb), _by_block(mins, nb)  # (nb, 8)
    max_scale, max_min = max_from_zero(scales, axis=1), max_from_zero(mins, axis=1)
    with np.errstate(divide="ignore"):
        inv_scale = _pick(max_scale > 0, _f(63) / max_scale)[:, None]
        inv_min = _pick(max_min > 0, _f(63) / max_min)[:, None]
    ls = np.minimum(63, nearest_int(inv_scale * scales) & 0xFF)  # uint8_t, then MIN(63, .)
    lm = np.minimum(63, nearest_int(inv_min * mins) & 0xFF)
    packed = pack_k4_scales_mins(ls, lm)
    d_bytes, d = _f16(max_scale / _f(63))
    dmin_bytes, dmin = _f16(max_min / _f(63))
    sc, m = k4_scales_mins(packed)
    dl = d * sc.astype(np.float32)
    ml = dmin * m.astype(np.float32)
    q = _requantize(x.reshape(nb, 8, 32), _by_block(quants, nb).reshape(nb, 8, 32), dl, ml, 0, nmax)
    return np.concatenate([d_bytes, dmin_bytes, packed], axis=1), q.reshape(nb, QK_K)


@_in_pieces
def quantize_q4_k(x: F32) -> U8:
    """float32 super-blocks to Q4_K, as quantize_row_q4_K_ref."""
    head, q = _quantize_k4(x, 15, -1.0, 20)
    return np.concatenate([head, pack_nibble_pairs(q)], axis=1)


@_in_pieces
def quantize_q5_k(x: F32) -> U8:
    """float32 super-blocks to Q5_K, as quantize_row_q5_K_ref."""
    head, q = _quantize_k4(x, 31, -0.5, 15)
    return np.concatenate([head, pack_bits(q >> 4), pack_nibble_pairs(q & 0x0F)], axis=1)


@_in_pieces
def quantize_q6_k(x: F32) -> U8:
    """float32 super-blocks to Q6_K, as quantize_row_q6_K_ref."""
    nb = len(x)
    scales, quants = make_qx_quants(_sub_blocks(x, 16), 32)
    scales = _by_block(scales, nb)  # (nb, 16)
    max_abs, max_scale = first_absmax(scales, axis=1)
    zero = max_abs < GROUP_MAX_EPS  # the whole super-block is stored as zeros
    with np.errstate(all="ignore"):
        iscale = (_f(-128) / max_scale)[:, None]
        sc = wrap_i8(np.minimum(127, nearest_int(iscale * scales)))
        d_bytes, d = _f16(_pick(~zero, _f(1.0) / iscale[:, 0]))
    dl = d * sc.astype(np.float32)
    q = _requantize(x.reshape(nb, 16, 16), _by_block(quants, nb).reshape(nb, 16, 16) - 32, dl, None, -32, 31)
    ql, qh = pack_q6_k_quants(q.reshape(nb, QK_K) + 32)
    out = np.concatenate([ql, qh, (sc & 0xFF).astype(np.uint8), d_bytes], axis=1)
    out[zero] = 0
    return out
