"""A prompt's attention over an fp16 KV cache in one compiled call, with ggml-cpu's exact bits (ggml numerics).

For a batch of T >= 2 queries llama.cpp runs both attention products through llamafile's tinyBLAS (see
engine.ops.attention_ggml): K*q with q rounded to fp16, one 16-lane fused multiply-add accumulator per
score, reduced as _mm512_reduce_add_ps; soft_max_ext with ggml_v_expf over 16-float chunks summed in double;
V*w with the weights rounded to fp16, again 16 lanes per output. The NumPy path does the same with a dozen
array passes and conversions per layer; `attend_f16` does it per head and block of four queries on numba's
threads (engine.ops.attention_blocks: each key and value row read once for the four, each output in its own
order), reading the cache's fp16 bits where they lie. SmolLM2, an 8,160-token prompt, AMD EPYC, 2 threads: the
attention 54.5 s of 65.9 s when a query at a time read every row. `takes` says when llama.cpp's kernels are the ones above
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
    from numba import get_num_threads, njit

    from engine.kernels.activations import f16_to_f32, f32_to_f16, prange
    from engine.kernels.variants import lane_variants
    from engine.ops.attention_blocks import QB, kq8, kq16, kqv8, kqv16
    from engine.ops.ggml_kernels import reduce_columns, reduce_lanes, v_expf_lane

    def _attend_f16(q, kc, vc, n_keys, mask, scale, softcap, sinks, n_kv, threads, out):
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
        blocks = (t + QB - 1) // QB
        ms = mask.strides[0]
        n_tasks = hq * blocks  # a head's block of QB queries: each key and value row read once for them
        workers = min(n_tasks, 8 * threads)  # each with its buffers: a task's own 128 KiB row buffer
        for w in prange(workers):  # (8,192 keys) came from mmap, page-faulted in and unmapped every time
            q16 = np.empty((QB, d + 16), np.float32)  # padded rows: never 4 KiB apart (attention_blocks)
            e = np.empty((QB, n_kv + 16), np.float32)  # only the keys a row sees are written, and read
            acc = np.empty((QB, lanes + 1, d), np.float32)  # query r's lanes: acc[r, :lanes]
            for task in range(w * n_tasks // workers, (w + 1) * n_tasks // workers):
                h = task // blocks
                b0 = (task % blocks) * QB
                nq = min(QB, t - b0)
                _block(q, kc, vc, n_keys, mask, ms, first, last, h, h // group, b0, nq, scale, softcap, sinks, n_kv,
                       n_eff, q16, e, acc, out, W8)

    @njit(cache=True, forceinline=True, error_model="numpy")
    def _block(q, kc, vc, n_keys, mask, ms, first, last, h, kv, b0, nq, scale, softcap, sinks, n_kv, n_eff, q16, e,
               acc, out, w8):
        """Queries b0 .. b0 + nq - 1 of head h (K and V head kv): scores, softmax rows, V*w and the outputs, in the
        AVX2 build's order with w8 (a constant where the caller's copy inlines it)."""
        lanes = 8 if w8 else 16
        d = q.shape[2]
        for r in range(QB):  # the fp16 work buffer of K*q (rows past nq: query b0's, never read)
            src = b0 + r if r < nq else b0
            for c in range(d):
                q16[r, c] = f16_to_f32(f32_to_f16(q[h, src, c]))
        lo, hi = n_keys, 0
        for r in range(nq):
            lo = min(lo, first[b0 + r])
            hi = max(hi, last[b0 + r] + 1)
        if hi > lo:  # the raw scores of every key any of the block's queries sees
            if w8:
                kq8(kc, kv * kc.strides[0] + lo * kc.strides[1], kc.strides[1], hi - lo, q16, 0, q16.strides[0],
                    d, e, lo * 4, e.strides[0])
            else:
                kq16(kc, kv * kc.strides[0] + lo * kc.strides[1], kc.strides[1], hi - lo, q16, 0, q16.strides[0],
                     d, e, lo * 4, e.strides[0])
        for r in range(nq):
            i = b0 + r
            row = e[r]
            lo_i, hi_i = first[i], last[i] + 1
            n_i = max(hi_i - lo_i, 0)
            seg = row[lo_i:lo_i + n_i]  # the keys the row sees, indexed from 0 (no negative-index wraparound:
            seen = mask[i, lo_i:lo_i + n_i]  # the loops below compile to vector code)
            if softcap > np.float32(0.0):  # Gemma 2: ggml_scale by 1/cap, ggml_tanh (tanhf), ggml_scale by cap
                for k in range(n_i):
                    seg[k] = np.float32(np.tanh(seg[k] * (np.float32(1.0) / softcap))) * softcap
            top = np.float32(-np.inf)
            for k in range(n_i):
                s = seg[k] * scale
                ok = seen[k]
                seg[k] = s if ok else np.float32(-np.inf)
                if ok and s > top:  # noqa: PLR1730 - maxps: a NaN score never becomes the maximum
                    top = s
            if sinks.shape[0] and not top > sinks[h]:  # gpt-oss: MAX(max, sink)
                top = sinks[h]
            c0 = lo_i - lo_i % lanes  # the chunks [c0, c1) cover the row's keys; the lanes outside them add +0.0
            c1 = c0 + (hi_i - c0 + lanes - 1) // lanes * lanes if n_i else c0
            for k in range(lo_i - c0):
                row[c0 + k] = np.float32(0.0)
            for k in range(n_i):  # one branch-free pass: vector code (the sums below would keep it scalar)
                seg[k] = v_expf_lane(seg[k] - top, w8)
            for k in range(c1 - c0 - (lo_i - c0) - n_i):
                row[lo_i + n_i + k] = np.float32(0.0)
            total = 0.0
            for c in range(c0, c1, lanes):  # each chunk's register sum, added in double in order
                total += np.float64(reduce_lanes(row, c, w8))
            if sinks.shape[0]:  # the sink's term, libm's expf (numba's float32 exp is the same call)
                total += np.float64(np.exp(sinks[h] - top))
            inv = np.float32(1.0 / total)
            for k in range(n_i):  # the fp16 work buffer of V*w
                seg[k] = f16_to_f32(f32_to_f16(seg[k] * inv))
        acc[:] = np.float32(0.0)
        top_key = min(hi, n_eff)
        if top_key > lo:  # a masked key's weight is 0: its fmas would add only zeros (at most a zero's sign)
            if w8:
                kqv8(vc, kv * vc.strides[0] + lo * vc.strides[1], vc.strides[1], lo, top_key - lo, e, lo * 4,
                     e.strides[0], mask, b0 * ms + lo, ms, nq, acc, 0, acc.strides[0], d)
            else:
                kqv16(vc, kv * vc.strides[0] + lo * vc.strides[1], vc.strides[1], lo, top_key - lo, e, lo * 4,
                      e.strides[0], mask, b0 * ms + lo, ms, nq, acc, 0, acc.strides[0], d)
        for r in range(nq):
            reduce_columns(acc[r, :lanes], out[h, b0 + r], w8)  # each output's lanes reduced as one register

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
                np.ascontiguousarray(sinks, np.float32), n_kv, get_num_threads(), out)
    return out
