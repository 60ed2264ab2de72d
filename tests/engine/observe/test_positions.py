"""Position encodings: the sinusoid formula, the shift matrix M_k, RoPE's score vs distance, per-layer bases."""
from __future__ import annotations

import numpy as np
import pytest

from engine.models.rope import apply_rope, rope_angles, rope_freqs
from engine.observe.positions import (
    layer_rope_layout,
    pairs_from_head,
    relative_rotation,
    rope_pair_angles,
    rope_score_vs_distance,
    shift_error,
    sinusoid_freqs,
    sinusoidal_encoding,
    wavelengths,
)


def test_sinusoid_frequencies_follow_the_paper() -> None:
    w = sinusoid_freqs(512)
    assert w.shape == (256,) and w[0] == 1.0
    np.testing.assert_allclose(w, 1.0 / 10000 ** (np.arange(0, 512, 2) / 512))
    np.testing.assert_allclose(wavelengths(w)[[0, -1]], [2 * np.pi, 2 * np.pi * 10000 ** (510 / 512)])


def test_sinusoidal_encoding_matches_the_formula() -> None:
    pe = sinusoidal_encoding(50, 16)
    pos, i = 37, 5
    assert pe[pos, 2 * i] == pytest.approx(np.sin(pos / 10000 ** (2 * i / 16)))
    assert pe[pos, 2 * i + 1] == pytest.approx(np.cos(pos / 10000 ** (2 * i / 16)))
    np.testing.assert_allclose(pe[0, 1::2], 1.0)
    np.testing.assert_allclose(sinusoidal_encoding(10, 16, start=40), pe[40:50])


@pytest.mark.parametrize("k", [0, 1, 3, 17, 99])
def test_shift_is_a_rotation_pe_pos_plus_k_equals_m_k_pe_pos(k: int) -> None:
    d = 64
    pe = sinusoidal_encoding(200, d)
    m = relative_rotation(k, sinusoid_freqs(d), d)
    assert shift_error(pe, k, m) < 1e-10
    np.testing.assert_allclose(m @ m.T, np.eye(d), atol=1e-12)  # orthogonal
    np.testing.assert_allclose(relative_rotation(k + 2, sinusoid_freqs(d)), relative_rotation(2, sinusoid_freqs(d)) @ m, atol=1e-10)
    if k:
        assert shift_error(pe, k, np.eye(d)) > 0.1  # the identity is not the shift


def test_odd_width_keeps_the_last_dimension() -> None:
    pe = sinusoidal_encoding(30, 7)
    m = relative_rotation(4, sinusoid_freqs(7), 7)
    assert m.shape == (7, 7) and m[6, 6] == 1.0
    assert shift_error(pe[:, :6], 4, m[:6, :6]) < 1e-10


@pytest.mark.parametrize("mode", ["norm", "neox"])
def test_rope_score_depends_on_distance_only_and_matches_apply_rope(mode: str) -> None:
    rng = np.random.default_rng(1)
    d, rope_dim, base = 16, 12, 500.0
    freqs = rope_freqs(rope_dim, base)
    q = rng.standard_normal(d).astype(np.float32)
    k = rng.standard_normal(d).astype(np.float32)
    pos = np.arange(40)
    cos, sin = rope_angles(pos, freqs)
    qr = apply_rope(np.tile(q, (1, 40, 1)), cos, sin, mode)[0]  # (40, d)
    kr = apply_rope(np.tile(k, (1, 40, 1)), cos, sin, mode)[0]
    qp, kp = pairs_from_head(q, rope_dim, mode), pairs_from_head(k, rope_dim, mode)
    rest = float(q[rope_dim:] @ k[rope_dim:]) if mode == "norm" else float(q[rope_dim:] @ k[rope_dim:])
    for m_, n_ in [(5, 5), (9, 2), (39, 0), (20, 13)]:
        expected = rope_score_vs_distance(freqs, [m_ - n_], qp, kp)[0] + rest
        assert float(qr[m_] @ kr[n_]) == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_rope_long_term_decay_with_ones() -> None:
    freqs = rope_freqs(64, 10000.0)
    s = rope_score_vs_distance(freqs, np.arange(2000))
    assert s[0] == pytest.approx(64.0)
    assert np.abs(s[1000:]).mean() < 0.3 * s[0]  # RoFormer: the bound decays with distance
    np.testing.assert_allclose(rope_pair_angles([0, 1, 2], freqs, 0), [0, 1, 2])


def test_layer_layout_gemma3_local_and_global_layers() -> None:
    md = {"general.architecture": "gemma3", "gemma3.attention.sliding_window": 512}
    layout = layer_rope_layout(md, 18, 1_000_000.0, 256)
    local = [i for i, x in enumerate(layout) if x.window]
    assert [i for i in range(18) if i not in local] == [5, 11, 17]
    assert {layout[i].base for i in local} == {10000.0} and layout[5].base == 1_000_000.0
    assert layout[0].window == 512 and layout[0].mode == "neox" and layout[0].scale == pytest.approx(1 / 16)
    md["gemma3.rope.freq_base_swa"] = 20000.0
    assert layer_rope_layout(md, 18, 1e6, 256)[0].base == 20000.0
    llama = layer_rope_layout({"general.architecture": "llama", "llama.rope.dimension_count": 32}, 4, 1e5, 64)
    assert all(x.window is None and x.base == 1e5 and x.rope_dim == 32 and x.mode == "norm" for x in llama)
    np.testing.assert_allclose(llama[0].freqs, rope_freqs(32, 1e5))


def test_layer_layout_follows_the_architecture_classes_and_names_an_unknown_one() -> None:
    """The layout reads each architecture's own rules (its class's RoPE mode and sliding-window pattern); an
    architecture without a class gets the 'unknown' mode, never a silent 'norm'."""
    gemma2 = layer_rope_layout({"general.architecture": "gemma2", "gemma2.attention.sliding_window": 64}, 4, 1e4, 64)
    assert [x.window for x in gemma2] == [64, None, 64, None] and {x.mode for x in gemma2} == {"neox"}
    qwen3 = layer_rope_layout({"general.architecture": "qwen3"}, 2, 1e6, 128)
    assert {x.mode for x in qwen3} == {"neox"}
    other = layer_rope_layout({"general.architecture": "mamba"}, 3, 1e4, 64)
    assert [x.mode for x in other] == ["unknown"] * 3 and all(x.window is None for x in other)
