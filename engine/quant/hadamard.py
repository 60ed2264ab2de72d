"""The Walsh-Hadamard rotation llama.cpp applies around a quantized KV cache (llama-kv-cache.cpp's attn_rot_k /
attn_rot_v, llama_mul_mat_hadamard, ggml-cpu's ggml_compute_forward_fwht).

When the K cache is quantized and the head size is a multiple of 64, llama.cpp multiplies q and k by an orthonormal
Hadamard matrix before k is stored, so that the quantization error spreads evenly over the head (q . k is
unchanged); when the V cache is quantized, v is rotated before it is stored and the attention output after it (the
matrix is its own inverse). Each rotation works on consecutive chunks of n values of a head: n is the largest power
of two dividing the head size for K (64 at least), 64 for V. ggml-cpu computes it as a fast transform in float32:
every value times 1/sqrtf(n), then butterflies (u + v, u - v) with the half-length doubling from 1; every operation
rounds once, so the order of its SIMD passes does not show.

Set LLAMA_ATTN_ROT_DISABLE=1 for llama.cpp to turn it off; the engine follows llama.cpp's default (on).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
MIN_ROT = 64  # the smallest rotation; a head size not a multiple of it is not rotated
V_ROT = 64  # V's rotation: always 64 ("smaller rotation matrices for V seem beneficial")


def k_size(head_dim: int) -> int:
    """K's (and q's) rotation size for this head size: the largest power of two >= 64 dividing it, 0: none."""
    if head_dim <= 0 or head_dim % MIN_ROT:
        return 0
    n = MIN_ROT
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def v_size(head_dim: int) -> int:
    """V's (and the attention output's) rotation size, 0: none."""
    return V_ROT if head_dim > 0 and head_dim % MIN_ROT == 0 else 0


def fwht(x: npt.ArrayLike, n: int) -> F32:
    """x (..., d) with every chunk of n consecutive values along the last axis rotated, as ggml's fast transform."""
    x = np.asarray(x, np.float32)
    shape = x.shape
    y = x.reshape(-1, n) * (np.float32(1.0) / np.sqrt(np.float32(n)))
    step = 1
    while step < n:
        pairs = y.reshape(y.shape[0], n // (2 * step), 2, step)
        u, v = pairs[:, :, 0], pairs[:, :, 1]
        y = np.stack([u + v, u - v], axis=2).reshape(-1, n)
        step *= 2
    return y.reshape(shape)
