"""The compiled decode step's attention with flash attention on (--flash-attn on): one token's query row against the
F16 KV cache as ggml_flash_attn_ext's CPU kernel computes it, bit for bit the op-by-op path's
(engine.ops.attention_flash, which GgmlNumerics._flash calls for a token run op by op).

One token is one query row, so it never takes the tiled kernel: it takes the one-row path (Q rounded to fp16, each
score ggml_vec_dot_f16 times the scale, an online softmax key by key with libm's expf, the V accumulator rounded to
fp16 after every key) and, over 512 cells (n_kv) or more with more than one llama.cpp thread, the split-KV path: the
cells cut in `chunk`-cell partials (attention_flash.kv_chunk, computed once per step by the plan), each partial's
maximum, sum and accumulator merged in chunk order. The keys a query does not see (past the token, before a sliding
window) are skipped, as the op's -inf mask entries are; a partial that sees none of them adds nothing.

`attend_flash` takes the decode step's `_attend` arguments (engine.runtime.decode_step) with `chunk` in place of the
thread shares: per-head q/k norms, RoPE, the K/V write into the fp16 cache, then the heads in parallel (a head's bits
are its own), the output quantized for the attention output product. ATTEND_FLASH holds both builds' orders
(engine.kernels.isa; [True]: the AVX2 build's vec_dot_f16 with 4 x 8 accumulators).
"""
from __future__ import annotations

import numpy as np

from engine.kernels.activations import HAVE_NUMBA
from engine.ops.attention_flash import kv_chunk

W8 = False  # the AVX2 build's order: True in ATTEND_FLASH[True] (engine.kernels.variants.lane_variants)

__all__ = ["chunk_of"]


def chunk_of(n_kv: int, threads: int) -> np.int64:
    """Cells per partial for one token over n_kv cells with llama.cpp's thread count (n_kv: no split)."""
    return np.int64(kv_chunk(1, n_kv, threads))


