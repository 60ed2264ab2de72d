"""engine.ops.ggml / ggml_attention / ggml_math against llama.cpp's own tensors, bit for bit.

The fixtures (tests/fixtures/taps, tools/make_layer_taps.py) hold the inputs and outputs of every op of
layer 0 and one later layer of both catalog models, tapped from llama.cpp (llama-cpp-python 0.3.36,
AVX-512 build) with F32 and F16 KV caches: a 4-token prefill (every op), then the attention products of a
1-token decode, of a 2-token chunk at positions 21-22 and of a decode at position 23 (more keys than
one 16-float lane). Each op is
fed llama.cpp's input and must return llama.cpp's output exactly (np.array_equal on the bits). The
`*_discriminates` tests check that the fixtures would catch a plausible wrong order.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import math
import platform
from fractions import Fraction
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from engine.kernels.legacy import family as legacy
from engine.ops import reference as base
from engine.ops import attention_ggml as ggml_attention
from engine.ops import ggml_math
from engine.ops import ggml as ggml_ops
from engine.ops.attention_ggml import attention, kq, kqv
from engine.ops.ggml import geglu, rms_norm, rope, rope_cache, soft_max, swiglu

TAPS = Path(__file__).resolve().parents[2] / "fixtures" / "taps"
RUNS = [("smollm2", "f32"), ("smollm2", "f16"), ("gemma3", "f32"), ("gemma3", "f16")]


class Tap:
    def __init__(self, model: str, cache: str, folder: Path = TAPS):
        self.z = np.load(folder / f"{model}_{cache}.npz")
        self.meta = json.loads(str(self.z["meta"]))
        self.model, self.cache = model, cache
        self.hp = self.meta["hparams"]
        self.gemma = self.hp["arch"] == "gemma3"

    def __getitem__(self, key: str) -> np.ndarray:
        return self.z[key]

    def has(self, key: str) -> bool:
        return key in self.z.files

    @property
    def eps(self) -> float:
        return float(np.float32(self.hp["attention.layer_norm_rms_epsilon"]))

    def weight(self, layer: int, name: str) -> np.ndarray:
        return self.z[f"weight/blk.{layer}.{name}.weight"]

    def rows(self, key: str) -> np.ndarray:
        """An activation as (T, n) rows."""
        a = self.z[key]
        return a.reshape(-1, a.shape[-1])

    def positions(self, phase: str) -> np.ndarray:
        start, count = self.meta["phases"][phase]
        return np.arange(start, start + count)

    def rope_base(self, layer: int) -> float:
        if self.gemma and layer % 6 < 5:  # sliding-window layers: rope.freq_base_swa, 10000 by default
            return float(self.hp.get("rope.freq_base_swa", 10000.0))
        return float(self.hp["rope.freq_base"])

    def n_dims(self) -> int:
        head_dim = self.hp.get("attention.key_length", self.hp["embedding_length"] // self.hp["attention.head_count"])
        return int(self.hp.get("rope.dimension_count", head_dim))

    def keys_values(self, phase: str, layer: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(keys (Hkv, S, d), values (Hkv, S, d), n_kv) as the kq / kqv operands, in the cache's dtype."""
        k = self.z[f"{phase}/kq-{layer}.src0"]
        vt = self.z[f"{phase}/kqv-{layer}.src0"]
        if k.ndim == 2:  # one KV head: ggml's ne2 of 1 was squeezed away
            k, vt = k[None], vt[None]
        return k, np.ascontiguousarray(vt.transpose(0, 2, 1)), int(self.meta["n_kv"][phase])

    def q(self, phase: str, layer: int) -> np.ndarray:
        q = self.z[f"{phase}/kq-{layer}.src1"]
        return q if q.ndim == 3 else q[None]

    def mask(self, phase: str, n_kv: int) -> np.ndarray:
        pos = self.positions(phase)
        return np.arange(n_kv)[None, :] <= pos[:, None]

    def scale(self) -> float:
        return 1.0 if self.gemma else 1.0 / math.sqrt(self.hp["embedding_length"] // self.hp["attention.head_count"])


@cache
def tap(model: str, cache: str, folder: Path = TAPS) -> Tap:
    return Tap(model, cache, folder)


def assert_bits(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    ours = np.asarray(ours, np.float32).reshape(ref.shape)
    ref = np.asarray(ref, np.float32)
    same = (ours.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(ours) & np.isnan(ref))
    if not same.all():
        ulps = np.abs(ours.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))[~same]
        pytest.fail(f"{what}: {int((~same).sum())} of {same.size} values differ (up to {int(ulps.max())} ulps)")


def differs(ours: np.ndarray, ref: np.ndarray) -> bool:
    ours = np.asarray(ours, np.float32).reshape(ref.shape)
    return not np.array_equal(ours.view(np.uint32), np.asarray(ref, np.float32).view(np.uint32))


def layers(t: Tap) -> list[int]:
    return list(t.meta["layers"])


def layer_input(t: Tap, layer: int) -> np.ndarray:
    if layer == 0:
        return t.rows("prefill/inp_scaled" if t.gemma else "prefill/embd")
    return t.rows(f"prefill/l_out-{layer - 1}")


F32_RUNS = [("smollm2", "f32"), ("gemma3", "f32")]


@pytest.fixture(params=["numba", "numpy"])
def kernels(request, monkeypatch):
    """Run the products, softmax and SiLU through the compiled kernels and through the NumPy fallback."""
    if request.param == "numpy":
        monkeypatch.setattr(ggml_attention, "HAVE_NUMBA", False)
        monkeypatch.setattr(legacy, "HAVE_NUMBA", False)
        monkeypatch.setattr(ggml_ops, "_compiled", lambda: False)
    elif not ggml_attention.HAVE_NUMBA:
        pytest.skip("numba is not installed")
    return request.param




# ---- norms, residuals, scales


@pytest.mark.parametrize("model,cache", F32_RUNS)
def test_rms_norm_and_weight(model: str, cache: str) -> None:
    t = tap(model, cache)
    for i in layers(t):
        x = layer_input(t, i)
        assert_bits(rms_norm(x, None, t.eps), t.rows(f"prefill/norm-{i}"), f"norm-{i}")
        assert_bits(rms_norm(x, t.weight(i, "attn_norm"), t.eps), t.rows(f"prefill/attn_norm-{i}"), f"attn_norm-{i}")
        inp = t.rows(f"prefill/sa_out-{i}" if t.gemma else f"prefill/ffn_inp-{i}")
        assert_bits(rms_norm(inp, t.weight(i, "ffn_norm"), t.eps), t.rows(f"prefill/ffn_norm-{i}"), f"ffn_norm-{i}")
        if t.gemma:  # per-head q/k norms and the post-FFN norm
            for nm, w in (("Qcur", "attn_q_norm"), ("Kcur", "attn_k_norm")):
                assert_bits(rms_norm(t[f"prefill/{nm}-{i}#1"], t.weight(i, w), t.eps), t[f"prefill/{nm}_normed-{i}"],
                            f"{nm}_normed-{i}")
            assert_bits(rms_norm(t.rows(f"prefill/ffn_out-{i}"), t.weight(i, "post_ffw_norm"), t.eps),
                        t.rows(f"prefill/ffn_post_norm-{i}"), f"ffn_post_norm-{i}")


@pytest.mark.parametrize("model,cache", F32_RUNS)
def test_residual_adds_and_scales(model: str, cache: str) -> None:
    t = tap(model, cache)
    for i in layers(t):
        if t.gemma:
            assert_bits(ggml_ops.add(t.rows(f"prefill/attn_post_norm-{i}"), layer_input(t, i)),
                        t.rows(f"prefill/sa_out-{i}"), f"sa_out-{i}")
            assert_bits(ggml_ops.add(t.rows(f"prefill/ffn_post_norm-{i}"), t.rows(f"prefill/sa_out-{i}")),
                        t.rows(f"prefill/l_out-{i}"), f"l_out-{i}")
        else:
            assert_bits(ggml_ops.add(t.rows(f"prefill/attn_out-{i}"), layer_input(t, i)), t.rows(f"prefill/ffn_inp-{i}"),
                        f"ffn_inp-{i}")
            assert_bits(ggml_ops.add(t.rows(f"prefill/ffn_out-{i}"), t.rows(f"prefill/ffn_inp-{i}")),
                        t.rows(f"prefill/l_out-{i}"), f"l_out-{i}")
    if t.gemma:  # the embedding scale: ggml_scale by sqrtf(n_embd)
        s = np.float32(math.sqrt(t.hp["embedding_length"]))
        assert_bits(ggml_ops.scale(t.rows("prefill/embd"), s), t.rows("prefill/inp_scaled"), "inp_scaled")


def test_rms_norm_discriminates() -> None:
    """The float32 mean (base.rms_norm, today's path) misses llama.cpp's double sum somewhere in the fixtures."""
    t = tap("smollm2", "f32")
    assert any(differs(base.rms_norm(layer_input(t, i), t.weight(i, "attn_norm"), t.eps), t.rows(f"prefill/attn_norm-{i}"))
               or differs(base.rms_norm(t.rows(f"prefill/ffn_inp-{i}"), t.weight(i, "ffn_norm"), t.eps),
                          t.rows(f"prefill/ffn_norm-{i}")) for i in layers(t))


# ---- gated FFN activations


@pytest.mark.parametrize("model,cache", F32_RUNS)
def test_glu(model: str, cache: str, kernels: str) -> None:
    t = tap(model, cache)
    fn, name = (geglu, "ffn_geglu") if t.gemma else (swiglu, "ffn_swiglu")
    for i in layers(t):
        assert_bits(fn(t.rows(f"prefill/ffn_gate-{i}"), t.rows(f"prefill/ffn_up-{i}")), t.rows(f"prefill/{name}-{i}"),
                    f"{name}-{i}")


def test_glu_discriminates() -> None:
    t = tap("smollm2", "f32")
    g, u, ref = t.rows("prefill/ffn_gate-0"), t.rows("prefill/ffn_up-0"), t.rows("prefill/ffn_swiglu-0")
    assert differs(base.silu(g) * u, ref)  # NumPy's exp is not ggml_v_expf
    tg = tap("gemma3", "f32")
    g, u, ref = tg.rows("prefill/ffn_gate-0"), tg.rows("prefill/ffn_up-0"), tg.rows("prefill/ffn_geglu-0")
    assert differs(base.gelu_tanh(g) * u, ref)  # the formula is not the fp16 table


def test_swiglu_tail_uses_libm_expf(kernels: str) -> None:
    """Past the last whole 16-float chunk a row goes through the scalar silu (glibc expf), not v_expf."""
    rng = np.random.default_rng(3)
    g = rng.standard_normal((3, 21)).astype(np.float32) * 4
    u = rng.standard_normal((3, 21)).astype(np.float32)
    out = swiglu(g, u)
    assert np.array_equal(out[:, :16], ggml_ops.silu(g[:, :16]) * u[:, :16])
    tail = g[:, 16:] / (np.float32(1) + ggml_math.expf(-g[:, 16:])) * u[:, 16:]
    assert np.array_equal(out[:, 16:], tail)


# ---- RoPE


@pytest.mark.parametrize("model,cache", F32_RUNS)
def test_rope(model: str, cache: str) -> None:
    t = tap(model, cache)
    for i in layers(t):
        cos, sin = rope_cache(t.positions("prefill"), t.n_dims(), t.rope_base(i))
        for nm in ("Qcur", "Kcur"):
            src = t[f"prefill/{nm}_normed-{i}"] if t.gemma else t[f"prefill/{nm}-{i}#1"]  # (T, H, d)
            out = rope(src, cos[:, None], sin[:, None], "neox" if t.gemma else "norm")
            assert_bits(out, t[f"prefill/{nm}-{i}#2"], f"rope {nm}-{i}")


def test_rope_discriminates() -> None:
    """Unfused rotation, or correctly rounded cos/sin instead of glibc's, miss llama.cpp's bits."""
    t = tap("smollm2", "f32")
    src, ref = t["prefill/Qcur-20#1"], t["prefill/Qcur-20#2"]
    cos, sin = rope_cache(t.positions("prefill"), t.n_dims(), t.rope_base(20))
    c, s = cos[:, None], sin[:, None]
    x0, x1 = src[..., 0::2], src[..., 1::2]
    plain = src.copy()
    plain[..., 0::2], plain[..., 1::2] = x0 * c - x1 * s, x0 * s + x1 * c
    assert differs(plain, ref)
    theta = np.arange(0, 4096, dtype=np.float32)[:, None] * np.float32(0.1) ** np.arange(8, dtype=np.float32)
    assert differs(ggml_math.cosf(theta), np.cos(theta.astype(np.float64)).astype(np.float32))


# ---- attention


@pytest.mark.parametrize("phase", ["prefill", "decode", "chunk", "decode_long"])
@pytest.mark.parametrize("model,cache", RUNS)
def test_kq_soft_max_kqv(model: str, cache: str, phase: str, kernels: str) -> None:
    t = tap(model, cache)
    for i in layers(t):
        keys, values, n_kv = t.keys_values(phase, i)
        assert keys.dtype == (np.float16 if cache == "f16" else np.float32)
        scores = kq(t.q(phase, i), keys, n_kv)
        assert_bits(scores, t[f"{phase}/kq-{i}"], f"{phase} kq-{i}")
        w = soft_max(t[f"{phase}/kq-{i}"], t.scale(), t.mask(phase, n_kv))
        assert_bits(w, t[f"{phase}/kq_soft_max-{i}"], f"{phase} kq_soft_max-{i}")
        assert_bits(kqv(t[f"{phase}/kq_soft_max-{i}"], values), t[f"{phase}/kqv-{i}"], f"{phase} kqv-{i}")
        out, weights = attention(t.q(phase, i), keys, values, t.mask(phase, n_kv)[:, : keys.shape[1]], t.scale(), n_kv)
        assert_bits(out, t[f"{phase}/kqv-{i}"], f"{phase} attention-{i}")
        assert weights.shape[-1] == keys.shape[1]


@pytest.mark.parametrize("cache", ["f32", "f16"])
def test_attention_products_discriminate(cache: str) -> None:
    """The kernel ggml picks shows: V*w is tinyBLAS's order for a 2-token chunk and vec_dot's for one token
    (F32 cache: fused products against rounded ones; with an F16 cache the products are exact and the two
    orders only part with more than 32 keys); K*q is vec_dot's for an F32 cache even for a chunk (q is a
    permuted view), tinyBLAS's for a chunk on an F16 cache."""
    t = tap("smollm2", cache)
    for phase, chunked in (("chunk", True), ("decode_long", False)):
        keys, values, n_kv = t.keys_values(phase, 20)
        if cache == "f32":
            vt = np.ascontiguousarray(np.pad(values, ((0, 0), (0, n_kv - values.shape[1]), (0, 0)))[0].T)
            cols = t[f"{phase}/kq_soft_max-20"][:3].reshape(-1, n_kv)
            ref = t[f"{phase}/kqv-20"][:3].reshape(-1, values.shape[2])
            assert differs(ggml_attention._product(vt, cols, False), ref) == chunked
            assert differs(ggml_attention._product(vt, cols, True), ref) != chunked
        k = np.pad(keys, ((0, 0), (0, n_kv - keys.shape[1]), (0, 0)))[0]
        q = t.q(phase, 20)[:3].reshape(-1, keys.shape[2])
        ref = t[f"{phase}/kq-20"][:3].reshape(-1, n_kv)
        tiny = chunked and cache == "f16"
        assert differs(ggml_attention._product(k, q, True), ref) != tiny
        assert differs(ggml_attention._product(k, q, False), ref) == tiny


def test_soft_max_discriminates() -> None:
    t = tap("smollm2", "f32")
    _, _, n_kv = t.keys_values("prefill", 0)
    scores, ref = t["prefill/kq-0"], t["prefill/kq_soft_max-0"]
    assert differs(base.softmax(np.where(t.mask("prefill", n_kv), scores * np.float32(t.scale()), -np.inf)), ref)


def test_compiled_twins_make_the_numpy_bits() -> None:
    """ggml_kernels' softmax and SiLU loops against the NumPy reference, tails and special values included."""
    if not ggml_ops._compiled():
        pytest.skip("compiled kernels not in use")
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.standard_normal(3000) * 30, [0.0, -0.0, 88.7, 89.0, -87.0, -104.0, -120.0, 1e-30, -1e-30]])
    x = x.astype(np.float32)
    from engine.ops.ggml_kernels import v_expf1

    lanes = np.array([v_expf1(np.float32(v)) for v in x[:64]] + [v_expf1(np.float32(v)) for v in x[-9:]], np.float32)
    assert_bits(lanes, ggml_math.v_expf(np.concatenate([x[:64], x[-9:]])), "v_expf1")
    scores = (rng.standard_normal((5, 7, 83)) * 12).astype(np.float32)
    mask = rng.random((7, 83)) < 0.8
    mask[:, 0] = True
    g = (rng.standard_normal((6, 45)) * 8).astype(np.float32)
    u = rng.standard_normal((6, 45)).astype(np.float32)
    fast = soft_max(scores, 0.3, mask), swiglu(g, u)
    saved = ggml_ops._compiled
    try:
        ggml_ops._compiled = lambda: False
        ref = soft_max(scores, 0.3, mask), swiglu(g, u)
    finally:
        ggml_ops._compiled = saved
    assert_bits(fast[0], ref[0], "soft_max")
    assert_bits(fast[1], ref[1], "swiglu")


