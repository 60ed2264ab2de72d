"""The compiled decode step's attention with flash attention on (--flash-attn on): one token's query row against the
F16 KV cache as ggml_flash_attn_ext's CPU kernel computes it, bit for bit the op-by-op path's
(engine.ops.attention_flash, which GgmlNumerics._flash calls for a token run op by op): both run a row with
attention_flash.one_row, and the step writes K and V with decode_step.write_kv, as the plain step does.

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

    from engine.kernels.activations import f16_to_f32, f32_to_f16
    from engine.kernels.variants import lane_variants
    from engine.ops.attention_flash import one_row
    from engine.runtime.decode_step import _norm, _rope, quantize_into, write_kv

    _ONE = np.float32(1.0)
    _ZERO = np.float32(0.0)
    _O = np.int64(0)
    _NO_MASK = np.zeros(0, np.bool_)  # one_row's mask row, unread: the keys a token sees are a range

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
            one_row(q16, kc[kv], vc[kv], lo, n_keys, False, _NO_MASK, eff, softcap, sinks.shape[0] > 0,
                    sinks[h] if sinks.shape[0] else _ZERO, chunk, acc, vkq, total_v, out[h * d : (h + 1) * d])
        quantize_into(vdt, o, xq)

    ATTEND_FLASH = lane_variants(_attend_flash, cache=True, parallel=True)  # a late kernel, as the whole step
