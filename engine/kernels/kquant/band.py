"""What the band kernels (kquant_vnni on zmm, kquant_avx2_band on ymm) share: the activations transposed into
tiles, and a repacked Q4_K group decoded into the band scratch.

  pack(xq, nb, m, tile)       Q8_K rows -> per tile of `tile` activations: four consecutive quants of each
                              activation side by side, the bsums and 32-quant sums, d8 (zero padded)
  decode_q4_k_group(weight, wo, nb, codes, sc, mn, dd)
                              eight repacked Q4_K rows -> codes 0..15, int32 scales and mins, float d and dmin
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.kernels.activations import bits_f32
from engine.kernels.kquant.lanes import V32, k4_scales_mins_ir
from engine.kernels.kquant.repack import GROUP_BYTES, _i64
from engine.kernels.kquant.repack_ref import GROUP, Q4K_BYTES
from engine.kernels.simd import I8, I16, I32, I64, byte_ptr, half_to_float, load, splat_const, vec

BAND = GROUP  # weight rows a band kernel multiplies at once
I32X8 = vec(I32, 8)


@njit(cache=True, error_model="numpy")  # serial: a parallel loop costs seconds of compile for little
def pack(xq, nb, m, tile):
    """Q8_K rows (m, nb * 292) -> per tile of `tile` activations and super-block: the quants as 64 groups x tile
    x 4 bytes, the 16-quant bsums then the 32-quant sums (24 x tile int32), d8 (tile floats); zero padded."""
    tiles = (m + tile - 1) // tile
    xt = np.zeros((tiles, nb, 64, tile, 4), np.uint8)
    bs = np.zeros((tiles, nb, 24, tile), np.int32)
    d8 = np.zeros((tiles, nb, tile), np.float32)
    for a in range(m):
        t, j = a // tile, a % tile
        for i in range(nb):
            o = i * 292
            d8[t, i, j] = bits_f32(np.uint32(xq[a, o]) | (np.uint32(xq[a, o + 1]) << np.uint32(8))
                                   | (np.uint32(xq[a, o + 2]) << np.uint32(16)) | (np.uint32(xq[a, o + 3]) << np.uint32(24)))
            for g in range(64):
                for e in range(4):
                    xt[t, i, g, j, e] = xq[a, o + 4 + 4 * g + e]
            for s in range(16):
                v = np.int32(xq[a, o + 260 + 2 * s]) | (np.int32(xq[a, o + 261 + 2 * s]) << 8)
                bs[t, i, s, j] = v - 65536 if v >= 32768 else v
            for s in range(8):
                bs[t, i, 16 + s, j] = bs[t, i, 2 * s, j] + bs[t, i, 2 * s + 1, j]
    return xt, bs, d8

def _store(b, value, ptr, offset):
    b.store(value, b.bitcast(b.gep(ptr, [offset]), value.type.as_pointer()), align=1)


def _decode_group(context, b, pw0, nb, pc0, ps0, pm0, pd0, crs, srs, drs) -> None:
    """The eight Q4_K rows of a repacked group (super-block i of row c at pw0 + i * 1152 + c * 144) into the
    band scratch: 256 codes (0..15, sub-block order), 8 int32 scales and mins (get_scale_min_k4), d and dmin
    as floats; row c's at pc0 + c * crs (codes), ps0 / pm0 + c * srs, pd0 + c * drs, super-block i 256, 64
    and 8 bytes further. Vector code: a scalar decode cost as much as a tile of sixteen activations."""
    low = splat_const(I8, 15, 32)
    with cgutils.for_range(b, nb) as loop:
        i = loop.index
        for c in range(BAND):
            pw = b.gep(pw0, [b.add(b.mul(i, ir.Constant(I64, GROUP_BYTES)), ir.Constant(I64, c * Q4K_BYTES))])
            row = ir.Constant(I64, c)
            pc = b.add(b.mul(row, crs), b.mul(i, ir.Constant(I64, 256)))
            for p in range(4):
                bits = load(b, pw, V32, 16 + 32 * p)
                _store(b, b.and_(bits, low), pc0, b.add(pc, ir.Constant(I64, 64 * p)))
                _store(b, b.lshr(bits, splat_const(I8, 4, 32)), pc0, b.add(pc, ir.Constant(I64, 64 * p + 32)))
            scales, mins = k4_scales_mins_ir(b, pw)
            at = b.add(b.mul(row, srs), b.mul(i, ir.Constant(I64, 64)))
            _store(b, b.zext(scales, I32X8), ps0, at)
            _store(b, b.zext(mins, I32X8), pm0, at)
            at = b.add(b.mul(row, drs), b.mul(i, ir.Constant(I64, 8)))
            _store(b, half_to_float(context, b, load(b, pw, I16, 0)), pd0, at)
            _store(b, half_to_float(context, b, load(b, pw, I16, 2)), pd0, b.add(at, ir.Constant(I64, 4)))


@intrinsic
def decode_q4_k_group(typingctx, weight, wo, nb, codes, sc, mn, dd):
    """decode_q4_k_group(weight, wo, nb, codes, sc, mn, dd): the repacked group at byte wo of weight into the
    band scratch (codes (8, nb, 256) uint8, sc / mn (8, nb, 16) int32, dd (8, nb, 2) float32, C order)."""
    def codegen(context, builder, sig, args):
        w_, wo_, nb_, c_, sc_, mn_, dd_ = args
        zero = ir.Constant(I64, 0)
        ptr = lambda k, v, off=zero: byte_ptr(context, builder, sig.args[k], v, off)  # noqa: E731
        nb64 = _i64(builder, nb_)
        _decode_group(context, builder, ptr(0, w_, _i64(builder, wo_)), nb64, ptr(3, c_), ptr(4, sc_), ptr(5, mn_),
                      ptr(6, dd_), builder.mul(nb64, ir.Constant(I64, 256)), builder.mul(nb64, ir.Constant(I64, 64)),
                      builder.mul(nb64, ir.Constant(I64, 8)))
        return context.get_dummy_value()

    return types.void(weight, wo, nb, codes, sc, mn, dd), codegen