def test_gelu_table_fuses_like_gcc() -> None:
    """The one entry where GCC's fused `1 + (A*x)*x` changes ggml_table_gelu_f16: x = -1.999 (0xBFFF)."""
    assert np.float32(ggml_ops.gelu_table()[0xBFFF]).astype(np.float16).view(np.uint16) == 0xA9D3


def test_kv_length() -> None:
    assert ggml_attention.kv_length(1) == 256
    assert ggml_attention.kv_length(256) == 256
    assert ggml_attention.kv_length(257) == 512
    assert ggml_attention.kv_length(300, kv_size=384) == 512  # llama_context pads n_ctx to 256: 384 -> 512 cells
    assert ggml_attention.kv_length(128, kv_size=129) == 256
    assert ggml_attention.kv_length(1, kv_size=4096) == 256


# ---- elementary functions


def test_fma64_is_exact() -> None:
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(2000) * 10.0 ** rng.integers(-8, 8, 2000), rng.standard_normal(2000)
    c = -(a * b) * (1 + rng.standard_normal(2000) * 2.0**-40)  # heavy cancellation
    got = ggml_math.fma64(a, b, c)
    for x, y, z, g in zip(a, b, c, got):
        assert g == float(Fraction(x) * Fraction(y) + Fraction(z))


