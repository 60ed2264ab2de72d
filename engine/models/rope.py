"""Rotary position embeddings as ggml applies them: 'norm' rotates adjacent pairs, 'neox' rotates halves."""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]


def rope_freqs(rope_dim: int, base: float) -> npt.NDArray[np.float64]:
    """theta_i = base^(-2i/rope_dim) for i in [0, rope_dim/2): one angular frequency per rotated pair."""
    i = np.arange(rope_dim // 2, dtype=np.float64)
    return base ** (-2.0 * i / rope_dim)


def rope_angles(positions: npt.ArrayLike, freqs: npt.NDArray[np.float64]) -> tuple[F32, F32]:
    """cos and sin of pos * theta_i, (T, rope_dim/2) float32."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * freqs[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(x: F32, cos: F32, sin: F32, mode: str) -> F32:
    """Rotate x (H, T, head_dim) by the angles (T, rope_dim/2); dims past rope_dim pass through."""
    n = cos.shape[-1]
    out = x.copy()
    if mode == "norm":  # pairs (0,1), (2,3), ... as ggml_rope with LLAMA_ROPE_TYPE_NORM
        x0 = x[..., 0 : 2 * n : 2]
        x1 = x[..., 1 : 2 * n : 2]
        out[..., 0 : 2 * n : 2] = x0 * cos - x1 * sin
        out[..., 1 : 2 * n : 2] = x0 * sin + x1 * cos
    elif mode == "neox":  # pairs (i, i + n) as LLAMA_ROPE_TYPE_NEOX
        x0 = x[..., :n]
        x1 = x[..., n : 2 * n]
        out[..., :n] = x0 * cos - x1 * sin
        out[..., n : 2 * n] = x0 * sin + x1 * cos
    else:
        raise ValueError(f"unknown rope mode {mode!r}")
    return out
