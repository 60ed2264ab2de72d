"""Tiled (online-softmax) attention equals the plain path; Gemma 3's sliding window against a naive reference."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from engine.gguf import open_gguf
from engine.ops.attention_tiled import attention_tiled
from engine.ops.reference import attention, causal_mask
from engine.models.weights import Weights
from engine.runtime.numerics import numerics_for
from engine.models.registry import model_class
from engine.tensor import DenseBudget
from tests.tiny_models import make_tiny_gemma3


@pytest.mark.parametrize("window", [None, 100])
@pytest.mark.parametrize("start,t,s", [(0, 700, 700), (1500, 500, 2000), (0, 1, 1)])
def test_tiled_equals_plain_on_long_random_inputs(start: int, t: int, s: int, window: int | None) -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((8, t, 32)).astype(np.float32) * 2
    k = rng.standard_normal((2, s, 32)).astype(np.float32) * 2
    v = rng.standard_normal((2, s, 32)).astype(np.float32)
    pos = np.arange(start, start + t)
    plain, _ = attention(q, k, v, causal_mask(pos, s, window), 0.2)
    tiled = attention_tiled(q, k, v, pos, 0.2, window, tile=128)
    np.testing.assert_allclose(tiled, plain, rtol=1e-4, atol=2e-5)


def load_net(path: Path):
    g = open_gguf(path)
    cls = model_class(g.metadata["general.architecture"])
    return cls(cls.args_from_metadata(g.metadata, g.tensors["token_embd.weight"].shape[1]), Weights(g, DenseBudget(1 << 30)),
               numerics_for("float32"))


def naive_gemma3(net, ids: list[int]) -> np.ndarray:
    """A straightforward reference: every position recomputed with explicit loops, no cache, no masks."""
    a = net.args

    def rms(x, w):
        return x / np.sqrt(np.mean(x.astype(np.float64) ** 2, -1, keepdims=True) + a.norm_eps) * w

    def rope(x, p, base):  # x (d,), neox halves
        n = a.rope_dim // 2
        th = p * base ** (-2.0 * np.arange(n) / a.rope_dim)
        c, s = np.cos(th), np.sin(th)
        y = x.astype(np.float64).copy()
        y[:n], y[n : 2 * n] = x[:n] * c - x[n : 2 * n] * s, x[:n] * s + x[n : 2 * n] * c
        return y

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    n = len(ids)
    x = net.tok_embd.rows(ids).astype(np.float64) * math.sqrt(a.dim)
    for i, L in enumerate(net.layers):
        local = a.is_swa(i)
        base = a.rope_base_swa if local else a.rope_base
        h = rms(x, L.attn_norm)
        q = (h @ L.wq.dense().T).reshape(n, a.n_heads, a.head_dim)
        k = (h @ L.wk.dense().T).reshape(n, a.n_kv_heads, a.head_dim)
        v = (h @ L.wv.dense().T).reshape(n, a.n_kv_heads, a.head_dim)
        out = np.zeros((n, a.n_heads, a.head_dim))
        for hh in range(a.n_heads):
            kv = hh // (a.n_heads // a.n_kv_heads)
            kr = [rope(rms(k[j, kv], L.k_norm), j, base) for j in range(n)]
            for p in range(n):
                qr = rope(rms(q[p, hh], L.q_norm), p, base) / math.sqrt(a.head_dim)
                js = [j for j in range(p + 1) if not local or p - j < a.sliding_window]
                sc = np.array([qr @ kr[j] for j in js])
                w = np.exp(sc - sc.max())
                w /= w.sum()
                out[p, hh] = sum(wj * v[j, kv] for wj, j in zip(w, js))
        o = out.reshape(n, -1) @ L.wo.dense().T
        x = x + rms(o, L.post_attn_norm)
        h = rms(x, L.ffn_norm)
        f = (gelu(h @ L.ffn.w_gate.dense().T) * (h @ L.ffn.w_up.dense().T)) @ L.ffn.w_down.dense().T
        x = x + rms(f, L.post_ffn_norm)
    return rms(x, net.out_norm) @ net.output.dense().T


def test_sliding_window_longer_than_window_matches_naive_reference(tmp_path: Path) -> None:
    net = load_net(make_tiny_gemma3(tmp_path / "g.gguf", window=16, n_layers=6))
    assert [net.args.is_swa(i) for i in range(6)] == [True] * 5 + [False]
    ids = list(np.random.default_rng(1).integers(3, 250, size=60))
    ref = naive_gemma3(net, ids)
    # chunked prefill (chunks straddle the window) and then single-token decode
    cache = net.new_cache(128)
    rows = []
    for c0 in range(0, 40, 13):
        chunk = ids[c0 : min(c0 + 13, 40)]
        rows.append(net.forward(chunk, cache, all_logits=True))
        cache.commit(chunk)
    for tkn in ids[40:]:
        rows.append(net.forward([tkn], cache))
        cache.commit([tkn])
    ours = np.concatenate(rows)
    np.testing.assert_allclose(ours, ref, rtol=1e-3, atol=1e-3)
    # the window matters: with it removed (each layer's RoPE base kept) the logits differ
    net.specs = [dataclasses.replace(spec, window=None) for spec in net.specs]
    full = net.forward(ids, net.new_cache(128), all_logits=True)
    assert np.abs(full[40:] - ref[40:]).max() > 1e-2


def test_tiled_path_on_a_model_equals_plain(tmp_path: Path) -> None:
    net = load_net(make_tiny_gemma3(tmp_path / "g.gguf", window=16, n_layers=6, n_ctx=1024))
    ids = list(np.random.default_rng(2).integers(3, 250, size=300))
    plain = net.forward(ids, net.new_cache(512), all_logits=True)
    assert net.attention_path == "plain"
    net.ops.tiled_min_keys = 64
    tiled = net.forward(ids, net.new_cache(512), all_logits=True)
    assert net.attention_path == "tiled"
    np.testing.assert_allclose(tiled, plain, rtol=1e-4, atol=1e-4)