def test_v_expf_limits() -> None:
    x = np.array([-np.inf, -200.0, -103.0, 0.0, 1.0, 88.0, 89.0, np.inf], np.float32)
    got = ggml_math.v_expf(x)
    assert got[0] == 0 and got[1] == 0 and 0 < got[2] < 1e-44 and got[3] == 1
    assert abs(got[4] - np.e) < 1e-6 and np.isfinite(got[5]) and got[6] == np.inf and got[7] == np.inf


def _glibc_libm():
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    if "fma" not in Path("/proc/cpuinfo").read_text().split():
        return None  # glibc picks its non-FMA variants there, which round differently
    libc = ctypes.util.find_library("c") or ""
    if "libc.so" not in libc:
        return None
    lib = ctypes.CDLL(ctypes.util.find_library("m"))
    for name in ("cosf", "sinf", "expf"):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return lib


def test_libm_emulation_matches_glibc() -> None:
    """cosf / sinf / expf follow glibc's FMA variants bit for bit (here on glibc x86-64 only)."""
    lib = _glibc_libm()
    if lib is None:
        pytest.skip("needs glibc on x86-64 with FMA")
    rng = np.random.default_rng(7)
    half = 32
    ts = np.float32(math.pow(10000.0, -1.0 / half))
    theta = np.empty((600, half), np.float32)
    t = rng.integers(0, 40000, 600).astype(np.float32)
    for i in range(half):  # RoPE angles up to position 40000: the fast and the large reductions
        theta[:, i] = t
        t = t * ts
    x = np.concatenate([theta.ravel(), rng.uniform(-130, 130, 4000).astype(np.float32),
                        (10.0 ** rng.uniform(-9, 0, 2000)).astype(np.float32)])
    for ours, name in ((ggml_math.cosf, "cosf"), (ggml_math.sinf, "sinf")):
        ref = np.array([getattr(lib, name)(float(v)) for v in x], np.float32)
        assert_bits(ours(x), ref, name)
    e = np.concatenate([rng.uniform(-104, 89, 6000), rng.uniform(-1, 1, 2000)]).astype(np.float32)
    ref = np.array([lib.expf(float(v)) for v in e], np.float32)
    assert_bits(ggml_math.expf(e), ref, "expf")
