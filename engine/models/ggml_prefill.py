"""A prompt's attention over an fp16 KV cache in one compiled call, with ggml-cpu's exact bits (ggml numerics).

For a batch of T >= 2 queries llama.cpp runs both attention products through llamafile's tinyBLAS (see
engine.models.ggml_attention): K*q with q rounded to fp16, one 16-lane fused multiply-add accumulator per
score, reduced as _mm512_reduce_add_ps; soft_max_ext with ggml_v_expf over 16-float chunks summed in double;
V*w with the weights rounded to fp16, again 16 lanes per output. The NumPy path does the same with a dozen
array passes and conversions per layer; `attend_f16` does it per (head, query) row on numba's threads,
reading the cache's fp16 bits where they lie. `takes` says when llama.cpp's kernels are the ones above
(otherwise the NumPy path runs); the results are the NumPy path's bit for bit (tests hold them together).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.kernels.activations import HAVE_NUMBA

F32 = npt.NDArray[np.float32]
LANES = 16


def takes(n_queries: int, head_dim: int, n_kv: int) -> bool:
    """Whether llama.cpp multiplies both attention products of this batch with tinyBLAS and its softmax rows
    have no scalar tail: T >= 2, head_dim and n_kv multiples of 16."""
    return n_queries >= 2 and head_dim % LANES == 0 and n_kv % LANES == 0


if HAVE_NUMBA:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from engine.kernels.activations import f16_to_f32, f32_to_f16, njit, prange
    from engine.kernels.simd import F32, I16, I64, byte_ptr, call_intrinsic, load, shuffle, vec
    from engine.models.ggml_kernels import reduce16, reduce16_columns, v_expf1

    # numba leaves a 16-lane loop scalar (LLVM unrolls it first), so the two products are explicit vector code
    _F16X = vec(F32, LANES)

    def _fp16_lanes(b, p, i):
        """16 fp16 values at element 16 * i of the uint16 data at p, as <16 x float> (vcvtph2ps)."""
        raw = load(b, b.gep(p, [b.mul(i, ir.Constant(I64, 2 * LANES))]), vec(I16, LANES))
        return b.fpext(b.bitcast(raw, vec(ir.HalfType(), LANES)), _F16X)

    @intrinsic
    def _kq16(typingctx, k, ko, q, d):
        """One score in tinyBLAS order: acc = fma(fp16 k[c ...], q[c ...], acc) sixteen lanes at a time down the d
        values of the key at byte ko of k, then reduce16's sum of the lanes (_mm512_reduce_add_ps)."""
        def codegen(context, b, signature, args):
            k_, ko_, q_, d_ = args
            pk = byte_ptr(context, b, signature.args[0], k_, ko_)
            pq = byte_ptr(context, b, signature.args[2], q_, ir.Constant(I64, 0))
            acc = cgutils.alloca_once_value(b, ir.Constant(_F16X, None))
            with cgutils.for_range(b, b.sdiv(d_, ir.Constant(I64, LANES))) as loop:
                qv = load(b, b.gep(pq, [b.mul(loop.index, ir.Constant(I64, 4 * LANES))]), _F16X)
                kv = _fp16_lanes(b, pk, loop.index)
                b.store(call_intrinsic(b, "llvm.fma.v16f32", _F16X, [kv, qv, b.load(acc)]), acc)
            a = b.load(acc)
            t = b.fadd(shuffle(b, a, range(8)), shuffle(b, a, range(8, 16)))
            u = b.fadd(shuffle(b, t, range(4)), shuffle(b, t, range(4, 8)))
            lane = [b.extract_element(u, ir.Constant(ir.IntType(32), n)) for n in range(4)]
            return b.fadd(b.fadd(lane[0], lane[2]), b.fadd(lane[1], lane[3]))

        return types.float32(k, ko, q, d), codegen

    @intrinsic
    def _vw16(typingctx, v, vo, w, acc, ao, d):
        """acc[c] = fma(fp16 v[c], w, acc[c]) for the d values of the value at byte vo of v and the accumulator
        row at byte ao of acc, sixteen at a time (V*w's lanes)."""
        def codegen(context, b, signature, args):
            v_, vo_, w_, acc_, ao_, d_ = args
            pv = byte_ptr(context, b, signature.args[0], v_, vo_)
            pa = byte_ptr(context, b, signature.args[3], acc_, ao_)
            wv = b.insert_element(ir.Constant(_F16X, None), w_, ir.Constant(ir.IntType(32), 0))
            wv = shuffle(b, wv, [0] * LANES)
            with cgutils.for_range(b, b.sdiv(d_, ir.Constant(I64, LANES))) as loop:
                pc = b.bitcast(b.gep(pa, [b.mul(loop.index, ir.Constant(I64, 4 * LANES))]), _F16X.as_pointer())
                vv = _fp16_lanes(b, pv, loop.index)
                b.store(call_intrinsic(b, "llvm.fma.v16f32", _F16X, [vv, wv, b.load(pc, align=4)]), pc, align=4)
            return context.get_dummy_value()

        return types.void(v, vo, w, acc, ao, d), codegen

    @njit(cache=True, parallel=True)
    def _attend_f16(q, kc, vc, n_keys, mask, scale, n_kv, out):
        hq, t, d = q.shape
        group = hq // kc.shape[0]
        n_eff = min(n_kv, n_keys + 63 - (n_keys + 63) % 64)  # past the cached keys the padding adds exact zeros
        for task in prange(hq * t):
            h = task // t
            i = task % t
            kv = h // group
            q16 = np.empty(d, np.float32)
            for c in range(d):  # the fp16 work buffer of K*q
                q16[c] = f16_to_f32(f32_to_f16(q[h, i, c]))
            e = np.zeros(n_kv, np.float32)
            top = -np.inf
            for j in range(n_keys):
                if not mask[i, j]:
                    e[j] = -np.inf
                    continue
                s = _kq16(kc, kv * kc.strides[0] + j * kc.strides[1], q16, d) * scale
                e[j] = s
                if s > top:  # noqa: PLR1730 - maxps: a NaN score never becomes the maximum
                    top = s
            total = 0.0
            for c in range(0, n_kv, LANES):
                if c >= n_keys:
                    break  # the padding: v_expf(-inf) = 0 in every later chunk
                for lane in range(LANES):
                    j = c + lane
                    e[j] = v_expf1(e[j] - top) if j < n_keys else np.float32(0.0)
                total += np.float64(reduce16(e, c))
            inv = np.float32(1.0 / total)
            for j in range(n_keys):  # the fp16 work buffer of V*w
                e[j] = f16_to_f32(f32_to_f16(e[j] * inv))
            lanes = np.zeros((LANES, d), np.float32)
            for j in range(min(n_keys, n_eff)):
                _vw16(vc, kv * vc.strides[0] + j * vc.strides[1], e[j], lanes, (j % LANES) * d * 4, d)
            reduce16_columns(lanes, out[h, i])  # _mm512_reduce_add_ps of each output's 16 lanes


def attend_f16(q: F32, k_bits: np.ndarray, v_bits: np.ndarray, n_keys: int, mask: npt.NDArray[np.bool_],
               scale: float, n_kv: int) -> F32:
    """Attention output (Hq, T, d) of queries q (Hq, T, d) over the first n_keys cached keys and values, given
    as fp16 bits (Hkv, >= n_keys, d) uint16; mask (T, >= n_keys) True where visible; n_kv llama.cpp's padded
    key count (the softmax row length). Only where `takes` holds; the caller holds KERNEL_LOCK."""
    out = np.empty(q.shape, np.float32)
    if k_bits.strides[2] != 2 or v_bits.strides[2] != 2:  # the kernel reads each row's d values as one run
        k_bits, v_bits = np.ascontiguousarray(k_bits), np.ascontiguousarray(v_bits)
    _attend_f16(np.ascontiguousarray(q, np.float32), k_bits, v_bits, n_keys, np.ascontiguousarray(mask),
                np.float32(scale), n_kv, out)
    return out
