"""The DeltaNet layers' ops (engine.ops.delta_rule): the compiled recurrence gives the NumPy emulation's bits in
both builds' orders, glibc's logf is followed bit for bit, and each op computes what its reference computes."""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest

from engine.kernels import isa
from engine.kernels.activations import HAVE_NUMBA
from engine.models.rope import imrope_factors
from engine.observe.recurrent import delta_rule_outputs
from engine.ops import delta_rule as dr
from engine.ops import ggml_math
from tests.engine.models.test_ggml_ops import _glibc_libm


def inputs(t: int, hk: int, hv: int, s: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = dr.l2_norm(rng.standard_normal((t, hk, s)).astype(np.float32), 1e-6, exact=False)
    k = dr.l2_norm(rng.standard_normal((t, hk, s)).astype(np.float32), 1e-6, exact=False)
    v = rng.standard_normal((t, hv, s)).astype(np.float32)
    g = -dr.softplus(rng.standard_normal((t, hv)).astype(np.float32), exact=True) * np.float32(2.0)
    beta = dr.sigmoid(rng.standard_normal((t, hv)).astype(np.float32), exact=True)
    state = (0.1 * rng.standard_normal((hv, s, s))).astype(np.float32)
    return q, k, v, ggml_math.expf(g), beta, state, g


@pytest.mark.skipif(not HAVE_NUMBA, reason="the compiled recurrence needs numba")
@pytest.mark.parametrize("build", ["avx512", "avx2"])
@pytest.mark.parametrize("size", [64, 128, 80])
def test_the_compiled_recurrence_has_the_numpy_emulations_bits(build: str, size: int) -> None:
    q, k, v, decay, beta, state, _ = inputs(9, 2, 4, size)
    with isa.forced_bits(build):
        got = dr.delta_rule(q, k, v, decay, beta, state, exact=True, snap_at=6)
        ref_out, ref_state = np.empty_like(v), state.copy()
        ref_snap = np.zeros_like(state)
        dr._delta_rule_numpy(q, k, v, decay, beta, ref_state, ref_out, ref_snap, 6, exact=True)
        cut = dr.delta_rule(q[:7], k[:7], v[:7], decay[:7], beta[:7], state, exact=True)
    np.testing.assert_array_equal(got[0], ref_out)
    np.testing.assert_array_equal(got[1], ref_state)
    np.testing.assert_array_equal(got[2], ref_snap)
    # the state passed in is left as it was, and the snapshot is the state after token 6
    np.testing.assert_array_equal(cut[1], got[2])


@pytest.mark.skipif(not HAVE_NUMBA, reason="the compiled step needs numba")
@pytest.mark.parametrize("build", ["avx512", "avx2"])
@pytest.mark.parametrize("size", [64, 128, 48])
def test_the_compiled_decode_step_updates_the_state_as_the_prompts_recurrence(build: str, size: int) -> None:
    """dr.step (a decode token's whole layer) leaves the state that dr.delta_rule leaves for the same q, k, v, gates:
    vector rows (sizes in whole steps of both builds) and the row-by-row path (48)."""
    rng = np.random.default_rng(size)
    n_heads, k_heads = 4, 2
    channels = (2 * k_heads + n_heads) * size
    f32 = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    state = (0.1 * rng.standard_normal((n_heads, size, size))).astype(np.float32)
    with isa.forced_bits(build):
        _, _, new_state, seen = dr.step(f32(channels), f32(n_heads * size), f32(n_heads), f32(n_heads), f32(n_heads),
                                        -np.exp(f32(n_heads)), f32(channels, 4), f32(size), 1e-6, f32(3, channels),
                                        state, k_heads, 0)
        seen = {key: value.copy() for key, value in seen.items()}
        _, ref, _ = dr.delta_rule(seen["q"], seen["k"], seen["v"], ggml_math.expf(seen["g"]), seen["beta"], state,
                                  exact=True)
    np.testing.assert_array_equal(new_state, ref)


def test_the_builds_orders_differ_and_the_recurrence_is_the_delta_rule() -> None:
    q, k, v, decay, beta, state, g = inputs(12, 2, 4, 64, seed=3)
    with isa.forced_bits("avx512"):
        a = dr.delta_rule(q, k, v, decay, beta, state, exact=True)[0]
    with isa.forced_bits("avx2"):
        b = dr.delta_rule(q, k, v, decay, beta, state, exact=True)[0]
    assert not np.array_equal(a, b)  # four 16-lane accumulators against four 8-lane ones
    # the maths: the float64 recurrence of engine.observe.recurrent (value head h reads key head h % 2);
    # its state is S[i, j] (key i, value j), ggml holds the transpose
    qx, kx = q[:, np.arange(4) % 2], k[:, np.arange(4) % 2]
    ref, _ = delta_rule_outputs(qx, kx, v, g, beta, state.transpose(0, 2, 1))
    np.testing.assert_allclose(a, ref, atol=2e-5)
    ref32 = dr.delta_rule(q, k, v, decay, beta, state, exact=False)[0]
    np.testing.assert_allclose(ref32, ref, atol=2e-5)


def test_logf_follows_glibc_bit_for_bit() -> None:
    lib = _glibc_libm()
    if lib is None:
        pytest.skip("needs glibc on x86-64 with FMA")
    m = ctypes.CDLL(ctypes.util.find_library("m"))
    m.logf.restype, m.logf.argtypes = ctypes.c_float, [ctypes.c_float]
    rng = np.random.default_rng(11)
    x = np.concatenate([1 + np.exp(rng.uniform(-30, 20, 20000)), rng.uniform(0.5, 2.0, 5000),
                        [1.0, 2.0, 1e-40, 3e38]]).astype(np.float32)
    ref = np.array([m.logf(float(v)) for v in x], np.float32)
    np.testing.assert_array_equal(ggml_math.logf(x).view(np.uint32), ref.view(np.uint32))
    rounded = np.log(x.astype(np.float64)).astype(np.float32)
    assert (rounded != ref).any()  # glibc's logf is not correctly rounded: the emulation matters


def test_softplus_sigmoid_and_l2_norm() -> None:
    x = np.array([-30.0, -2.0, 0.0, 3.0, 19.9, 20.0, 25.0], np.float32)
    sp = dr.softplus(x, exact=True)
    assert sp[-1] == 25.0 and sp[-2] == 20.0  # ggml's cut-off: the identity above 20
    np.testing.assert_allclose(sp[:-2], np.log1p(np.exp(x[:-2].astype(np.float64))), rtol=1e-6, atol=1e-7)  # 1 + e^-30 is 1
    np.testing.assert_allclose(dr.sigmoid(x, exact=True), 1 / (1 + np.exp(-x.astype(np.float64))), rtol=1e-6)
    y = np.random.default_rng(1).standard_normal((5, 3, 64)).astype(np.float32)
    n = dr.l2_norm(y, 1e-6, exact=True)
    np.testing.assert_allclose(np.linalg.norm(n, axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(n, dr.l2_norm(y, 1e-6, exact=False), atol=1e-6)


def test_ssm_conv_is_a_causal_convolution_with_fused_taps() -> None:
    rng = np.random.default_rng(2)
    window = rng.standard_normal((3 + 10, 48)).astype(np.float32)
    kernel = rng.standard_normal((48, 4)).astype(np.float32)
    got = dr.ssm_conv(window, kernel, exact=True)
    ref = np.stack([sum(window[t + i].astype(np.float64) * kernel[:, i] for i in range(4)) for t in range(10)])
    np.testing.assert_allclose(got, ref, atol=1e-5)
    plain = np.zeros_like(got)
    for i in range(4):
        plain = plain + window[i : i + 10] * kernel[:, i]  # rounded products: not GCC's contracted chain
    assert not np.array_equal(plain, got)


def test_imrope_leaves_the_pairs_outside_the_sections_unrotated() -> None:
    assert imrope_factors(32, (6, 5, 5, 0)) is None  # Qwen3.5's sections cover every pair: plain NEOX
    f = imrope_factors(32, (6, 4, 4, 0))
    assert f is not None and np.isinf(f).sum() == 1 and np.isinf(f[13])
    g = imrope_factors(128, (24, 20, 20, 0))  # Qwen3-VL: pairs 61 and 62 read the fourth position
    assert g is not None and np.flatnonzero(np.isinf(g)).tolist() == [61, 62]


@pytest.mark.skipif(not HAVE_NUMBA, reason="the compiled twins need numba")
def test_the_compiled_gates_and_conv_have_the_numpy_emulations_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    alpha, b = (rng.normal(0, 8, (40, 32)).astype(np.float32) for _ in range(2))
    alpha[0, :4] = [20.0, 20.5, -90.0, 25.0]  # softplus's cut-off and an underflowing exp
    dt, a = rng.normal(0, 1, 32).astype(np.float32), -np.linspace(1, 16, 32).astype(np.float32)
    window = rng.standard_normal((3 + 40, 96)).astype(np.float32)
    kernel = rng.standard_normal((96, 4)).astype(np.float32)
    compiled = dr.gates(alpha, dt, a, b, exact=True), dr.ssm_conv(window, kernel, exact=True)
    monkeypatch.setattr(dr, "HAVE_NUMBA", False)
    emulated = dr.gates(alpha, dt, a, b, exact=True), dr.ssm_conv(window, kernel, exact=True)
    for got, want in zip(compiled[0], emulated[0]):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    np.testing.assert_array_equal(compiled[1].view(np.uint32), emulated[1].view(np.uint32))
