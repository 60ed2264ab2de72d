"""The CUDA path against the NumPy reference: each kernel on random blocks, then whole forwards.

Every test runs twice: on a real GPU through CuPy (marked `gpu`, skipped without CuPy or a device) and on
the CPU CUDA emulator (tests/engine/gpu/cuda_emulator.py: the same kernel sources built with g++, skipped
without g++), which runs in the ordinary suite. The fault tests (a device that fails mid-reply, out of
memory at load and mid-step) inject failures, so they run on the emulator only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.synthetic_model import SPECS, spec, write_synthetic
from engine.backend import Backend, get_backend
from engine.cli.bench import run_bench
from engine.cache import KVCache
from engine.errors import InferenceError, SettingError
from engine.generate import GenerationConfig, generate
from engine.gpu import GpuNet, estimate_gpu_memory, to_device
from engine.gpu import linear as gpu_linear
from engine.gpu import runner as gpu_runner
from engine.gpu.cache import DeviceKVCache
from engine.gpu.device import Device, arg
from engine.gpu.linear import DEVICE_TYPES, BlockStore, DeviceLinear
from engine.gpu.plan import ACT_GELU_TANH, ACT_SILU, arch_plan
from engine.model import Model, load_model
from engine.ops.reference import attention, causal_mask, gelu_tanh, rms_norm, silu
from engine.models.rope import apply_rope, rope_angles, rope_freqs
from engine.observe.recorder import Recorder
from engine.quant import dequantize_rows, quantize
from engine.quant.types import TYPES, GGMLType
from engine.sampler import SamplerSettings
from engine.tensor import DenseBudget, Linear, QTensor
from tests.conftest import GEMMA3_FILE, SMOLLM2_FILE, model_path
from tests.engine.gpu import cuda_emulator
from tests.engine.gpu.cuda_emulator import CUDARuntimeError, FakeCupy, OutOfMemoryError
from tests.engine.golden import FIXTURES, load_golden
from tests.tiny_models import make_tiny_llama

T = GGMLType
KLD_BOUND = 1e-4  # the bound between backends


@dataclass
class Dev:
    """A device to test on: real CuPy, or the emulator (small problem sizes, fault injection)."""

    backend: Backend
    device: Device
    emulated: bool

    @property
    def xp(self) -> Any:
        return self.backend.xp

    def np(self, a: Any) -> np.ndarray:
        return self.backend.to_numpy(a)


def _make_dev(kind: str) -> Dev:
    if kind == "cupy":
        try:
            b = get_backend("cupy")
        except SettingError as exc:
            pytest.skip(f"no GPU: {exc}")
        return Dev(b, Device(b), False)
    if not cuda_emulator.available():
        pytest.skip("g++ is not installed (the CUDA emulator builds the kernels with it)")
    b = Backend("cupy", FakeCupy())
    return Dev(b, Device(b), True)


@pytest.fixture(scope="module", params=[pytest.param("cupy", marks=pytest.mark.gpu), "emulated"])
def dev(request: pytest.FixtureRequest) -> Dev:
    return _make_dev(request.param)


@pytest.fixture
def emu() -> Dev:
    """A fresh emulated device whose failures a test may inject."""
    return _make_dev("emulated")


def load_on(dev: Dev, path: Path, **kw: Any) -> Model:
    """load_model with backend 'cupy' resolved to this test device."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("engine.model.get_backend", lambda name="auto": dev.backend)
        return load_model(path, backend="cupy", **kw)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))


