"""Attention with an additive bias on the scores (T5's relative position bias), in both numerics.

llama.cpp's build_attn_mha adds `kq_b` to the raw scores (ggml_add) before ggml_soft_max_ext(kq, mask, kq_scale), so
a weight is softmax((q.k + bias) * scale + mask). T5 attends with kq_scale 1 and three kinds of keys:

- the encoder's own keys, bidirectional, held in no cache: K and V are the float32 product outputs, and the
  score row is exactly as long as the encoder input (no padding, so the products' kernels follow its length);
- the decoder's keys in the KV cache (F16 by default), causal, the row padded to llama.cpp's n_kv;
- the cross-attention keys and values, computed from the encoder output once per encoding, float32, no bias.

`reference` is the textbook maths (float32 numerics); `ggml` is llama.cpp's CPU products, softmax and padding bit
for bit (engine.ops.attention_ggml's K*q and V*w kernels and engine.ops.ggml's soft_max). `NUMERICS` maps a numerics
name to its pair of (attention, read the cache), so a model picks its pair once by the name it was loaded with.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.ops import attention_ggml
from engine.ops.ggml import soft_max
from engine.ops.reference import softmax

F32 = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]
BiasedAttention = Callable[..., tuple[F32, F32]]
CacheRead = Callable[[KVCache, int, int], tuple[np.ndarray, np.ndarray, int | None]]


def reference(
    q: F32, keys: np.ndarray, values: np.ndarray, bias: F32 | None, mask: Mask | None, scale: float = 1.0,
    n_kv: int | None = None,
) -> tuple[F32, F32]:
    """softmax((q k^T + bias) * scale, masked) v in float32. q (Hq, T, d); keys / values (Hkv, S, d); bias (Hq, T, S)
    or None; mask (T, S), True where visible, or None. Returns (out (Hq, T, d), weights (Hq, T, S))."""
    hq, t, d = q.shape
    k = np.asarray(keys, np.float32)
    v = np.asarray(values, np.float32)
    hkv = k.shape[0]
    g = hq // hkv
    scores = (q.reshape(hkv, g * t, d) @ k.transpose(0, 2, 1)).reshape(hq, t, -1)  # (Hq, T, S)
    if bias is not None:
        scores = scores + bias
    if scale != 1.0:
        scores = scores * np.float32(scale)
    if mask is not None:
        scores = np.where(mask[None], scores, np.float32(-np.inf))
    w = softmax(scores).astype(np.float32, copy=False)
    out = (w.reshape(hkv, g * t, -1) @ v).reshape(hq, t, d)  # (Hq, T, d)
    return out, w


def ggml(
    q: F32, keys: np.ndarray, values: np.ndarray, bias: F32 | None, mask: Mask | None, scale: float = 1.0,
    n_kv: int | None = None,
) -> tuple[F32, F32]:
    """kq = mul_mat(K, q); kq + kq_b; soft_max_ext(kq, mask, scale); mul_mat(V^T, kq), with ggml-cpu's kernels.

    keys / values float32 (no cache: the row is S long) or float16 (the F16 cache: pass llama.cpp's padded
    `n_kv`). Returns (out (Hq, T, d), weights (Hq, T, S)), the weights without the padding.
    """
    s = keys.shape[1]
    n_kv = s if n_kv is None else n_kv
    scores = attention_ggml.kq(q, keys, n_kv)  # (Hq, T, n_kv)
    if bias is not None:  # ggml_add(kq, kq_b): padded keys are masked, their bias does not matter
        scores[..., :s] = scores[..., :s] + bias
    visible = np.zeros((q.shape[1], n_kv), bool)
    visible[:, :s] = True if mask is None else mask
    w = soft_max(scores, scale, visible)
    return attention_ggml.kqv(w, values), w[..., :s]


def read_float32(cache: KVCache, layer: int, end: int) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Keys and values [0, end) of a cache layer as float32 (no padding)."""
    return cache.keys(layer, end), cache.values(layer, end), None


def read_ggml(cache: KVCache, layer: int, end: int) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Keys and values [0, end) as stored (float16 for an F16 cache) and llama.cpp's padded n_kv; quantized rows
    are read back as float32 (llama.cpp needs flash attention for a quantized V cache, which a score bias rules out)."""
    stored = cache.stored(layer, end)
    if stored is None:
        return cache.keys(layer, end), cache.values(layer, end), None
    return stored[0], stored[1], attention_ggml.kv_length(end, cache.n_ctx)


NUMERICS: dict[str, tuple[BiasedAttention, CacheRead]] = {
    "float32": (reference, read_float32),
    "ggml": (ggml, read_ggml),
}
