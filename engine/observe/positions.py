"""Position encodings for display and checking: the sinusoids of "Attention Is All You Need" and RoPE per layer.

Sinusoidal encoding (Vaswani et al. 2017, section 3.5), d = d_model, omega_i = base^(-2i/d):
    PE[pos, 2i] = sin(pos * omega_i),   PE[pos, 2i + 1] = cos(pos * omega_i)
Because sin and cos of a sum expand, a fixed offset k is a linear map: PE(pos + k) = M_k PE(pos), with M_k
block diagonal, one 2x2 block [[cos k w, sin k w], [-sin k w, cos k w]] per frequency (`relative_rotation`).

RoPE (Su et al. 2021) rotates each pair of query/key dimensions by pos * theta_i instead of adding a
vector, so the score of query m and key n depends on m - n only:
    q_m . k_n = sum_i [ (q0 k0 + q1 k1) cos(d theta_i) + (q0 k1 - q1 k0) sin(d theta_i) ],  d = m - n
(`rope_score_vs_distance`). Bases differ per layer in some models (Gemma 3: local layers 10,000 with a
sliding window, global layers the file's freq_base); `layer_rope_layout` reads that from the metadata.
Some models scale the frequencies (llama.cpp's ggml_rope_ext arguments, engine.models.rope.RopeScaling):
Llama 3.x divides each pair's theta by a factor from rope_freqs.weight (1 for the fast pairs, 8 for the slow
ones, a smooth ramp between), Phi-3 by rope_factors_long/short, linear scaling by rope.scaling.factor, YaRN
blends the two; `scaling_profile` gives the per-pair ratio of the frequency used to the plain one.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError
from engine.models.registry import model_class
from engine.models.rope import NO_SCALING, RopeScaling, rope_freqs

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

SINUSOID_BASE = 10000.0


def sinusoid_freqs(d_model: int, base: float = SINUSOID_BASE) -> F64:
    """omega_i = base^(-2i/d_model), one angular frequency per (sin, cos) pair: (d_model // 2,)."""
    return base ** (-2.0 * np.arange(d_model // 2, dtype=np.float64) / d_model)


def sinusoidal_encoding(n_pos: int, d_model: int, base: float = SINUSOID_BASE, start: int = 0) -> F64:
    """PE of positions start..start+n_pos-1: (n_pos, d_model), sin in even and cos in odd dimensions."""
    w = sinusoid_freqs(d_model, base)
    ang = np.arange(start, start + n_pos, dtype=np.float64)[:, None] * w[None, :]  # (P, d/2)
    pe = np.zeros((n_pos, d_model), np.float64)
    pe[:, 0 : 2 * len(w) : 2] = np.sin(ang)
    pe[:, 1 : 2 * len(w) : 2] = np.cos(ang)
    return pe


def relative_rotation(k: int, freqs: F64, d_model: int | None = None) -> F64:
    """M_k (d, d) with PE(pos + k) = M_k @ PE(pos) for the sin/cos-interleaved encoding."""
    d = d_model or 2 * len(freqs)
    m = np.eye(d, dtype=np.float64)  # an odd trailing dimension (never used in practice) stays fixed
    c, s = np.cos(k * freqs), np.sin(k * freqs)
    i = np.arange(len(freqs))
    m[2 * i, 2 * i] = c  # sin((p+k)w) = sin(pw) cos(kw) + cos(pw) sin(kw)
    m[2 * i, 2 * i + 1] = s
    m[2 * i + 1, 2 * i] = -s  # cos((p+k)w) = cos(pw) cos(kw) - sin(pw) sin(kw)
    m[2 * i + 1, 2 * i + 1] = c
    return m


def shift_error(pe: F64, k: int, m_k: F64) -> float:
    """max |PE(pos + k) - M_k PE(pos)| over the rows of pe that have a partner k rows later."""
    if k < 0 or k >= len(pe):
        return 0.0
    pred = pe[: len(pe) - k] @ m_k.T
    return float(np.abs(pe[k:] - pred).max()) if len(pred) else 0.0


def wavelengths(freqs: F64) -> F64:
    """Positions per full turn of each pair, 2 pi / theta_i."""
    return 2.0 * np.pi / freqs


def rope_pair_angles(positions: npt.ArrayLike, freqs: F64, pair: int) -> F64:
    """Rotation angle pos * theta_pair of each position, wrapped to [0, 2 pi)."""
    return np.mod(np.asarray(positions, dtype=np.float64) * freqs[pair], 2.0 * np.pi)


def rope_score_vs_distance(
    freqs: F64, distances: npt.ArrayLike, q: npt.ArrayLike | None = None, k: npt.ArrayLike | None = None
) -> F64:
    """q.k after RoPE as a function of distance m - n, for pair-ordered q, k (rope_dim,); all-ones by default.

    With q = k = 1 this is RoFormer's long-term-decay curve (section 3.4.3): sum_i 2 cos(d theta_i).
    """
    p = len(freqs)
    q = np.ones((p, 2)) if q is None else np.asarray(q, np.float64).reshape(p, 2)
    k = np.ones((p, 2)) if k is None else np.asarray(k, np.float64).reshape(p, 2)
    a = q[:, 0] * k[:, 0] + q[:, 1] * k[:, 1]  # (P,)
    b = q[:, 0] * k[:, 1] - q[:, 1] * k[:, 0]
    ang = np.asarray(distances, np.float64)[:, None] * freqs[None, :]  # (D, P)
    return np.cos(ang) @ a + np.sin(ang) @ b


def pairs_from_head(x: npt.ArrayLike, rope_dim: int, mode: str) -> F64:
    """The rotated pairs of a head vector (head_dim,), (rope_dim/2, 2), for 'norm' or 'neox' pairing."""
    x = np.asarray(x, np.float64)
    n = rope_dim // 2
    if mode == "norm":
        return np.stack([x[0 : 2 * n : 2], x[1 : 2 * n : 2]], axis=1)
    if mode == "neox":
        return np.stack([x[:n], x[n : 2 * n]], axis=1)
    raise ValueError(f"unknown rope mode {mode!r}")


@dataclass(frozen=True)
class ScalingProfile:
    """How a model scales RoPE: a one-line description and, per pair, theta used / base^(-2i/d) (empty: 1)."""

    text: str
    ratio: tuple[float, ...]
    mscale: float = 1.0  # cos and sin are multiplied by it (YaRN, rope.scaling.attn_factor)


def scaling_profile(scaling: RopeScaling, rope_dim: int, base: float) -> ScalingProfile:
    """The per-pair frequency ratio and a description of a model's RoPE scaling (identity: empty ratio)."""
    if scaling is NO_SCALING:
        return ScalingProfile("", ())
    ratio = rope_freqs(rope_dim, base, scaling) / rope_freqs(rope_dim, base)
    parts = []
    if scaling.factors is not None:
        f = np.asarray(scaling.factors, np.float64)[: rope_dim // 2]
        parts.append(f"frequency factors {f.min():g} to {f.max():g} (theta_i / factor_i)")
    if scaling.kind == "yarn":
        parts.append(f"YaRN x{1 / scaling.freq_scale:g} over an original context of {scaling.n_ctx_orig:,}")
    elif scaling.freq_scale != 1.0:
        parts.append(f"{scaling.kind} position scaling x{1 / scaling.freq_scale:g}")
    m = scaling.mscale()
    if m != 1.0:
        parts.append(f"magnitude x{m:.4g}")
    return ScalingProfile("RoPE scaling: " + ", ".join(parts or ["none"]), tuple(float(r) for r in ratio), m)


def scaled_freqs(rope_dim: int, base: float, ratio: tuple[float, ...] = ()) -> F64:
    """The frequencies a model really rotates by: base^(-2i/d) times its scaling ratio per pair (when given)."""
    f = rope_freqs(rope_dim, base)
    return f * np.asarray(ratio, np.float64)[: f.size] if len(ratio) == f.size else f


UNKNOWN_MODE = "unknown"  # the RoPE pair layout of an architecture without a class here


@dataclass(frozen=True)
class LayerRope:
    """How one layer encodes positions: RoPE base and mode, sliding window, attention scale."""

    base: float
    window: int | None
    rope_dim: int
    mode: str  # 'norm' | 'neox' | 'unknown' (an architecture GGUF Lens does not run)
    scale: float

    @property
    def freqs(self) -> F64:
        return rope_freqs(self.rope_dim, self.base)


def layer_rope_layout(md: dict[str, Any], n_layers: int, rope_base: float, head_dim: int) -> list[LayerRope]:
    """Per-layer RoPE base, window and scale from GGUF metadata (local vs global layers where the arch has them), by
    the rules the architecture's class declares (engine.models.registry)."""
    arch = str(md.get("general.architecture", ""))
    try:  # the architecture's own rules
        cls = model_class(arch)
        mode, pattern, local_base = cls.rope_mode, cls.swa_pattern, cls.rope_base_swa
    except ModelFormatError:  # an architecture GGUF Lens does not run: its pair layout is not known, and says so
        mode, pattern, local_base = UNKNOWN_MODE, 0, None
    swa_base = md.get(f"{arch}.rope.freq_base_swa")
    if isinstance(swa_base, (int, float, np.integer, np.floating)) and swa_base > 0:
        local_base = float(swa_base)
    rope_dim = int(md.get(f"{arch}.rope.dimension_count", head_dim))
    window = md.get(f"{arch}.attention.sliding_window")
    window = int(window) if isinstance(window, (int, np.integer)) and window > 0 else None
    scale = 1.0 / math.sqrt(head_dim)
    out = []
    for i in range(n_layers):
        local = window is not None and pattern > 0 and (i + 1) % pattern != 0
        out.append(
            LayerRope(
                base=float(local_base) if local and local_base else float(rope_base),
                window=window if local else None,
                rope_dim=rope_dim,
                mode=mode,
                scale=scale,
            )
        )
    return out


@dataclass(frozen=True)
class DistanceView:
    """What RoPE does at one distance d for one set of frequencies: per pair, the angle and its share of q.k."""

    distance: int
    angles: F64  # d * theta_i, unwrapped (radians), (rope_dim/2,)
    contributions: F64  # cos(d * theta_i): each pair's q.k at distance d over its q.k at 0 (q = k = 1)
    score: float  # q.k(d) / q.k(0) with q = k = 1: the mean of the contributions (RoFormer's decay curve at d)
    turned: int  # pairs that have turned at least once (d * theta_i >= 2 pi): they no longer order positions
    still: int  # pairs that have turned less than 0.1 rad: they barely see the distance at all


def rope_at_distance(freqs: F64, distance: int) -> DistanceView:
    """Each pair's rotation angle and q.k share at distance d (RoFormer section 3.4.3 with q = k = 1)."""
    ang = float(distance) * np.asarray(freqs, np.float64)
    contrib = np.cos(ang)
    return DistanceView(int(distance), ang, contrib, float(contrib.mean()) if contrib.size else 1.0,
                        int(np.count_nonzero(ang >= 2.0 * np.pi)), int(np.count_nonzero(ang < 0.1)))


def rope_relative_check(freqs: F64, rope_dim: int, mode: str, offset: int, n_pos: int, seed: int = 0) -> float:
    """RoPE's relative-position property measured with the model's own rotation (engine.models.rope.apply_rope).

    For a random q and k, q_m . k_n after RoPE at every pair of positions (m, n = m - offset) in [0, n_pos) is
    compared with the closed form, which depends on the offset only; returns the largest difference relative to
    |q| |k| (float32 arithmetic: about 1e-7 when the property holds).
    """
    from engine.models.rope import apply_rope, rope_angles  # noqa: PLC0415

    if offset < 0 or offset >= n_pos:
        return 0.0
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((2, rope_dim)).astype(np.float32)
    m = np.arange(offset, n_pos)
    cos_m, sin_m = rope_angles(m, freqs)
    cos_n, sin_n = rope_angles(m - offset, freqs)
    qm = apply_rope(np.broadcast_to(q, (1, m.size, rope_dim)).copy(), cos_m, sin_m, mode)[0]  # (M, rope_dim)
    kn = apply_rope(np.broadcast_to(k, (1, m.size, rope_dim)).copy(), cos_n, sin_n, mode)[0]
    scores = np.einsum("td,td->t", qm.astype(np.float64), kn.astype(np.float64))
    formula = rope_score_vs_distance(freqs, [offset], pairs_from_head(q, rope_dim, mode), pairs_from_head(k, rope_dim, mode))
    return float(np.abs(scores - formula[0]).max() / (np.linalg.norm(q) * np.linalg.norm(k)))
