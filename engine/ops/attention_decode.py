"""One new token's attention in one compiled call: RoPE on q and k, the KV-cache write, scores, softmax, V.

A decode step (T = 1) otherwise spends more time in two dozen small NumPy calls per layer (reshapes, the
rotation, converting the whole F16 cache to float32, the softmax) than in the matrix products. Here the cache
rows are read where they lie (fp16 bits or float32), and the rounding ggml-cpu applies without flash attention is
applied on request: q converted to fp16 before K*q when the cache is F16, the softmax weights converted to fp16
before V*weights. The NumPy path in engine/ops/reference.py stays the reference (and runs where numba is missing,
for quantized caches, and for prompts).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from engine.kernels.activations import HAVE_NUMBA, f16_to_f32, f32_to_f16, njit

F32 = npt.NDArray[np.float32]

if HAVE_NUMBA:
    from numba.core import types as _nbt
    from numba.extending import overload

    def _load(x):  # pragma: no cover - replaced by the overload inside compiled code
        raise NotImplementedError

    def _store(x, like):  # pragma: no cover
        raise NotImplementedError

    @overload(_load, inline="always")
    def _load_impl(x):
        if x == _nbt.uint16:
            return lambda x: f16_to_f32(x)
        return lambda x: np.float32(x)

    @overload(_store, inline="always")
    def _store_impl(x, like):
        if like == _nbt.uint16:
            return lambda x, like: f32_to_f16(x)
        return lambda x, like: np.float32(x)

    @njit(cache=True, inline="always")
    def _to_half_and_back(x):
        return f16_to_f32(f32_to_f16(x))

    @njit(cache=True, inline="always")
    def _rotate(src, dst, cos, sin, neox):
        """dst = src rotated by (cos, sin) per pair, ggml's NORM (adjacent) or NEOX (halves) layout."""
        n = cos.shape[0]
        for i in range(src.shape[0]):
            dst[i] = src[i]
        for i in range(n):
            a, b = (i, i + n) if neox else (2 * i, 2 * i + 1)
            x0, x1 = src[a], src[b]
            dst[a] = x0 * cos[i] - x1 * sin[i]
            dst[b] = x0 * sin[i] + x1 * cos[i]

    # the sums may be reassociated (vectorised): the order is not ggml's either way, and NaN/inf keep their meaning
    @njit(cache=True, fastmath={"reassoc", "contract"})
    def _attend_one(q, k, v, kc, vc, pos, cos, sin, neox, q_scale, scale, window, round_q, round_w, q_out, out):
        n_heads, d = q.shape
        n_kv = k.shape[0]
        group = n_heads // n_kv
        kr = np.empty(d, np.float32)
        for h in range(n_kv):  # rotate the new key, then store both rows in the cache's own type
            _rotate(k[h], kr, cos, sin, neox)
            for t in range(d):
                kc[h, pos, t] = _store(kr[t], kc[h, pos, t])
                vc[h, pos, t] = _store(v[h, t], vc[h, pos, t])
        lo = 0 if window <= 0 else max(0, pos - window + 1)
        n = pos + 1
        scores = np.empty(n, np.float32)
        qh = np.empty(d, np.float32)
        for h in range(n_heads):
            _rotate(q[h], q_out[h], cos, sin, neox)
            for t in range(d):
                x = q_out[h, t] * np.float32(q_scale) if q_scale != 1.0 else q_out[h, t]
                qh[t] = _to_half_and_back(x) if round_q else x
            kv = h // group
            top = -np.inf
            for j in range(lo, n):
                s = np.float32(0.0)
                for t in range(d):
                    s += qh[t] * _load(kc[kv, j, t])
                s *= np.float32(scale)
                scores[j] = s
                top = max(top, s)
            total = 0.0
            for j in range(lo, n):
                e = np.float32(np.exp(scores[j] - top))
                scores[j] = e
                total += e
            inv = np.float32(1.0 / total)
            for j in range(lo, n):
                w = scores[j] * inv
                scores[j] = _to_half_and_back(w) if round_w else w
            for t in range(d):
                acc = np.float32(0.0)
                for j in range(lo, n):
                    acc += scores[j] * _load(vc[kv, j, t])
                out[h, t] = acc


def available() -> bool:
    """Whether the compiled decode attention can run (numba present)."""
    return HAVE_NUMBA


def attend_one(
    q: F32, k: F32, v: F32, k_rows: np.ndarray, v_rows: np.ndarray, pos: int, cos: F32, sin: F32, neox: bool,
    q_scale: float, scale: float, window: int | None, round_q: bool, round_w: bool,
) -> tuple[F32, F32]:
    """Attention of the token at `pos`: q (Hq, d), k/v (Hkv, d) before RoPE; the cache rows (Hkv, capacity, d) as
    float32 or fp16 bits (uint16) get k (rotated) and v at `pos`. q is multiplied by q_scale after the rotation
    (Gemma scales the query, then attends with scale 1); the scores by `scale`.
    Returns (rotated q before q_scale (Hq, d), output (Hq, d))."""
    q_out = np.empty_like(q)
    out = np.empty_like(q)
    _attend_one(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v), k_rows, v_rows, pos,
                cos, sin, neox, q_scale, scale, window or 0, round_q, round_w, q_out, out)
    return q_out, out