def kld(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(got)) per row."""
    p, q = log_softmax(ref), log_softmax(got)
    return (np.exp(p) * (p - q)).sum(-1)


def assert_same_top(ref: np.ndarray, got: np.ndarray) -> None:
    """Same argmax in every row whose best two logits are not a float-noise tie."""
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 1e-4 * np.maximum(1.0, np.abs(top2[:, 1]))
    assert clear.mean() > 0.9
    assert np.array_equal(ref.argmax(-1)[clear], got.argmax(-1)[clear])


def qtensor(rows: np.ndarray, qtype: GGMLType, n_cols: int, name: str = "w") -> QTensor:
    return QTensor(name, qtype, (n_cols, rows.shape[0]), rows)


def linear(rows: np.ndarray, qtype: GGMLType, n_cols: int, name: str = "w") -> Linear:
    return Linear(qtensor(rows, qtype, n_cols, name), DenseBudget(0))


def random_rows(rng: np.random.Generator, qtype: GGMLType, n_rows: int, n_cols: int) -> np.ndarray:
    """Real quantized weights (finite scales)."""
    w = rng.standard_normal((n_rows, n_cols)).astype(np.float32) / np.float32(math.sqrt(n_cols))
    if qtype == T.F32:
        return w.view(np.uint8).reshape(n_rows, -1)
    return quantize(w, qtype)


def assert_bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit where finite; NaN where NumPy has NaN (payloads may differ); the same infinities."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


TYPE_IDS = sorted(DEVICE_TYPES)


def _n_cols(qtype: GGMLType, dev: Dev) -> int:
    block = TYPES[qtype].block_size
    if dev.emulated:
        return 512
    return 2304 if block == 256 else 576  # 576 ends on half a warp step (4.5 x 128), as SmolLM2's rows do


# ---- kernels on random blocks


@pytest.mark.parametrize("qtype", TYPE_IDS, ids=lambda t: t.name)
def test_dequant_kernel_is_bit_exact(dev: Dev, qtype: GGMLType) -> None:
    rng = np.random.default_rng(int(qtype))
    n_cols = _n_cols(qtype, dev)
    n_rows = 24 if dev.emulated else 1537
    rb = TYPES[qtype].row_bytes(n_cols)
    for rows in (rng.integers(0, 256, size=(n_rows, rb), dtype=np.uint8), random_rows(rng, qtype, n_rows, n_cols)):
        lin = DeviceLinear(dev.device, BlockStore(dev.device), [linear(rows, qtype, n_cols)])
        with dev.device.stream:
            got = dev.np(lin.dequantize())
        assert_bits_equal(got, dequantize_rows(rows, qtype))


def test_dequant_kernel_stacks_three_types_and_writes_f16(dev: Dev) -> None:
    rng = np.random.default_rng(3)
    n_cols = 256
    parts = [(T.Q5_0, 40), (T.Q8_0, 24), (T.Q4_K, 8)]
    rows = [random_rows(rng, t, n, n_cols) for t, n in parts]
    lin = DeviceLinear(dev.device, BlockStore(dev.device), [linear(r, t, n_cols) for r, (t, _) in zip(rows, parts)])
    want = np.concatenate([dequantize_rows(r, t) for r, (t, _) in zip(rows, parts)])
    with dev.device.stream:
        assert_bits_equal(dev.np(lin.dequantize()), want)
        half = dev.device.empty(want.shape, np.uint16)
        dev.device.launch("dequant_rows", 64, 256, (*lin._segments(None), np.int32(n_cols), arg(None), half))
        got = dev.np(half)
    assert np.array_equal(got, want.astype(np.float16).view(np.uint16))


def _gemv_reference(w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W x in float64 and the bound |W| |x| that float32 rounding stays within."""
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    return w64 @ x64, np.abs(w64) @ np.abs(x64)


def assert_close_dot(got: np.ndarray, want: np.ndarray, scale: np.ndarray, rtol: float = 2e-6) -> None:
    assert np.all(np.abs(got - want) <= rtol * scale * 8 + 1e-6), float(np.max(np.abs(got - want) - rtol * scale * 8))


@pytest.mark.parametrize("qtype", TYPE_IDS, ids=lambda t: t.name)
def test_gemv_kernel_matches_dequantize_matmul(dev: Dev, qtype: GGMLType) -> None:
    rng = np.random.default_rng(100 + int(qtype))
    n_cols = _n_cols(qtype, dev)
    n_rows = 37 if dev.emulated else 4099
    rows = random_rows(rng, qtype, n_rows, n_cols)
    lin = DeviceLinear(dev.device, BlockStore(dev.device), [linear(rows, qtype, n_cols)])
    x = rng.standard_normal(n_cols).astype(np.float32)
    with dev.device.stream:
        y = dev.device.empty((1, n_rows))
        lin.gemv(dev.device.upload(x[None]), y)
        got = dev.np(y)[0]
    want, scale = _gemv_reference(dequantize_rows(rows, qtype), x)
    assert_close_dot(got, want, scale)


@pytest.mark.parametrize("prologue", ["norm", "silu", "gelu_tanh", "resid"])
def test_gemv_prologues_and_residual(dev: Dev, prologue: str) -> None:
    rng = np.random.default_rng(7)
    n_cols = 512
    parts = [(T.Q5_0, 33), (T.Q5_0, 9), (T.Q8_0, 9)]  # Gemma's q/k/v: two types in one launch
    rows = [random_rows(rng, t, n, n_cols) for t, n in parts]
    lin = DeviceLinear(dev.device, BlockStore(dev.device), [linear(r, t, n_cols) for r, (t, _) in zip(rows, parts)])
    w = np.concatenate([dequantize_rows(r, t) for r, (t, _) in zip(rows, parts)])
    x = rng.standard_normal(n_cols).astype(np.float32)
    x2 = rng.standard_normal(n_cols).astype(np.float32)
    norm_w = (1 + 0.1 * rng.standard_normal(n_cols)).astype(np.float32)
    resid = rng.standard_normal(lin.n_out).astype(np.float32)
    d = dev.device
    with d.stream:
        y = d.upload(resid[None])
        kw: dict[str, Any] = {}
        if prologue == "norm":
            kw = dict(norm_w=d.upload(norm_w), eps=1e-6)
            xin = rms_norm(x, norm_w, 1e-6)
        elif prologue in ("silu", "gelu_tanh"):
            kw = dict(act=ACT_SILU if prologue == "silu" else ACT_GELU_TANH, x2=d.upload(x2))
            xin = (silu(x) if prologue == "silu" else gelu_tanh(x)) * x2
        else:
            kw = dict(resid=y)
            xin = x
        lin.gemv(d.upload(x[None]), y, **kw)
        got = dev.np(y)[0]
    want, scale = _gemv_reference(w, xin)
    if prologue == "resid":
        want = want + resid
    assert_close_dot(got, want, scale + (np.abs(resid) if prologue == "resid" else 0), rtol=1e-5)


