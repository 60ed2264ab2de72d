"""Shared set-up for the lens tests: synthetic recorder/cache, synthetic model records, the real SmolLM2 run.

The records themselves are made by app.records from a fake Recorder and KV cache filled with random
queries and keys, so the widget tests go through the same code as the app.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything imports Qt

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import engine.models.registry  # noqa: E402,F401 - import order: the models before engine.observe.recorder
from app.records.attention import make_attention_record, make_head_record  # noqa: E402
from app.records.model import LayerInfo, ModelRecord, TensorRow  # noqa: E402
from engine.cache import KVCache  # noqa: E402
from engine.models.args import LayerAttentionSpec
from engine.observe.recorder import Recorder  # noqa: E402
from tests.conftest import SMOLLM2_FILE, model_path  # noqa: E402


@dataclass
class FakeRun:
    """A recorder and cache as a forward pass would leave them, with random post-RoPE q and k."""

    model: SimpleNamespace
    recorder: Recorder
    cache: KVCache
    texts: list[str]


def fake_run(n_tokens: int = 40, n_layers: int = 3, n_heads: int = 4, n_kv: int = 2, d: int = 8,
             windows: tuple[int | None, ...] | None = None, seed: int = 0, sink: float = 3.0) -> FakeRun:
    """Random queries/keys (key 0 made a strong 'sink') for n_layers layers; windows per layer optional."""
    rng = np.random.default_rng(seed)
    rec = Recorder()
    cache = KVCache(n_layers, n_kv, d, 8192)
    cache.reserve(n_tokens)
    for layer in range(n_layers):
        window = windows[layer] if windows else None
        rec.specs[layer] = LayerAttentionSpec(1.0 / np.sqrt(d), window, n_heads // n_kv, 10000.0)
        rec.q[layer] = rng.standard_normal((n_heads, n_tokens + 5, d)).astype(np.float32)
        kk = rng.standard_normal((n_kv, n_tokens, d)).astype(np.float32)
        kk[:, 0] = rec.q[layer][:, :n_tokens].mean(axis=1).reshape(n_kv, -1, d).mean(axis=1) * sink  # a strong key 0
        cache.write(layer, 0, kk, np.zeros_like(kk))
    cache.commit(list(range(n_tokens)))
    rec.length = n_tokens
    model = SimpleNamespace(args=SimpleNamespace(n_heads=n_heads, n_layers=n_layers))
    texts = ["<s>"] + [f" w{i}" if i % 5 else "\n" for i in range(1, n_tokens)]
    return FakeRun(model, rec, cache, texts)


def synthetic_model_record(n_layers: int = 3, n_heads: int = 4, n_kv: int = 2, windows: tuple[int | None, ...] | None = None,
                           bases: tuple[float, ...] | None = None) -> ModelRecord:
    """A ModelRecord of a small made-up model with a few tensors of mixed types."""
    layers = tuple(
        LayerInfo(i, (bases[i] if bases else 10000.0), (windows[i] if windows else None), 0.125) for i in range(n_layers)
    )
    rows = [TensorRow("token_embd.weight", None, "token_embd", "Q8_0", (64, 100), 6800, 8.5, 6400)]
    for i in range(n_layers):
        for role, qt, bpw in (("attn_q", "Q4_K", 4.5), ("attn_k", "Q6_K", 6.5625), ("ffn_down", "Q4_0", 4.5), ("attn_norm", "F32", 32.0)):
            n = 64 if role == "attn_norm" else 64 * 256
            rows.append(TensorRow(f"blk.{i}.{role}.weight", i, role, qt, (64,) if n == 64 else (256, 64), int(n * bpw / 8), bpw, n))
    return ModelRecord(
        name="tiny", arch="llama", path="/tmp/tiny.gguf", dim=64, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=16, n_vocab=100, n_ctx=512, rope_dim=16, rope_mode="norm", group=n_heads // n_kv, layers=layers,
        tensors=tuple(rows), file_bytes=sum(r.nbytes for r in rows) + 4096, runnable=True,
    )


def fake_records(run: FakeRun, layer: int | str = 0, head: int | str = 0, rows: slice | None = None):
    """(AttentionRecord, HeadRecord) of a fake run."""
    att = make_attention_record(run.model, run.recorder, run.cache, run.texts, thumb=16)
    hr = make_head_record(run.model, run.recorder, run.cache, layer, head, rows, run.texts)
    return att, hr


@dataclass
class RealRun:
    model: object
    recorder: Recorder
    cache: object
    texts: list[str]
    ids: list[int]


@pytest.fixture(scope="session")
def smollm2_run() -> RealRun:
    """SmolLM2 run on a short prompt with a Recorder (skipped when the model file is absent)."""
    path: Path | None = model_path(SMOLLM2_FILE)
    if path is None:
        pytest.skip(f"model {SMOLLM2_FILE} not found (set GGUF_LENS_MODELS_DIR)")
    from engine.model import load_model  # noqa: PLC0415

    model = load_model(path)
    ids = model.tokenizer.encode("The cat sat on the mat. The cat", add_special=True, parse_special=False)
    if not ids or ids[0] != 1:
        ids = [1] + list(ids)  # <|im_start|> as a first, sink-like token
    cache = model.new_cache(256, "F32")
    rec = Recorder()
    model.forward(ids, cache, rec)
    cache.commit(ids)
    rec.commit()
    texts = [model.tokenizer.token_text(i) for i in ids]
    return RealRun(model, rec, cache, texts, list(ids))


def test_fake_run_is_consistent_with_the_recorder() -> None:
    run = fake_run(12)
    w = run.recorder.attention(run.cache, 1, 3)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-5)