if HAVE_NUMBA:
    from numba import prange

    from engine.kernels.activations import f16_to_f32, f32_to_f16, fma32, njit
    from engine.kernels.floats.vec_dot import _dot_f16_row
    from engine.kernels.variants import lane_variants
    from engine.runtime.decode_step import _norm, _rope, quantize_into

    _ONE = np.float32(1.0)
    _ZERO = np.float32(0.0)
    _O = np.int64(0)

    @njit(cache=True)
    def write_kv(k, v, k_norm, v_norm, eps, kc, vc, pos, cos, sin, neox):
        """The token's keys (normed when k_norm is not empty, rotated) and values (normed when v_norm is not
        empty) into the fp16 cache rows at `pos`; nothing when k is empty (a layer reading another's rows)."""
        hkv, _, d = kc.shape
        tmp = np.empty(d, np.float32)
        kr = np.empty(d, np.float32)
        for h in range(hkv if k.shape[0] else 0):
            if k_norm.shape[0]:
                _norm(k, h * d, d, k_norm, eps, tmp, _O)
                _rope(tmp, _O, d, cos, sin, neox, kr, _O)
            else:
                _rope(k, h * d, d, cos, sin, neox, kr, _O)
            for t in range(d):
                kc[h, pos, t] = f32_to_f16(kr[t])
            if v_norm.shape[0]:
                _norm(v, h * d, d, v_norm, eps, tmp, _O)
                for t in range(d):
                    vc[h, pos, t] = f32_to_f16(tmp[t])
            else:
                for t in range(d):
                    vc[h, pos, t] = f32_to_f16(v[h * d + t])

    def _attend_flash(q, k, v, q_norm, k_norm, v_norm, eps, kc, vc, pos, n_kv, window, cos, sin, neox, q_scale,
                      kq_scale, softcap, sinks, q_rot, o, vdt, xq, chunk):
        """Attention of the token at `pos` for one layer with ggml_flash_attn_ext's one-row (and split-KV) kernel.

        The arguments are decode_step._attend's (q (Hq*d,), k / v (Hkv*d,) or empty, the norm weights or empty,
        kc / vc the layer's fp16 cache rows (Hkv, capacity, d), n_kv llama.cpp's padded cell count (unused: the
        chunks are cut by the caller), window 0 or the sliding window, the scales, softcap 0 or the cap, sinks (Hq,)
        or empty, q_rot (Hq, d) the rotated unscaled queries out, o (1, Hq*d) the output, xq its bytes as vdt) with
        `chunk` the cells per partial (n_kv or more: one partial, the plain one-row path).
        """
        step = 32 if W8 else 64  # vec_dot_f16's four registers
        write_kv(k, v, k_norm, v_norm, eps, kc, vc, pos, cos, sin, neox)
        hkv, _, d = kc.shape
        hq = q.shape[0] // d
        group = hq // hkv
        n_keys = pos + 1
        lo = 0 if window <= 0 else max(0, pos - window + 1)  # causal_mask: pos - j < window
        eff = kq_scale / softcap if softcap > _ZERO else kq_scale  # the op divides its scale by the cap
        n_chunks = max(1, -(-n_keys // chunk))
        out = o[0]
        for h in prange(hq):
            kv = h // group
            qn = np.empty(d, np.float32)
            q16 = np.empty(d, np.float32)
            acc = np.empty(step, np.float32)
            vkq = np.empty(d, np.float32)
            total_v = np.zeros(d, np.float32)
            if q_norm.shape[0]:
                _norm(q, h * d, d, q_norm, eps, qn, _O)
                _rope(qn, _O, d, cos, sin, neox, q_rot[h], _O)
            else:
                _rope(q, h * d, d, cos, sin, neox, q_rot[h], _O)
            for t in range(d):  # ggml_scale (when asked), then from_float of K's vec_dot_type: Q in fp16
                qs = q_rot[h, t] * q_scale if q_scale != _ONE else q_rot[h, t]
                q16[t] = f16_to_f32(f32_to_f16(qs))
            total_m, total_s = np.float32(-np.inf), _ZERO
            for part in range(n_chunks):
                vkq[:] = _ZERO
                m, s_sum = np.float32(-np.inf), _ZERO
                for j in range(max(lo, part * chunk), min(n_keys, (part + 1) * chunk)):  # the visible keys only
                    s = _dot_f16_row(kc[kv, j], q16, acc) * eff
                    if softcap > _ZERO:
                        s = softcap * np.float32(np.tanh(s))
                    ms, vs = _ONE, _ONE
                    if s > m:  # a new maximum: the fp16 accumulator times expf(old - new), this key's weight 1
                        ms = np.float32(np.exp(m - s))
                        m = s
                        for c in range(d):  # ggml_vec_scale_f16
                            vkq[c] = f16_to_f32(f32_to_f16(vkq[c] * ms))
                    else:
                        vs = np.float32(np.exp(s - m))
                    for c in range(d):  # ggml_vec_mad_f16: fp16 in, one fma, fp16 out
                        vkq[c] = f16_to_f32(f32_to_f16(fma32(f16_to_f32(vc[kv, j, c]), vs, vkq[c])))
                    s_sum = fma32(s_sum, ms, vs)  # S*ms + vs contracted (-ffp-contract=fast)
                if sinks.shape[0] and part == 0:  # the sink joins the first chunk's maximum and sum
                    sink = sinks[h]
                    ms, vs = _ONE, _ONE
                    if sink > m:
                        ms = np.float32(np.exp(m - sink))
                        m = sink
                        for c in range(d):
                            vkq[c] = vkq[c] * ms
                    else:
                        vs = np.float32(np.exp(sink - m))
                    s_sum = fma32(s_sum, ms, vs)
                if n_chunks == 1:
                    total_m, total_s = m, s_sum
                    total_v[:] = vkq
                elif s_sum != _ZERO:  # ggml_flash_attn_ext_reduce_partials, chunk by chunk
                    new_m = max(total_m, m)
                    old_scale = np.float32(np.exp(total_m - new_m))
                    new_scale = np.float32(np.exp(m - new_m))
                    for c in range(d):  # a*b + c*d contracted as fma(a, b, c*d)
                        total_v[c] = fma32(total_v[c], old_scale, vkq[c] * new_scale)
                    total_s = fma32(total_s, old_scale, s_sum * new_scale)
                    total_m = new_m
            inv = _ZERO if total_s == _ZERO else _ONE / total_s
            for c in range(d):
                out[h * d + c] = total_v[c] * inv
        quantize_into(vdt, o, xq)

    ATTEND_FLASH = lane_variants(_attend_flash, cache=True, parallel=True)  # a late kernel, as the whole step