def test_tiled_product_equals_one_tile(dev: Dev, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    rows = [random_rows(rng, T.Q8_0, 70, 256), random_rows(rng, T.Q4_K, 30, 256)]
    lin = DeviceLinear(dev.device, BlockStore(dev.device), [linear(rows[0], T.Q8_0, 256), linear(rows[1], T.Q4_K, 256)])
    x = rng.standard_normal((5, 256)).astype(np.float32)
    with dev.device.stream:
        xd = dev.device.upload(x)
        one = dev.np(lin.matmul(xd))
        monkeypatch.setattr(gpu_linear, "TILE_BYTES", 256 * 4 * 16)  # 16 rows a tile
        tiled = dev.np(lin.matmul(xd))
    w = np.concatenate([dequantize_rows(rows[0], T.Q8_0), dequantize_rows(rows[1], T.Q4_K)])
    np.testing.assert_allclose(one, x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tiled, one, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.F32, T.Q4_K], ids=lambda t: t.name)
def test_embedding_rows(dev: Dev, qtype: GGMLType) -> None:
    rng = np.random.default_rng(5)
    rows = random_rows(rng, qtype, 300, 256)
    t = qtensor(rows, qtype, 256)
    ids = np.array([0, 299, 17, 17, 5], np.int64)
    with dev.device.stream:
        out = dev.device.empty((5, 256))
        table = dev.device.upload(rows)
        dev.device.embed(table, int(qtype), 256, dev.device.upload(ids, np.int32), 5, 300, 16.0, out)
        got = dev.np(out)
        bad = dev.device.empty((1, 256))
        dev.device.embed(table, int(qtype), 256, dev.device.upload(np.array([300], np.int32)), 1, 300, None, bad)
        poisoned = dev.np(bad)
    assert_bits_equal(got, t.rows(ids) * np.float32(16.0))
    assert np.isnan(poisoned).all()


@pytest.mark.parametrize("with_resid", [False, True])
def test_rms_norm_rows(dev: Dev, with_resid: bool) -> None:
    rng = np.random.default_rng(9)
    x = rng.standard_normal((7, 640)).astype(np.float32) * 3
    w = (1 + 0.1 * rng.standard_normal(640)).astype(np.float32)
    r = rng.standard_normal((7, 640)).astype(np.float32)
    with dev.device.stream:
        rd = dev.device.upload(r)
        out = dev.device.rms_norm(dev.device.upload(x), dev.device.upload(w), 1e-6,
                                  out=rd if with_resid else None, resid=rd if with_resid else None)
        got = dev.np(out)
    want = rms_norm(x, w, 1e-6) + (r if with_resid else 0)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("act", [ACT_SILU, ACT_GELU_TANH])
def test_gated_activation(dev: Dev, act: int) -> None:
    rng = np.random.default_rng(act)
    gu = (rng.standard_normal((6, 2 * 96)) * 4).astype(np.float32)
    with dev.device.stream:
        got = dev.np(dev.device.gated_act(dev.device.upload(gu), 96, act))
    gate, up = gu[:, :96], gu[:, 96:]
    want = (silu(gate) if act == ACT_SILU else gelu_tanh(gate)) * up
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _state(dev: Dev, start: int, cache: DeviceKVCache) -> Any:
    return dev.device.upload(np.array([0, start, cache.capacity, 0], np.int32))


def _kv_table(dev: Dev, cache: DeviceKVCache) -> Any:
    return dev.device.upload(np.array([dev.backend.address(a) for a in cache.device_rows(0)], np.uint64))


class _Layer:
    """What _rope_store / _attention read off a DeviceLayer."""

    def __init__(self, dev: Dev, freqs: np.ndarray, q_norm: Any, k_norm: Any, scale: float, window: int | None):
        self.freqs = dev.device.upload(freqs, np.float64)
        self.rope_dim = 2 * freqs.size
        self.q_norm, self.k_norm = q_norm, k_norm
        self.plan = type("P", (), {"spec": type("S", (), {"scale": scale}), "window": window})


