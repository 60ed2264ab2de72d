"""Flash attention over a quantized K and V cache (Q8_0, Q4_0) as ggml-cpu computes it, bit for bit (ggml numerics).

llama.cpp quantizes the V cache only with flash attention on (`-ctk q8_0 -ctv q8_0 -fa on`, a common way to halve
the cache), and ggml_compute_forward_flash_attn_ext_f16 then takes its one-row kernel for every batch and every
token: the tiled and split-KV paths are for F16 / F32 caches only. Per query row (ggml_compute_forward_flash_attn_
ext_f16_one_chunk), with K's type's vec_dot_type (Q8_0 for Q8_0 and Q4_0 K):

- Q is converted by that type's from_float (quantize_row_q8_0), once per row;
- each visible key's score is K's vec_dot of its cache row with that Q (ggml_vec_dot_q8_0_q8_0 / _q4_0_q8_0: the
  engine's legacy product kernels, which follow the build's reduction), times the scale (then tanhf and the cap);
- the online softmax key by key with libm's expf: a new maximum scales the float32 accumulator by expf(old - new)
  (ggml_vec_scale_f32: a multiply per element), any other key weighs expf(s - max); V's row is converted to float
  by its type's to_float and added with ggml_vec_mad_f32 (one fused multiply-add per element); the sum
  S = S*ms + vs is one fused multiply-add (GCC's -ffp-contract=fast);
- sinks (gpt-oss) join the maximum and sum after the keys, and the accumulator is multiplied by 1/S.

Around the op, llama.cpp's graph rotates q and k (and v) by a Walsh-Hadamard matrix when the cache is quantized
(engine.quant.hadamard: k and v before they are stored, q here) and the output back: `rotated`.

Masked keys (the causal mask, a sliding window, the padding past the cached cells) are skipped before their
product, so the kernel runs over the cached keys only and its numbers do not depend on llama.cpp's padding or
thread count.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.kernels.activations import HAVE_NUMBA, KERNEL_LOCK
from engine.kernels.dispatch import quantize_activation
from engine.kernels.legacy.family import GEMM
from engine.quant import dequantize_rows, hadamard
from engine.quant.types import GGMLType

F32 = npt.NDArray[np.float32]
TYPES = (GGMLType.Q8_0, GGMLType.Q4_0)  # the quantized cache types the engine stores (engine.cache)
_NO_SINKS = np.zeros(0, np.float32)

__all__ = ["TYPES", "flash_attention_quant"]


if HAVE_NUMBA:
    from engine.kernels.activations import fma32, njit, prange
    from engine.ops.attention_flash import join_sink

    _ONE = np.float32(1.0)
    _ZERO = np.float32(0.0)

    @njit(cache=True, parallel=True)
    def _online_softmax(scores, values, mask, eff, softcap, sinks, out):  # pragma: no cover - compiled
        """out (Hq, T, d) from the raw scores (Hq, T, n) of every query row against the n cached keys, the values as
        float (Hkv, n, d), mask (T, n) True where visible: the one-row kernel's loop after its products."""
        hq, t, n = scores.shape
        d = values.shape[2]
        group = hq // values.shape[0]
        for task in prange(hq * t):
            h, i = task // t, task % t
            v = values[h // group]
            acc = np.zeros(d, np.float32)
            m, total = np.float32(-np.inf), _ZERO
            for j in range(n):
                if not mask[i, j]:
                    continue  # a -inf mask entry: skipped before its product
                s = scores[h, i, j] * eff
                if softcap > _ZERO:
                    s = softcap * np.float32(np.tanh(s))
                ms, vs = _ONE, _ONE
                if s > m:  # a new maximum: the accumulator times expf(old - new), this key's weight 1
                    ms = np.float32(np.exp(m - s))
                    m = s
                    for c in range(d):  # ggml_vec_scale_f32
                        acc[c] = acc[c] * ms
                else:
                    vs = np.float32(np.exp(s - m))
                for c in range(d):  # ggml_vec_mad_f32: y += x * v, one fused multiply-add
                    acc[c] = fma32(v[j, c], vs, acc[c])
                total = fma32(total, ms, vs)
            if sinks.shape[0]:
                total = join_sink(acc, m, total, sinks[h])
            inv = _ZERO if total == _ZERO else _ONE / total
            for c in range(d):
                out[h, i, c] = acc[c] * inv


def flash_attention_quant(q: F32, k_rows: np.ndarray, v_rows: np.ndarray, qtype: GGMLType, n_keys: int,
                          mask: npt.NDArray[np.bool_], scale: float, softcap: float | None = None,
                          sinks: F32 | None = None, rotated: bool = False) -> F32:
    """ggml_flash_attn_ext's output (Hq, T, d) for queries q (Hq, T, d) over the first n_keys cached keys and values
    stored as `qtype` blocks (Hkv, >= n_keys, row bytes); mask (T, >= n_keys) True where visible; softcap the logit
    cap (Gemma 2), sinks (Hq,) gpt-oss's. Compiled kernels only (engine.ops.attention_flash.available); the caller
    holds KERNEL_LOCK."""
    if qtype not in TYPES:
        raise ValueError(f"no flash attention over a {qtype.name} cache")
    hq, t, d = q.shape
    hkv = k_rows.shape[0]
    group = hq // hkv
    q = np.ascontiguousarray(q, np.float32)
    n_k, n_v = (hadamard.k_size(d), hadamard.v_size(d)) if rotated else (0, 0)
    if n_k:
        q = hadamard.fwht(q, n_k)
    xq = quantize_activation(qtype, q.reshape(hq * t, d)).reshape(hkv, group * t, -1)  # from_float of vec_dot_type
    scores = np.empty((hkv, group * t, n_keys), np.float32)
    values = np.empty((hkv, n_keys, d), np.float32)
    gemm = GEMM[qtype]
    for kv in range(hkv):  # ggml's vec_dot of every key row with every query row of the head's group
        keys, rows = np.ascontiguousarray(k_rows[kv, :n_keys]), np.ascontiguousarray(xq[kv])
        with KERNEL_LOCK:
            gemm(keys, rows, scores[kv])
        values[kv] = dequantize_rows(np.ascontiguousarray(v_rows[kv, :n_keys]), qtype)  # to_float
    out = np.empty(q.shape, np.float32)
    cap = np.float32(softcap or 0.0)
    eff = np.float32(scale) / cap if cap > 0 else np.float32(scale)  # the op divides its scale by the cap
    extra = _NO_SINKS if sinks is None else np.ascontiguousarray(sinks, np.float32)
    with KERNEL_LOCK:
        _online_softmax(scores.reshape(hq, t, n_keys), values, np.ascontiguousarray(mask[:, :n_keys]), eff, cap,
                        extra, out)
    return hadamard.fwht(out, n_v) if n_v else out
