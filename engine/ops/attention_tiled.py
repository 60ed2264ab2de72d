"""Tiled attention with an online softmax (FlashAttention's recurrence), for long prefills.

The plain path materialises a (heads, T, S) score matrix. This one walks the keys in tiles of `tile`
columns, keeping per query row a running maximum m, a running sum l of exp(score - m) and an unnormalised
output acc; when a tile raises the maximum, the old sum and output are rescaled by exp(m_old - m_new).
The result equals softmax(QK^T * scale + mask) V up to float32 rounding, while holding only
(heads, T, tile) scores at a time.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]


def attention_tiled(
    q: F32, k: F32, v: F32, q_pos: npt.NDArray[np.int64], scale: float, window: int | None = None, tile: int = 256
) -> F32:
    """Grouped-query causal attention over keys 0..S-1 in tiles. q (Hq, T, d), k/v (Hkv, S, d); returns (Hq, T, d)."""
    hq, t, d = q.shape
    hkv, s, _ = k.shape
    g = hq // hkv
    qg = q.reshape(hkv, g * t, d) * np.float32(scale)  # (Hkv, G*T, d)
    pos = np.tile(q_pos, g)  # query position of each row of qg
    m = np.full((hkv, g * t, 1), -np.inf, dtype=np.float32)
    l = np.zeros((hkv, g * t, 1), dtype=np.float32)
    acc = np.zeros((hkv, g * t, d), dtype=np.float32)
    lo_needed = int(q_pos.min()) - (window - 1) if window is not None else 0
    hi_needed = int(q_pos.max()) + 1
    for j0 in range(max(0, lo_needed - lo_needed % tile), min(s, hi_needed), tile):
        j1 = min(j0 + tile, s)
        kj = np.arange(j0, j1)
        ok = kj[None, :] <= pos[:, None]
        if window is not None:
            ok &= (pos[:, None] - kj[None, :]) < window
        if not ok.any():
            continue
        sc = qg @ k[:, j0:j1].transpose(0, 2, 1)  # (Hkv, G*T, tile)
        sc = np.where(ok[None], sc, np.float32(-np.inf))
        m_new = np.maximum(m, sc.max(-1, keepdims=True))
        safe = np.where(np.isfinite(m_new), m_new, np.float32(0.0))
        p = np.exp(sc - safe)
        alpha = np.exp(np.where(np.isfinite(m), m - safe, np.float32(-np.inf)))
        l = l * alpha + p.sum(-1, keepdims=True)
        acc = acc * alpha + p @ v[:, j0:j1]
        m = m_new
    out = acc / np.where(l > 0, l, np.float32(1.0))
    return out.reshape(hq, t, d)
