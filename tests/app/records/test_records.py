"""app.records: records made from a tiny model built in code, from the real SmolLM2 run, and from Gemma 3's file."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
import pytest

from app.records.attention import AttentionRecord, HeadRecord, make_attention_record, make_head_record
from app.records.model import make_model_record, split_tensor_name
from app.records.tensor import make_tensor_record
from engine.observe import attention_maps as am
from engine.observe.recorder import Recorder
from engine.quant import dequantize
from engine.quant.types import GGMLType
from tests.app.test_lenses_common import fake_run, smollm2_run  # noqa: F401 - fixture
from tests.conftest import GEMMA3_FILE, model_path


def _frozen_numpy_only(rec: object) -> None:
    """Records cross threads: frozen, and made of numpy arrays and plain values only."""
    assert dataclasses.is_dataclass(rec) and type(rec).__dataclass_params__.frozen
    for f in dataclasses.fields(rec):
        v = getattr(rec, f.name)
        assert isinstance(v, (np.ndarray, int, float, str, bool, tuple, dict, type(None))) or dataclasses.is_dataclass(v), f.name


def test_split_tensor_name() -> None:
    assert split_tensor_name("blk.12.attn_q.weight") == (12, "attn_q")
    assert split_tensor_name("token_embd.weight") == (None, "token_embd")
    assert split_tensor_name("blk.0.ffn_up.bias") == (0, "ffn_up")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from engine.model import load_model  # noqa: PLC0415
    from tests.tiny_models import make_tiny_llama  # noqa: PLC0415

    path = make_tiny_llama(Path(tmp_path_factory.mktemp("tiny")) / "tiny.gguf", n_layers=2, n_heads=4, n_kv_heads=2)
    return load_model(path)


def test_records_from_a_tiny_model_built_in_code(tiny_model) -> None:
    m = tiny_model
    mr = make_model_record(m)
    _frozen_numpy_only(mr)
    assert (mr.n_layers, mr.n_heads, mr.n_kv_heads, mr.group) == (2, 4, 2, 2)
    assert mr.kv_head(3) == 1 and mr.group_heads(1) == (2, 3)
    assert mr.total_bytes == sum(info.nbytes for info in m.gguf.tensors.values())
    assert {t.role for t in mr.tensors if t.layer == 0} >= {"attn_q", "attn_k", "ffn_down"}
    ids = list(range(3, 23))
    cache, rec = m.new_cache(64), Recorder()
    m.forward(ids, cache, rec)
    cache.commit(ids)
    rec.commit()
    texts = [m.tokenizer.token_text(i) for i in ids]
    att = make_attention_record(m, rec, cache, texts, thumb=8)
    _frozen_numpy_only(att)
    assert att.thumbs.shape == (2, 4, 8, 8) and att.full and len(att.token_texts) == 20
    head = make_head_record(m, rec, cache, 1, 3, None, texts)
    _frozen_numpy_only(head)
    np.testing.assert_allclose(head.weights.sum(axis=1), 1.0, rtol=1e-5)
    assert head.kv_head == 1 and head.group_heads == (2, 3)
    np.testing.assert_allclose(head.weights, rec.attention(cache, 1, 3), rtol=1e-5, atol=1e-7)


def test_attention_record_pools_the_real_attention(smollm2_run) -> None:
    r = smollm2_run
    n = len(r.ids)
    att = make_attention_record(r.model, r.recorder, r.cache, r.texts, thumb=32)
    assert isinstance(att, AttentionRecord) and att.n_tokens == n and att.full
    assert att.thumbs.shape == (30, 9, n, n)  # fewer tokens than 32: one bin per token
    for layer, head in [(0, 0), (7, 4), (29, 8)]:
        w = r.recorder.attention(r.cache, layer, head)
        np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-5)
        np.testing.assert_allclose(np.where(np.tril(np.ones((n, n), bool)), w, np.nan), att.thumbs[layer, head], rtol=1e-4, atol=1e-6)
        assert att.sink[layer, head] == pytest.approx(w[:, 0].mean(), rel=1e-4)
    assert att.sink.mean() > 0.3  # SmolLM2 parks much of its attention on the first token


def test_head_records_one_head_aggregates_and_windows(smollm2_run) -> None:
    r = smollm2_run
    n = len(r.ids)
    one = make_head_record(r.model, r.recorder, r.cache, 5, 2, slice(n - 4, n), r.texts)
    assert isinstance(one, HeadRecord) and one.weights.shape == (4, n) and one.row_start == n - 4
    early = make_head_record(r.model, r.recorder, r.cache, 5, 2, slice(2, 6), r.texts)
    assert early.weights.shape == (4, 6)  # keys stop at the last query row
    np.testing.assert_allclose(one.weights, r.recorder.attention(r.cache, 5, 2, slice(n - 4, n)), rtol=1e-5, atol=1e-7)
    assert one.kv_head == 0 and one.group_heads == (0, 1, 2) and one.window is None
    mean = make_head_record(r.model, r.recorder, r.cache, 5, "mean", None, r.texts)
    direct = np.mean([r.recorder.attention(r.cache, 5, h) for h in range(9)], axis=0)
    np.testing.assert_allclose(mean.weights, direct, rtol=1e-5, atol=1e-7)
    both = make_head_record(r.model, r.recorder, r.cache, "max", "max", slice(0, 3), r.texts)
    direct = np.max([r.recorder.attention(r.cache, layer, h, slice(0, 3))[:, :3] for layer in range(30) for h in range(9)], axis=0)
    np.testing.assert_allclose(both.weights, direct, rtol=1e-5, atol=1e-7)
    assert both.kv_head is None and both.layer == "max"
    pooled = make_head_record(r.model, r.recorder, r.cache, 0, 0, None, r.texts, max_rows=4)
    assert pooled.row_step > 1 and pooled.weights.shape[0] <= 4


def test_model_and_tensor_records_from_smollm2(smollm2_run) -> None:
    m = smollm2_run.model
    mr = make_model_record(m)
    assert mr.arch == "llama" and mr.rope_bases == (100000.0,) and all(x.window is None for x in mr.layers)
    assert mr.layers[0].scale == pytest.approx(1 / 8) and mr.rope_dim == 64 and mr.runnable
    assert 5.0 < mr.average_bpw < 6.5 and len(mr.tensors) == 272
    q = make_tensor_record(m, "blk.3.attn_q.weight", block_index=5)
    assert q.type_name == "Q4_1" and q.shape == (576, 576) and q.weight_counts.sum() == 576 * 576
    assert set(q.scale_counts) == {"d", "m"} and q.scale_counts["d"].sum() == 576 * 576 // 32
    blocks = m.gguf.rows("blk.3.attn_q.weight").reshape(-1, 20)
    np.testing.assert_array_equal(q.block.weights, dequantize(np.array(blocks[5]), GGMLType.Q4_1))
    emb = make_tensor_record(m, "token_embd.weight")
    assert emb.type_name == "Q8_0" and emb.sampled_rows < emb.n_rows  # big tensors are sampled by rows
    norm = make_tensor_record(m, "blk.0.attn_norm.weight")
    assert norm.type_name == "F32" and norm.scale_counts == {} and norm.block.block_size == 1
    with pytest.raises(KeyError, match="no tensor"):
        make_tensor_record(m, "blk.99.attn_q.weight")


def test_gemma3_file_record_has_two_rope_bases_and_windows() -> None:
    path = model_path(GEMMA3_FILE)
    if path is None:
        pytest.skip("gemma-3-270m not found")
    from engine.gguf import open_gguf  # noqa: PLC0415

    with open_gguf(path) as g:
        mr = make_model_record(g)
        assert mr.arch == "gemma3" and mr.n_layers == 18 and mr.group == 4
        assert mr.rope_bases == (10000.0, 1_000_000.0)
        assert [x.index for x in mr.layers if x.window is None] == [5, 11, 17]
        assert all(x.window == 512 for x in mr.layers if x.rope_base == 10000.0)
        t = make_tensor_record(g, "blk.0.ffn_down.weight")
        assert t.type_name in {"Q4_K", "Q6_K", "Q5_0", "Q8_0"} and t.block is not None and t.weight_stats["std"] > 0


def test_timing_at_2000_tokens_prints_only() -> None:
    """Live grid (sampled rows) and a 256-row head window at 2,000 tokens on random data; prints, never asserts."""
    run = fake_run(2000, n_layers=30, n_heads=9, n_kv=3, d=64)
    for max_rows in (32, 64):  # max_rows=None (exact, every row) takes seconds: on demand only
        t = time.perf_counter()
        att = make_attention_record(run.model, run.recorder, run.cache, run.texts, thumb=32, max_rows=max_rows)
        print(f"attention record max_rows={max_rows}: {1000 * (time.perf_counter() - t):.0f} ms, {att.rows.size} rows")
    for args in [(3, 2, slice(1744, 2000)), (3, 2, None), (3, "mean", slice(1744, 2000)), ("mean", "mean", slice(1936, 2000))]:
        t = time.perf_counter()
        hr = make_head_record(run.model, run.recorder, run.cache, *args, run.texts)
        print(f"head record {args}: {1000 * (time.perf_counter() - t):.0f} ms, shape {hr.weights.shape}")
    assert am.sample_rows(2000, 32, 32).size == 32


def test_gemma3_run_marks_local_layers() -> None:
    """When the Gemma 3 forward pass runs, head records carry each layer's sliding window."""
    path = model_path(GEMMA3_FILE)
    if path is None:
        pytest.skip("gemma-3-270m not found")
    from engine.model import load_model  # noqa: PLC0415

    m = load_model(path)
    ids = m.tokenizer.encode("Hello there, how are you?", add_special=True, parse_special=False)
    cache, rec = m.new_cache(64), Recorder()
    m.forward(ids, cache, rec)
    cache.commit(ids)
    rec.commit()
    texts = [m.tokenizer.token_text(i) for i in ids]
    mr = make_model_record(m)
    assert [x.index for x in mr.layers if x.window is None] == [5, 11, 17] and mr.rope_mode == "neox"
    local = make_head_record(m, rec, cache, 0, 1, None, texts)
    glob = make_head_record(m, rec, cache, 5, 1, None, texts)
    assert (local.window, glob.window) == (512, None) and local.group_heads == (0, 1, 2, 3)
    np.testing.assert_allclose(local.weights.sum(axis=1), 1.0, rtol=1e-5)


def test_the_status_note_names_the_kernels_target_and_whose_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """'CPU (AVX2) · numba kernels' where the bits are the AVX2 build's; the other build's bits are said."""
    from types import SimpleNamespace  # noqa: PLC0415

    from app.records.model_info import compute_note  # noqa: PLC0415
    from engine.kernels.dispatch import compiled  # noqa: PLC0415

    if not compiled():
        pytest.skip("the compiled kernels are not in use")
    model = SimpleNamespace(backend=SimpleNamespace(name="numpy"), numerics="ggml")
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx,+avx2,+fma,+f16c")
    monkeypatch.delenv("GGUF_LENS_BITS", raising=False)
    assert compute_note(model).startswith("CPU (AVX2) · ")
    monkeypatch.setenv("GGUF_LENS_BITS", "avx512")
    assert compute_note(model).startswith("CPU (AVX2, AVX-512 bits) · ")
    model.numerics = "float32"
    assert compute_note(model) == "CPU · float32 BLAS"
