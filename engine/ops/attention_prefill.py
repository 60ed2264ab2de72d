"""A prompt's attention over an fp16 KV cache in one compiled call, with ggml-cpu's exact bits (ggml numerics).

For a batch of T >= 2 queries llama.cpp runs both attention products through llamafile's tinyBLAS (see
engine.ops.attention_ggml): K*q with q rounded to fp16, one 16-lane fused multiply-add accumulator per
score, reduced as _mm512_reduce_add_ps; soft_max_ext with ggml_v_expf over 16-float chunks summed in double;
V*w with the weights rounded to fp16, again 16 lanes per output. The NumPy path does the same with a dozen
array passes and conversions per layer; `attend_f16` does it per (head, query) row on numba's threads,
reading the cache's fp16 bits where they lie. `takes` says when llama.cpp's kernels are the ones above
(otherwise the NumPy path runs); the results are the NumPy path's bit for bit (tests hold them together).
In the AVX2 build's order (engine.kernels.isa) everything 16 wide above is 8 wide: tinyBLAS<8>, its hsum, the
softmax's 8-float chunks with the AVX2 v_expf.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.kernels import isa
from engine.kernels.activations import HAVE_NUMBA

F32 = npt.NDArray[np.float32]
_NO_SINKS = np.zeros(0, np.float32)
W8 = False  # the AVX2 build's order: True in _ATTEND[True] (engine.kernels.variants.lane_variants)


def takes(n_queries: int, head_dim: int, n_kv: int) -> bool:
    """Whether llama.cpp multiplies both attention products of this batch with tinyBLAS and its softmax rows
    have no scalar tail: T >= 2, head_dim and n_kv multiples of 16 (of 8 in the AVX2 build)."""
    lanes = isa.lanes()
    return n_queries >= 2 and head_dim % lanes == 0 and n_kv % lanes == 0


if HAVE_NUMBA:
    from engine.kernels.activations import f16_to_f32, f32_to_f16, prange
    from engine.kernels.variants import lane_variants
    from engine.kernels.floats.tinyblas import axpy8, axpy16, dot8, dot16
    from engine.ops.ggml_kernels import reduce_columns, reduce_lanes, v_expf_lane

    def _attend_f16(q, kc, vc, n_keys, mask, scale, softcap, sinks, n_kv, out):
        lanes = 8 if W8 else 16
        hq, t, d = q.shape
        group = hq // kc.shape[0]
        n_eff = min(n_kv, n_keys + 63 - (n_keys + 63) % 64)  # past the cached keys the padding adds exact zeros
        first = np.zeros(t, np.int64)  # each query's first and last visible key: a sliding window's row touches
        last = np.full(t, -1, np.int64)  # only the chunks around it (a chunk all masked adds exactly +0.0 anywhere)
        for i in prange(t):
            j = 0
            while j < n_keys and not mask[i, j]:
                j += 1
            first[i] = j
            j = n_keys - 1
            while j >= 0 and not mask[i, j]:
                j -= 1
            last[i] = j
        for task in prange(hq * t):
            h = task // t
            i = task % t
            kv = h // group
            q16 = np.empty(d, np.float32)
            for c in range(d):  # the fp16 work buffer of K*q
                q16[c] = f16_to_f32(f32_to_f16(q[h, i, c]))
            e = np.zeros(n_kv, np.float32)
            top = -np.inf
            lo, hi = first[i], last[i] + 1
            for j in range(lo, hi):
                if not mask[i, j]:
                    e[j] = -np.inf
                    continue
                at = kv * kc.strides[0] + j * kc.strides[1]
                s = dot8(kc, at, q16, 0, d) if W8 else dot16(kc, at, q16, 0, d)
                if softcap > np.float32(0.0):  # Gemma 2: ggml_scale by 1/cap, ggml_tanh (tanhf), ggml_scale by cap
                    s = np.float32(np.tanh(s * (np.float32(1.0) / softcap))) * softcap
                s = s * scale
                e[j] = s
                if s > top:  # noqa: PLR1730 - maxps: a NaN score never becomes the maximum
                    top = s
            if sinks.shape[0] and not top > sinks[h]:  # gpt-oss: MAX(max, sink)
                top = sinks[h]
            total = 0.0
            for c in range(lo - lo % lanes, min(n_kv, hi), lanes):  # the chunks outside [lo, hi) add +0.0
                for lane in range(lanes):
                    j = c + lane
                    e[j] = v_expf_lane(e[j] - top, W8) if lo <= j < hi else np.float32(0.0)
                total += np.float64(reduce_lanes(e, c, W8))
            if sinks.shape[0]:  # the sink's term, libm's expf (numba's float32 exp is the same call)
                total += np.float64(np.exp(sinks[h] - top))
            inv = np.float32(1.0 / total)
            for j in range(lo, hi):  # the fp16 work buffer of V*w
                e[j] = f16_to_f32(f32_to_f16(e[j] * inv))
            acc = np.zeros((lanes, d), np.float32)
            for j in range(lo, min(hi, n_eff)):
                if mask[i, j]:  # a masked key's weight is 0: its fmas would add only zeros (at most a zero's sign)
                    at = kv * vc.strides[0] + j * vc.strides[1]
                    if W8:
                        axpy8(vc, at, e[j], acc, (j % 8) * d * 4, d)
                    else:
                        axpy16(vc, at, e[j], acc, (j % 16) * d * 4, d)
            reduce_columns(acc, out[h, i], W8)  # each output's lanes reduced as one register

    _ATTEND = lane_variants(_attend_f16, cache=True, parallel=True)


def attend_f16(q: F32, k_bits: np.ndarray, v_bits: np.ndarray, n_keys: int, mask: npt.NDArray[np.bool_],
               scale: float, n_kv: int, softcap: float | None = None, sinks: F32 | None = None) -> F32:
    """Attention output (Hq, T, d) of queries q (Hq, T, d) over the first n_keys cached keys and values, given
    as fp16 bits (Hkv, >= n_keys, d) uint16; mask (T, >= n_keys) True where visible; n_kv llama.cpp's padded
    key count (the softmax row length); softcap (Gemma 2) caps the raw scores first; sinks (Hq,) (gpt-oss) join
    each row's maximum and sum. Only where `takes` holds;
    the caller holds KERNEL_LOCK."""
    out = np.empty(q.shape, np.float32)
    if k_bits.strides[2] != 2 or v_bits.strides[2] != 2:  # the kernel reads each row's d values as one run
        k_bits, v_bits = np.ascontiguousarray(k_bits), np.ascontiguousarray(v_bits)
    _ATTEND[bool(isa.w8())](np.ascontiguousarray(q, np.float32), k_bits, v_bits, n_keys, np.ascontiguousarray(mask),
                np.float32(scale), np.float32(softcap or 0.0), _NO_SINKS if sinks is None else
                np.ascontiguousarray(sinks, np.float32), n_kv, out)
    return out
