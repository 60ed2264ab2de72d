"""Records of a hybrid model (a random-weight qwen35: layers 0-2 gated DeltaNet, layer 3 attention) as the lenses get
them: the grid with both kinds of rows, a recurrent head up close, head roles, the State view, the KV bytes, the
model's layers, and Compare's head pair. Everything here runs on the engine alone (no Qt).
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from app.jobs.chat import kv_info
from app.jobs.compare import head_pair, max_heads
from app.records.attention import make_attention_record, make_head_record, make_step_record
from app.records.head_roles import make_head_roles_record, make_probe_record
from app.records.kv import kv_bytes_for, kv_formula
from app.records.model import make_model_record
from app.records.model_info import make_model_info
from app.records.recurrent import make_state_record
from engine.observe import attention_maps as amaps
from engine.observe.recorder import Recorder
from engine.observe.recurrent_extend import window_start
from engine.observe.recurrent_maps import ReadsMemo, layer_reads, reads_grid
from tools.make_arch_models import write_arch

TEXT = "The cat sat on the mat, and the cat looked at the dog. The cat sat on the mat."


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory):
    from engine.generate import prefill
    from engine.model import load_model

    model = load_model(write_arch(tmp_path_factory.mktemp("q35") / "qwen35.gguf", "qwen35"))
    cache = model.new_cache(256)
    recorder = Recorder()
    prefill(model, model.tokenizer.encode(TEXT), cache, recorder=recorder)
    texts = [model.tokenizer.token_text(t) for t in cache.tokens]
    yield SimpleNamespace(model=model, cache=cache, recorder=recorder, texts=texts, n=cache.length)
    model.close()


def test_the_model_record_says_which_layers_are_recurrent(hybrid) -> None:
    rec = make_model_record(hybrid.model)
    assert rec.recurrent == (0, 1, 2) and rec.attention_layers == (3,) and rec.hybrid
    assert [x.kind for x in rec.layers] == ["recurrent"] * 3 + ["attention"]
    assert rec.n_v_heads == 4 and rec.n_k_heads == 2 and rec.state_size == 64 and rec.conv_kernel == 4
    assert rec.heads_of(0) == 4 and rec.heads_of(3) == rec.n_heads and rec.max_heads == 4
    assert rec.state_bytes * 3 == hybrid.cache.state_bytes  # the record's number is the cache's own
    info = make_model_info(hybrid.model, 256)
    kinds = dict(info.layer_kinds)
    assert "layers 0–2 (3 of 4)" in kinds["recurrent (gated DeltaNet)"] and "no KV rows" in kinds[
        "recurrent (gated DeltaNet)"]
    assert kinds["attention"].startswith("layers 3 (1 of 4)")
    args = dict(info.args)
    assert args["recurrent"] == "layers 0–2" and "v_heads 4" in args["deltanet"]


def test_kv_bytes_count_the_attention_layers_rows_and_the_constant_states(hybrid) -> None:
    rec = make_model_record(hybrid.model)
    cache = hybrid.cache
    assert kv_bytes_for(rec, cache.length, cache.cache_type) == cache.nbytes  # rows of layer 3 + 3 states
    grown = kv_bytes_for(rec, 2 * cache.length, cache.cache_type)
    assert grown - cache.nbytes == cache.bytes_for(cache.length)  # only the KV rows grow
    info = kv_info(cache, ["plain"])
    assert info.state_bytes == cache.state_bytes and info.full_bytes == cache.bytes_for(cache.n_ctx) + cache.state_bytes
    assert "1 attention layers" in kv_formula(rec, 100, "F16") and "3 recurrent states" in kv_formula(rec, 100, "F16")


def test_the_grid_has_a_row_per_layer_of_both_kinds(hybrid) -> None:
    memo = ReadsMemo()
    rec = make_attention_record(hybrid.model, hybrid.recorder, hybrid.cache, hybrid.texts, reads_memo=memo)
    assert rec.layers == (0, 1, 2, 3) and rec.recurrent == (True, True, True, False) and rec.hybrid
    assert rec.heads == (4, 4, 4, 4) and rec.thumbs.shape[:2] == (4, 4) and rec.n_tokens == hybrid.n
    assert rec.layer_of(3) == 3 and rec.row_of(2) == 2 and rec.is_recurrent(0) and not rec.is_recurrent(3)
    assert memo.computed == 3
    att = amaps.attention_grid(hybrid.recorder, hybrid.cache, [3], thumb=32)
    np.testing.assert_array_equal(rec.thumbs[3], att.max_pooled[0])  # the attention row is the attention grid's
    reads = reads_grid([layer_reads(hybrid.recorder, i) for i in (0, 1, 2)], hybrid.n, thumb=32)
    np.testing.assert_array_equal(rec.thumbs[:3], reads.max_pooled)
    assert np.isfinite(rec.earlier[:3]).all() and np.isnan(rec.earlier[3]).all() and rec.read_start == 0
    again = make_attention_record(hybrid.model, hybrid.recorder, hybrid.cache, hybrid.texts, reads_memo=memo)
    assert memo.computed == 3 and np.array_equal(again.thumbs, rec.thumbs, equal_nan=True)  # decomposed once


def test_a_recurrent_head_up_close_is_its_exact_reads(hybrid) -> None:
    n = hybrid.n
    head = make_head_record(hybrid.model, hybrid.recorder, hybrid.cache, 1, 2, None, hybrid.texts)
    assert head is not None and head.recurrent and head.layer == 1 and head.head == 2
    assert head.weights.shape == (n, n) and head.signed is not None and head.kv_head == 0
    assert head.group_heads == (0, 2) and head.n_key_heads == 2 and head.window is None
    reads = layer_reads(hybrid.recorder, 1)
    np.testing.assert_allclose(head.signed, reads.reads.weights[2], atol=1e-7)
    np.testing.assert_allclose(head.weights.sum(-1) + head.earlier, 1.0, atol=1e-5)
    assert (head.allowed == np.tril(np.ones((n, n), bool))).all()
    part = make_head_record(hybrid.model, hybrid.recorder, hybrid.cache, 1, 2, slice(5, 9), hybrid.texts)
    np.testing.assert_array_equal(part.weights, head.weights[5:9, :9])
    mean = make_head_record(hybrid.model, hybrid.recorder, hybrid.cache, 0, "mean", None, hybrid.texts)
    per = [make_head_record(hybrid.model, hybrid.recorder, hybrid.cache, 0, h, None, hybrid.texts).weights
           for h in range(4)]
    np.testing.assert_allclose(mean.weights, np.mean(per, axis=0), atol=1e-6)
    assert mean.signed is None and mean.head == "mean"
    layers = make_head_record(hybrid.model, hybrid.recorder, hybrid.cache, "mean", 1, None, hybrid.texts)
    assert layers is not None and not layers.recurrent  # 'mean of layers' is the attention layers'
    attn = make_head_record(hybrid.model, hybrid.recorder, hybrid.cache, 3, 1, None, hybrid.texts)
    assert attn is not None and attn.kind == "attention"
    assert make_step_record(hybrid.model, hybrid.recorder, hybrid.cache, hybrid.texts, 0, 0, None) is None


def test_head_roles_score_recurrent_heads_on_their_reads(hybrid) -> None:
    rec = make_head_roles_record(hybrid.model, hybrid.recorder, hybrid.cache, hybrid.texts)
    assert rec is not None and rec.roles.layers == (0, 1, 2, 3) and rec.recurrent == (0, 1, 2)
    assert np.isfinite(rec.roles.scores["previous"]).all()
    head = make_head_record(hybrid.model, hybrid.recorder, hybrid.cache, 2, 3, None, hybrid.texts)
    rows = rec.roles.rows[rec.roles.rows >= 1]
    np.testing.assert_allclose(rec.roles.scores["previous"][2, 3], head.weights[rows, rows - 1].mean(), atol=1e-5)
    probe = make_probe_record(hybrid.model)
    assert probe.recurrent == (0, 1, 2) and probe.roles.layers == (0, 1, 2, 3)


def test_the_state_record_holds_writes_decays_and_bytes(hybrid) -> None:
    st = make_state_record(hybrid.model, hybrid.recorder, hybrid.cache, hybrid.texts)
    assert st is not None and st.layers == (0, 1, 2) and st.n_tokens == hybrid.n
    got = hybrid.recorder.recurrent_inputs(1)
    np.testing.assert_array_equal(st.wrote[1], got["beta"])
    np.testing.assert_allclose(st.kept[1], np.exp(got["g"]), rtol=1e-6)
    assert ((st.wrote > 0) & (st.wrote < 1)).all() and ((st.kept > 0) & (st.kept <= 1)).all()
    assert st.state_total == hybrid.cache.state_bytes and st.matrix_bytes == 4 * 4 * 64 * 64
    assert st.attention_layers == (3,) and st.kv_bytes == hybrid.cache.bytes_for(hybrid.n)
    assert st.kv_at(100) == hybrid.cache.bytes_for(100)
    life = st.half_life(0)
    g = np.log(st.kept[0].astype(np.float64)).mean(axis=0)
    np.testing.assert_allclose(life, np.log(0.5) / g, rtol=1e-5)


def test_compare_head_pairs_reach_every_layer_of_a_hybrid(hybrid) -> None:
    run = SimpleNamespace(model=hybrid.model, recorder=hybrid.recorder, cache=hybrid.cache)
    ws = SimpleNamespace(last=SimpleNamespace(a=run, b=run, texts=hybrid.texts))
    assert max_heads(hybrid.model) == 4
    for layer in (0, 3):
        pair = head_pair(ws, layer, 9)  # the head is clipped to the layer's own
        assert pair.layer == layer and pair.head == 3 and pair.a.recurrent == (layer == 0)
        assert np.allclose(pair.difference()[pair.a.allowed], 0.0)


def test_past_the_window_the_earlier_context_is_one_share(hybrid) -> None:
    n, window = hybrid.n, 16
    memo = ReadsMemo(window=window)
    head = make_head_record(hybrid.model, hybrid.recorder, hybrid.cache, 0, 1, None, hybrid.texts, reads_memo=memo)
    start = window_start(n, window)  # the last `window` positions and up to a stride more
    assert n - window - 2 < start <= n - window and head.read_start == start and head.recurrent
    assert not head.allowed[:start].any() and not head.allowed[:, :start].any()  # before the window: not decomposed
    inside = head.weights[start:].sum(-1) + head.earlier[start:]
    np.testing.assert_allclose(inside, 1.0, atol=1e-5)
    assert (head.earlier[start:] > 0).all() and np.isnan(head.earlier[:start]).all()
    rec = make_attention_record(hybrid.model, hybrid.recorder, hybrid.cache, hybrid.texts, reads_memo=memo)
    assert rec.read_start == start and (rec.earlier[:3] > 0).all()
    assert np.isnan(rec.thumbs[0, :, 0]).all()  # the first rows' bin lies wholly before the window
    roles = make_head_roles_record(hybrid.model, hybrid.recorder, hybrid.cache, hybrid.texts, reads_memo=memo)
    assert roles.read_start == start and roles.roles.rows.min() == 0  # attention rows from 0, recurrent from start