class _Net:
    """A stand-in GpuNet carrying just what the two launch helpers use, bound to one cache."""

    def __init__(self, dev: Dev, n_heads: int, n_kv: int, d: int, neox: bool, start: int, cache: DeviceKVCache):
        self.device = dev.device
        self.cpu = type("C", (), {"args": type("A", (), {"n_heads": n_heads, "n_kv_heads": n_kv, "head_dim": d})})
        self.plan = type("P", (), {"eps": 1e-6, "neox": neox})
        self.buf = type("B", (), {"state": _state(dev, start, cache), "kv_table": _kv_table(dev, cache)})

    rope_store = GpuNet._rope_store
    attention = GpuNet._attention


@pytest.mark.parametrize("mode,rope_dim,norms,cache_type", [
    ("norm", 16, False, "F32"), ("norm", 10, False, "F16"), ("neox", 32, True, "F32"), ("neox", 24, True, "F16"),
])
def test_rope_and_cache_write(dev: Dev, mode: str, rope_dim: int, norms: bool, cache_type: str) -> None:
    rng = np.random.default_rng(rope_dim)
    hq, hkv, d, t, start = 4, 2, 32, 5, 3
    qkv = rng.standard_normal((t, (hq + 2 * hkv) * d)).astype(np.float32)
    qn = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    kn = (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)
    freqs = rope_freqs(rope_dim, 10000.0)
    cache = DeviceKVCache(dev.device, 1, 0, hkv, d, 64, cache_type)
    cache.reserve(start + t)
    with dev.device.stream:
        net = _Net(dev, hq, hkv, d, mode == "neox", start, cache)
        layer = _Layer(dev, freqs, dev.device.upload(qn) if norms else None, dev.device.upload(kn) if norms else None, 1.0, None)
        q_out = dev.device.empty((hq, t, d))
        net.rope_store(layer, dev.device.upload(qkv), t, q_out, 0, cache.cache_f16)
        q_got = dev.np(q_out)
        k_got = dev.np(cache.dk[0]).astype(np.float32)[:, start : start + t]
        v_got = dev.np(cache.dv[0]).astype(np.float32)[:, start : start + t]
    q = qkv[:, : hq * d].reshape(t, hq, d).transpose(1, 0, 2)
    k = qkv[:, hq * d : (hq + hkv) * d].reshape(t, hkv, d).transpose(1, 0, 2)
    v = qkv[:, (hq + hkv) * d :].reshape(t, hkv, d).transpose(1, 0, 2)
    cos, sin = rope_angles(np.arange(start, start + t), freqs)
    if norms:
        q, k = rms_norm(q, qn, 1e-6), rms_norm(k, kn, 1e-6)
    q, k = apply_rope(q, cos, sin, mode), apply_rope(k, cos, sin, mode)
    tol = dict(rtol=1e-5, atol=1e-5) if cache_type == "F32" else dict(rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(q_got, q, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k_got, k, **tol)
    np.testing.assert_allclose(v_got, v, **tol)
    if cache_type == "F16":
        assert np.array_equal(dev.np(cache.dv[0])[:, start : start + t], v.astype(np.float16))


@pytest.mark.parametrize("t,start,window,n_split,d,cache_type", [
    (1, 40, None, 1, 64, "F32"), (1, 40, None, 4, 64, "F32"), (1, 40, 8, 3, 256, "F32"),
    (7, 0, None, 1, 16, "F32"), (7, 9, 5, 16, 64, "F32"), (6, 20, None, 2, 32, "F16"),
])
def test_attention_kernel(dev: Dev, t: int, start: int, window: int | None, n_split: int, d: int, cache_type: str) -> None:
    rng = np.random.default_rng(t * 100 + start)
    hq, hkv = 4, 2
    s = start + t
    q = rng.standard_normal((hq, t, d)).astype(np.float32)
    k = rng.standard_normal((hkv, s, d)).astype(np.float32)
    v = rng.standard_normal((hkv, s, d)).astype(np.float32)
    if cache_type == "F16":
        k, v = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
    cache = DeviceKVCache(dev.device, 1, 0, hkv, d, 512, cache_type)
    cache.reserve(s)
    scale = 1.0 / math.sqrt(d)
    dtype = np.float16 if cache_type == "F16" else np.float32
    with dev.device.stream:
        cache.dk[0][:, :s] = dev.device.upload(k, dtype)
        cache.dv[0][:, :s] = dev.device.upload(v, dtype)
        net = _Net(dev, hq, hkv, d, False, start, cache)
        out = dev.device.empty((t, hq * d))
        part = dev.device.empty(hq * t * n_split * (d + 2)) if n_split > 1 else None
        layer = _Layer(dev, np.ones(1), None, None, scale, window)
        net.attention(layer, dev.device.upload(q), t, 0, cache.cache_f16, out, part, n_split)
        got = dev.np(out).reshape(t, hq, d).transpose(1, 0, 2)
    pos = np.arange(start, start + t)
    want, _ = attention(q, k, v, causal_mask(pos, s, window), scale)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_argmax_kernel(dev: Dev) -> None:
    n = 262144 if not dev.emulated else 5000
    rng = np.random.default_rng(1)
    cases = [rng.standard_normal(n).astype(np.float32)]
    tie = rng.standard_normal(n).astype(np.float32)
    tie[[n // 3, 17, n - 1]] = 50.0
    cases.append(tie)
    nan = rng.standard_normal(n).astype(np.float32)
    nan[[n - 5, n // 2]] = np.nan
    cases.append(nan)
    cases.append(np.full(n, -np.inf, np.float32))
    with dev.device.stream:
        for x in cases:
            out = dev.device.empty(1, np.int32)
            dev.device.argmax(dev.device.upload(x), n, out)
            assert int(dev.np(out)[0]) == int(np.argmax(x))


def test_out_of_memory_in_a_step_is_a_memory_error(dev: Dev, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real allocation failure on the device (a 1 PiB request), classified and reported as MemoryError."""
    model = load_on(dev, make_tiny_llama(tmp_path / "m.gguf"))
    net = model.net
    assert isinstance(net, GpuNet)

    def huge(self: DeviceLinear, x: Any) -> Any:
        if dev.emulated:
            raise OutOfMemoryError("out of memory allocating 1 PiB")
        return dev.xp.empty(1 << 48, dtype=np.float32)

    monkeypatch.setattr(DeviceLinear, "matmul", huge)
    cache = model.new_cache(64)
    with pytest.raises(InferenceError, match="out of memory"):
        list(generate(model, [5, 6, 7], GenerationConfig(max_tokens=2), cache=cache))
    assert cache.length == 0 and not net.fell_back


# ---- whole models


def tiny_models(tmp: Path) -> dict[str, Path]:
    """Small models with the catalog models' architectures and tensor types."""
    smol = spec("smollm2-135m-instruct", dim=64, hidden=128, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                n_vocab=300, n_ctx=512)
    gemma = spec("gemma3-270m", dim=64, hidden=256, n_layers=6, n_heads=2, n_kv_heads=1, head_dim=128,
                 n_vocab=300, n_ctx=512, window=8)
    return {
        "smollm2-types": write_synthetic(tmp / "smol.gguf", smol, seed=1),
        "gemma3-types": write_synthetic(tmp / "gemma.gguf", gemma, seed=2),
        "llama-q4_0": make_tiny_llama(tmp / "llama.gguf", qtype=T.Q4_0, tied=False),
    }


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_models(tmp_path_factory.mktemp("gpu_models"))


def prose_ids(model: Model, n: int) -> list[int]:
    text = (FIXTURES / "prose.txt").read_text(encoding="utf-8")
    return model.tokenizer.encode(text, add_special=False, parse_special=False)[:n]


def _run_both(dev: Dev, path: Path, ids: list[int], n_prefill: int, **kw: Any) -> tuple[np.ndarray, np.ndarray, Model]:
    """All-position logits of NumPy (one prefill) and of the device (a prefill, then one decode step per token)."""
    ref_model = load_model(path, numerics="float32")  # the CUDA path multiplies float32 activations
    ref = ref_model.forward(ids, ref_model.new_cache(), all_logits=True)
    model = load_on(dev, path, **kw)
    cache = model.new_cache()
    rows = [model.forward(ids[:n_prefill], cache, all_logits=True)]
    cache.commit(ids[:n_prefill])
    for tok in ids[n_prefill:]:
        rows.append(model.forward([tok], cache))
        cache.commit([tok])
    return ref, np.concatenate(rows), model


@pytest.mark.parametrize("name", ["smollm2-types", "gemma3-types", "llama-q4_0"])
def test_forward_matches_numpy(dev: Dev, models: dict[str, Path], name: str) -> None:
    n = 24 if dev.emulated else 200
    model0 = load_model(models[name])
    ids = prose_ids(model0, n)
    ref, got, model = _run_both(dev, models[name], ids, n_prefill=n - 6)
    assert model.backend.name == "cupy" and model.gpu_layers == model.args.n_layers
    assert kld(ref, got).max() <= KLD_BOUND
    assert_same_top(ref, got)


@pytest.mark.parametrize("name,gpu_layers", [("smollm2-types", 1), ("gemma3-types", 4)])
def test_layer_offload_matches_numpy(dev: Dev, models: dict[str, Path], name: str, gpu_layers: int) -> None:
    ids = prose_ids(load_model(models[name]), 16)
    ref, got, model = _run_both(dev, models[name], ids, n_prefill=12, gpu_layers=gpu_layers)
    assert model.gpu_layers == gpu_layers and model.net.n_cpu == model.args.n_layers - gpu_layers
    assert kld(ref, got).max() <= KLD_BOUND
    assert_same_top(ref, got)


def test_f16_kv_cache_matches_numpy_f16_cache(dev: Dev, models: dict[str, Path]) -> None:
    path = models["gemma3-types"]
    ref_model, model = load_model(path, numerics="float32"), load_on(dev, path)
    ids = prose_ids(ref_model, 14)
    a = ref_model.forward(ids, ref_model.new_cache(cache_type="F16"), all_logits=True)
    cache = model.new_cache(cache_type="F16")
    b = model.forward(ids[:10], cache, all_logits=True)
    cache.commit(ids[:10])
    rows = [b]
    for tok in ids[10:]:
        rows.append(model.forward([tok], cache))
        cache.commit([tok])
    assert kld(a, np.concatenate(rows)).max() <= KLD_BOUND
    with pytest.raises(SettingError, match="Q8_0 is not supported on the GPU"):
        model.new_cache(cache_type="Q8_0")


def test_recorder_sees_the_same_run(dev: Dev, models: dict[str, Path]) -> None:
    path = models["gemma3-types"]
    ref_model, model = load_model(path, numerics="float32"), load_on(dev, path, gpu_layers=4)
    ids = prose_ids(ref_model, 12)
    runs = []
    for m in (ref_model, model):
        rec = Recorder(capture_q=True, capture_hidden=True)
        cache = m.new_cache()
        m.forward(ids[:10], cache, rec)
        cache.commit(ids[:10])
        rec.commit()
        m.forward(ids[10:11], cache, rec)
        cache.commit(ids[10:11])
        rec.commit()
        runs.append((rec, cache))
    (r0, c0), (r1, c1) = runs
    for layer in range(ref_model.args.n_layers):
        np.testing.assert_allclose(r1.q[layer][:, :11], r0.q[layer][:, :11], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(r1.hidden[layer][:11], r0.hidden[layer][:11], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(r1.attention(c1, layer, 1), r0.attention(c0, layer, 1), rtol=1e-4, atol=1e-5)


def test_greedy_steps_pick_numpy_tokens(dev: Dev, models: dict[str, Path]) -> None:
    path = models["smollm2-types"]
    ref_model, model = load_model(path, numerics="float32"), load_on(dev, path)
    ids = prose_ids(ref_model, 8)
    picks = []
    for m in (ref_model, model):
        cache = m.new_cache()
        m.forward(ids[:-1], cache)
        cache.commit(ids[:-1])
        tok, out = ids[-1], []
        for _ in range(6):
            tok = m.greedy_step(tok, cache)
            out.append(tok)
        picks.append(out)
    assert picks[0] == picks[1]


def test_generate_on_device(dev: Dev, models: dict[str, Path]) -> None:
    path = models["gemma3-types"]
    ref_model, model = load_model(path, numerics="float32"), load_on(dev, path)
    prompt = prose_ids(ref_model, 10)
    cfg = GenerationConfig(max_tokens=5, sampler=SamplerSettings(temperature=0.0))
    a = [s.token_id for s in generate(ref_model, prompt, cfg)]
    b = [s.token_id for s in generate(model, prompt, cfg)]
    assert a == b


def test_requantized_matrix_is_uploaded_again(dev: Dev, models: dict[str, Path]) -> None:
    path = models["smollm2-types"]
    ref_model, model = load_model(path, numerics="float32"), load_on(dev, path)
    ids = prose_ids(ref_model, 8)
    for m in (ref_model, model):
        lin = m.net.linears()["blk.1.ffn_down.weight"]
        w = lin.weight
        lin.replace(QTensor(w.name, T.Q8_0, w.shape, quantize(w.dequantize() * 2, T.Q8_0)))
    a = ref_model.forward(ids, ref_model.new_cache(), all_logits=True)
    b = model.forward(ids, model.new_cache(), all_logits=True)
    assert kld(a, b).max() <= KLD_BOUND


def test_decode_graph_survives_the_cache_growing(dev: Dev, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_runner, "_decode_split", lambda capacity: 1 if capacity <= 16 else 3)
    monkeypatch.setattr("engine.gpu.cache._MIN_CAPACITY", 16)
    path = models["smollm2-types"]
    ref_model, model = load_model(path, numerics="float32"), load_on(dev, path)
    ids = prose_ids(ref_model, 22)
    ref = ref_model.forward(ids, ref_model.new_cache(), all_logits=True)[-8:]
    cache = model.new_cache()
    model.forward(ids[:-8], cache)
    cache.commit(ids[:-8])
    gen0 = cache.generation
    rows = []
    for tok in ids[-8:]:
        rows.append(model.forward([tok], cache))
        cache.commit([tok])
    assert cache.generation == gen0 + 1 and cache.capacity == 32  # grew from 16 mid-way, with 3 key slices after
    assert kld(ref, np.concatenate(rows)).max() <= KLD_BOUND
    assert set(model.net._graphs) == {(1, False), (3, False)}  # one graph per shape, reused across the move


def test_device_model_looks_like_the_numpy_model(dev: Dev, models: dict[str, Path]) -> None:
    model = load_on(dev, models["llama-q4_0"])
    assert isinstance(model.net, GpuNet) and model.arch == "llama"
    assert model.net.output.weight.name == "output.weight" and len(model.net.layers) == 2
    assert "blk.1.attn_q.weight" in model.net.linears() and model.net.args.n_layers == 2


def test_plain_kv_cache_runs_on_the_cpu(dev: Dev, models: dict[str, Path]) -> None:
    path = models["llama-q4_0"]
    ref_model, model = load_model(path, numerics="float32"), load_on(dev, path)
    a = ref_model.forward([5, 6, 7], ref_model.new_cache())
    b = model.forward([5, 6, 7], KVCache(2, 2, 16, 64))
    np.testing.assert_array_equal(a, b)


def test_bench_reports_the_device(dev: Dev, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("engine.model.get_backend", lambda name="auto": dev.backend)
    r = run_bench(str(models["smollm2-types"]), n_prompt=16, n_gen=4, backend="cupy", reps=1, gpu_layers=1)
    assert r["backend"] == "cupy" and r["gpu_layers"] == 1 and r["gen_tok_s"] > 0 and r["prompt_tok_s"] > 0
    assert r["device"] == dev.backend.device_name()


# ---- the catalog models (real files when present, else synthetic ones with their exact shapes and types)


def _catalog_model(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    real = model_path({"smollm2-135m-instruct": SMOLLM2_FILE, "gemma3-270m": GEMMA3_FILE}[name])
    if real is not None:
        return real
    import os  # noqa: PLC0415

    folder = Path(os.environ.get("GGUF_LENS_SYNTHETIC_DIR", "")) if os.environ.get("GGUF_LENS_SYNTHETIC_DIR") else None
    if folder is not None and (folder / f"{name}.gguf").is_file():
        return folder / f"{name}.gguf"
    return write_synthetic(tmp_path_factory.mktemp("catalog") / f"{name}.gguf", SPECS[name])


@pytest.mark.gpu
@pytest.mark.parametrize("name,key", [("smollm2-135m-instruct", "smollm2"), ("gemma3-270m", "gemma3")])
def test_catalog_model_on_golden_prose(dev: Dev, name: str, key: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The issue's check: KLD between backends <= 1e-4 over the golden prose, the same top token at every position."""
    if dev.emulated:
        pytest.skip("full-size models are too slow for the emulator")
    path = _catalog_model(name, tmp_path_factory)
    ids = load_golden(key).ids
    ref, got, model = _run_both(dev, path, ids, n_prefill=len(ids) - 16)
    assert model.gpu_layers == model.args.n_layers
    k = kld(ref, got)
    print(f"{name}: KLD max {k.max():.2e} mean {k.mean():.2e}, same top {np.mean(ref.argmax(-1) == got.argmax(-1)):.4f}")
    assert k.max() <= KLD_BOUND
    assert_same_top(ref, got)


# ---- faults (emulated device: failures are injected)


def test_device_failure_mid_reply_moves_to_the_cpu_and_keeps_the_conversation(emu: Dev, models: dict[str, Path]) -> None:
    path = models["gemma3-types"]
    ref_model, model = load_model(path, numerics="float32"), load_on(emu, path)
    ids = prose_ids(ref_model, 14)
    ref = ref_model.forward(ids, ref_model.new_cache(), all_logits=True)
    cache = model.new_cache()
    model.forward(ids[:10], cache)
    cache.commit(ids[:10])
    got = [model.forward([ids[10]], cache)]
    cache.commit([ids[10]])
    emu.xp.fail_after, emu.xp.fail_with = 5, CUDARuntimeError(999, "cudaErrorLaunchFailure: unspecified launch failure")
    for tok in ids[11:]:
        got.append(model.forward([tok], cache))
        cache.commit([tok])
    assert model.backend.name == "numpy" and "failed" in model.backend.note and "CPU" in model.backend.note
    assert any("continuing on the CPU" in w for w in model.warnings)
    assert cache.tokens == ids and model.net.fell_back and model.gpu_layers == 0
    assert kld(ref[10:], np.concatenate(got)).max() <= KLD_BOUND
    fresh = model.new_cache()
    assert not isinstance(fresh, DeviceKVCache) or fresh.on_host


def test_out_of_memory_mid_reply_is_an_inference_error_and_the_step_can_be_retried(emu: Dev, models: dict[str, Path]) -> None:
    path = models["smollm2-types"]
    ref_model, model = load_model(path, numerics="float32"), load_on(emu, path)
    prompt = prose_ids(ref_model, 8)
    cfg = GenerationConfig(max_tokens=4, sampler=SamplerSettings(temperature=0.0))
    want = [s.token_id for s in generate(ref_model, prompt, cfg)]
    cache = model.new_cache()
    steps = generate(model, prompt, cfg, cache=cache)
    first = next(steps)
    emu.xp.fail_after, emu.xp.fail_with = 2, OutOfMemoryError("out of memory allocating 512 MiB")
    with pytest.raises(InferenceError, match="ran out of memory"):
        next(steps)
    assert cache.length == len(prompt) and model.backend.name == "cupy"
    again = [s.token_id for s in generate(model, prompt + [first.token_id], GenerationConfig(max_tokens=3, sampler=cfg.sampler), cache=cache)]
    assert [first.token_id] + again == want


def test_out_of_memory_at_load_retries_with_fewer_layers(emu: Dev, models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    real = GpuNet.__init__
    tries: list[int] = []

    def picky(self: GpuNet, cpu: Any, backend: Backend, gpu_layers: int | None = None, on_fallback: Any = None) -> None:
        tries.append(gpu_layers)
        if gpu_layers > 2:
            raise OutOfMemoryError(f"out of memory uploading {gpu_layers} layers")
        real(self, cpu, backend, gpu_layers, on_fallback)

    monkeypatch.setattr(GpuNet, "__init__", picky)
    model = load_on(emu, models["gemma3-types"])
    assert tries == [6, 3, 1] and model.gpu_layers == 1
    assert any("out of GPU memory loading 6 layers; trying 3" in w for w in model.warnings)


def test_memory_estimate_picks_fewer_layers_then_the_cpu(models: dict[str, Path]) -> None:
    path = models["gemma3-types"]
    net = load_model(path, warm=False).net
    est = estimate_gpu_memory(arch_plan(net), net.args, n_ctx=512)
    sizes = [est.needed(n) for n in range(net.args.n_layers + 1)]
    assert sizes[0] == 0 and all(a < b for a, b in zip(sizes, sizes[1:]))
    assert est.layers_that_fit(sizes[3]) == 3 and est.layers_that_fit(sizes[1] - 1) == 0
    notes: list[str] = []
    xp = FakeCupy(free_bytes=sizes[2] + 100)
    runner, backend = to_device(net, Backend("cupy", xp), None, n_ctx=512, notes=notes)
    assert isinstance(runner, GpuNet) and runner.gpu_layers == 2 and backend.name == "cupy"
    assert "not enough GPU memory for 6 layers" in notes[0] and "putting 2 layers on the GPU" in notes[0]
    notes.clear()
    runner, backend = to_device(net, Backend("cupy", FakeCupy(free_bytes=1 << 20)), None, n_ctx=512, notes=notes)
    assert runner is net and backend.name == "numpy" and "running on the CPU" in backend.note


def test_catalog_shapes_estimate(tmp_path: Path) -> None:
    """The estimate of the real SmolLM2 shapes: weights about the file's size, a few hundred MiB in all."""
    path = model_path(SMOLLM2_FILE) or write_synthetic(tmp_path / "s.gguf", SPECS["smollm2-135m-instruct"])
    net = load_model(path, warm=False).net
    est = estimate_gpu_memory(arch_plan(net), net.args, n_ctx=4096)
    weights = sum(est.layer_bytes) + est.head_bytes + est.embed_bytes
    assert 0.9 * path.stat().st_size < weights < 1.05 * path.stat().st_size
    assert est.needed(30) < 1 << 30


def test_gpu_layers_need_a_gpu_backend(models: dict[str, Path]) -> None:
    with pytest.raises(SettingError, match="--gpu-layers needs the cupy"):
        load_model(models["llama-q4_0"], gpu_layers=3)
    with pytest.raises(SettingError, match="must be 0 or more"):
        to_device(load_model(models["llama-q4_0"]).net, Backend("cupy", FakeCupy()), -1)


def test_gpu_layers_zero_keeps_every_layer_on_the_cpu(emu: Dev, models: dict[str, Path]) -> None:
    model = load_on(emu, models["llama-q4_0"], gpu_layers=0)
    assert model.backend.name == "numpy" and model.gpu_layers == 0 and not isinstance(model.net, GpuNet)


def test_unsupported_architecture_stays_on_the_cpu(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    net = load_model(models["llama-q4_0"]).net
    monkeypatch.setattr(type(net), "arch_name", "mamba")
    notes: list[str] = []
    runner, backend = to_device(net, Backend("cupy", FakeCupy()), None, notes=notes)
    assert runner is net and backend.name == "numpy" and "does not run the mamba architecture" in notes[0]

