"""T5's attention maps (encoder, decoder, cross) and its position-bias tables, on the random-weight T5 test model."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.gguf import open_gguf
from engine.model import load_model
from engine.models.encoder_decoder import relative_bucket
from engine.observe.t5_maps import attention_maps, bucket_edges, position_tables
from tools.make_t5_model import case_ids

N_HEADS, N_BUCKETS = 4, 32


@pytest.fixture
def model(t5_model: Any) -> Any:  # noqa: ANN401
    return t5_model  # tests/conftest.py: the T5 test model in each numerics


def test_three_kinds_of_maps(model: Any) -> None:  # noqa: ANN401
    enc, dec = case_ids("a")
    dec = dec[:17]
    maps = attention_maps(model.net, enc, dec)
    te, td = len(enc), len(dec)
    assert sorted(maps.encoder) == sorted(maps.decoder) == sorted(maps.cross) == [0, 1]
    for layer in (0, 1):
        e, d, c = maps.encoder[layer], maps.decoder[layer], maps.cross[layer]
        assert e.shape == (N_HEADS, te, te) and d.shape == (N_HEADS, td, td) and c.shape == (N_HEADS, td, te)
        for w in (e, d, c):
            assert w.dtype == np.float32 and np.all(w >= 0)
            np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)  # every row is a distribution
        assert np.all(np.triu(d, 1) == 0)  # causal: no decoder position sees a later one
        assert np.all(np.triu(e, 1).sum((1, 2)) > 0)  # bidirectional: encoder positions do see later ones
    assert maps.of("cross") is maps.cross
    with pytest.raises(ValueError, match="kind"):
        maps.of("self")


def test_maps_of_some_layers_and_the_logits_are_untouched(model: Any) -> None:  # noqa: ANN401
    """Asking for layer 1 only keeps layer 1; the model's logits afterwards are what they were (the probe only reads)."""
    enc, dec = case_ids("b")
    before = _logits(model, enc, dec)
    maps = attention_maps(model.net, enc, dec, layers=[1])
    assert list(maps.encoder) == list(maps.decoder) == list(maps.cross) == [1]
    assert np.array_equal(_logits(model, enc, dec), before)


def test_maps_in_both_numerics_agree(t5_q8_path: Path) -> None:
    enc, dec = case_ids("a")
    got = []
    for numerics in ("ggml", "float32"):
        m = load_model(t5_q8_path, numerics=numerics, warm=False)
        got.append(attention_maps(m.net, enc, dec[:12]))
        m.close()
    for kind in ("encoder", "decoder", "cross"):
        for layer in (0, 1):
            np.testing.assert_allclose(got[0].of(kind)[layer], got[1].of(kind)[layer], atol=0.03)


def test_position_tables_match_the_file(model: Any, t5_q8_path: Path) -> None:  # noqa: ANN401
    """The bias laid out against distance is the file's attn_rel_b looked up by llama.cpp's buckets."""
    tables = position_tables(model.net, max_distance=200)
    assert tables.n_buckets == N_BUCKETS
    g = open_gguf(t5_q8_path)
    try:
        for stack, table in (("enc", tables.encoder), ("dec", tables.decoder)):
            raw = np.ascontiguousarray(g.rows(f"{stack}.blk.0.attn_rel_b.weight")).view(np.float32).reshape(N_BUCKETS, N_HEADS)
            assert table.bias.shape == (2, N_HEADS, table.distance.size)
            assert np.array_equal(table.bucket, relative_bucket(table.distance, N_BUCKETS, table.bidirectional))
            for layer in (0, 1):  # the file has block 0's table only: both layers share it
                assert np.array_equal(table.table[layer], raw)
                assert np.array_equal(table.bias[layer], raw[table.bucket].T)
    finally:
        g.close()
    assert tables.encoder.distance[0] == -200 and tables.encoder.distance[-1] == 200 and tables.encoder.bidirectional
    assert tables.decoder.distance[-1] == 0 and not tables.decoder.bidirectional
    assert set(np.unique(tables.decoder.bucket)) == set(range(N_BUCKETS))  # 200 back reaches past 128: every bucket


def test_bucket_edges_cover_each_distance_once() -> None:
    edges = bucket_edges(N_BUCKETS, True, max_distance=150)
    # bucket 16 would be "distance 0, after the query": no distance has it
    assert [b for b, _, _ in edges] == [b for b in range(N_BUCKETS) if b != N_BUCKETS // 2]
    covered = sorted(d for _, lo, hi in edges for d in range(lo, hi + 1))
    assert covered == list(range(-150, 151))
    causal = bucket_edges(N_BUCKETS, False, max_distance=150)
    assert causal[0] == (0, 0, 0) and causal[-1][1] == -150


def _logits(model: Any, enc: list[int], dec: list[int]) -> np.ndarray:  # noqa: ANN401
    cache = model.new_cache()
    model.net.encode(enc, cache)
    return model.forward(dec, cache, all_logits=True)
