"""Rotary position embeddings as ggml applies them: 'norm' rotates adjacent pairs, 'neox' rotates halves.

`RopeScaling` holds what llama.cpp adds to the plain rotation (ggml_rope_ext's arguments as llama_context
derives them): linear position interpolation (freq_scale), per-pair frequency factors (Llama 3's
rope_freqs.weight, Phi-3's rope_factors_long/short), YaRN's ramp and magnitude scale.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError
from engine.models.args import MetadataView

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, eq=False)
class RopeScaling:
    """RoPE scaling as llama.cpp's cparams hand it to ggml_rope_ext (identity by default)."""

    kind: str = "none"  # rope.scaling.type: none, linear, yarn, longrope
    freq_scale: float = 1.0  # 1 / rope.scaling.factor
    factors: F32 | None = None  # divide theta pair by pair (rope_freqs.weight, rope_factors_*)
    ext_factor: float = 0.0  # YaRN's extrapolation mix: 1 for yarn, else 0 (llama_context's default)
    attn_factor: float = 1.0  # cos and sin are multiplied by it (yarn_attn_factor * rope.scaling.attn_factor)
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0  # rope.scaling.original_context_length (else the trained context)

    def corr_dims(self, n_dims: int, base: float) -> tuple[float, float]:
        """ggml_rope_yarn_corr_dims (ggml.c): the pair range over which YaRN's ramp goes from 1 to 0, in float."""
        def dim(beta: float) -> np.float32:
            ratio = np.float32(self.n_ctx_orig) / (np.float32(beta) * np.float32(2.0) * np.float32(math.pi))
            return np.float32(n_dims) * np.log(np.float32(ratio)) / (np.float32(2.0) * np.log(np.float32(base)))

        start = math.floor(float(dim(self.beta_fast)))
        end = math.ceil(float(dim(self.beta_slow)))
        return float(max(0, start)), float(min(n_dims - 1, end))

    def ramp(self, n_dims: int, base: float) -> F32:
        """rope_yarn_ramp (ggml-cpu ops.cpp) times ext_factor, one value per pair, float32."""
        half = n_dims // 2
        if self.ext_factor == 0.0:
            return np.zeros(half, np.float32)
        low, high = (np.float32(v) for v in self.corr_dims(n_dims, base))
        y = (np.arange(half, dtype=np.float32) - low) / np.float32(max(0.001, float(high - low)))
        return (np.float32(1.0) - np.minimum(np.float32(1.0), np.maximum(np.float32(0.0), y))) * np.float32(self.ext_factor)

    def mscale(self) -> float:
        """The magnitude cos and sin are multiplied by: attn_factor, times rope_yarn's 1 + 0.1 ln(1/freq_scale)."""
        m = np.float32(self.attn_factor)
        if self.ext_factor != 0.0:
            m = np.float32(m * (np.float32(1.0) + np.float32(0.1) * np.log(np.float32(1.0) / np.float32(self.freq_scale))))
        return float(m)


NO_SCALING = RopeScaling()


def yarn_attn_factor(freq_scale: float, attn_factor_md: float) -> float:
    """llama_context's cparams.yarn_attn_factor for yarn: get_mscale(factor, 1) cancelled by 1 / (1 + 0.1 ln factor)
    (ggml's rope_yarn multiplies it back), times rope.scaling.attn_factor; float arithmetic as the C code."""
    factor = np.float32(1.0) / np.float32(freq_scale)
    m = np.float32(1.0) if factor <= 1.0 else np.float32(np.float32(0.1) * np.log(factor) + np.float32(1.0))
    m = np.float32(m * (np.float32(1.0) / (np.float32(1.0) + np.float32(0.1) * np.log(factor))))
    return float(np.float32(m * np.float32(attn_factor_md)))


def rope_freqs(rope_dim: int, base: float, scaling: RopeScaling = NO_SCALING) -> F64:
    """theta_i = base^(-2i/rope_dim) for i in [0, rope_dim/2): one angular frequency per rotated pair.

    With scaling, the frequency ggml_rope_cache_init / rope_yarn really use: divided by the pair's factor, then
    freq_scale * (1 - ramp) + ramp of it (the YaRN blend of interpolated and extrapolated angles; linear: freq_scale).
    """
    i = np.arange(rope_dim // 2, dtype=np.float64)
    f = base ** (-2.0 * i / rope_dim)
    if scaling is NO_SCALING:
        return f
    if scaling.factors is not None:
        f = f / np.asarray(scaling.factors, np.float64)[: rope_dim // 2]
    r = scaling.ramp(rope_dim, base).astype(np.float64)
    return f * (scaling.freq_scale * (1.0 - r) + r)


def rope_angles(positions: npt.ArrayLike, freqs: F64, mscale: float = 1.0) -> tuple[F32, F32]:
    """cos and sin of pos * theta_i (times mscale), (T, rope_dim/2) float32."""
    ang = np.asarray(positions, dtype=np.float64)[:, None] * freqs[None, :]
    c, s = np.cos(ang), np.sin(ang)
    if mscale != 1.0:
        c, s = c * mscale, s * mscale
    return c.astype(np.float32), s.astype(np.float32)


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


# ---- IMROPE (Qwen3.5, Qwen3-VL) for text
# IMROPE rotates NEOX pairs, pair i taking the position of the section its sector (i mod the sections' sum) falls in;
# the text, height and width sections all see the token's position, and a pair outside them reads the fourth
# position, which is 0 for text: that pair is not rotated. Such pairs get a frequency factor of infinity (theta / inf
# = 0, as ggml's freq_factors divide), so where the sections cover every pair (Qwen3.5's [11, 11, 10]) the rotation is
# plain NEOX, and where they do not (Qwen3-VL's [24, 20, 20] leaves pairs 61 and 62) it is not.


def read_sections(m: MetadataView) -> tuple[int, int, int, int]:
    """`rope.dimension_sections` (required): IMROPE's text, height, width and extra sections, in pairs."""
    key = f"{m.arch}.rope.dimension_sections"
    got = m.md.get(key)
    if got is None:
        raise ModelFormatError(key, "required metadata key is missing")
    vals = [int(v) for v in np.asarray(got).reshape(-1)]
    if len(vals) > 4 or any(v < 0 for v in vals) or not any(vals):
        raise ModelFormatError(key, "must be up to four non-negative section sizes, not all zero", vals)
    return tuple(vals + [0] * (4 - len(vals)))  # type: ignore[return-value]


def imrope_factors(rope_dim: int, sections: tuple[int, int, int, int]) -> np.ndarray | None:
    """Per rotated pair: 1, or infinity where IMROPE gives the pair the fourth (extra) position, 0 for text; None
    where every pair takes the token's position (plain NEOX)."""
    total = sum(sections)
    out = np.ones(rope_dim // 2, np.float32)
    for i in range(rope_dim // 2):
        sector = i % total
        covered = ((sector % 3 == 0 and sector < 3 * sections[0]) or (sector % 3 == 1 and sector < 3 * sections[1])
                   or (sector % 3 == 2 and sector < 3 * sections[2]))
        if not covered:
            out[i] = np.inf
    return None if np.all(out == 1) else out
