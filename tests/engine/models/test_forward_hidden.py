"""Model.forward_hidden then logits_of in head_blocks gives forward(all_logits=True)'s logits bit for bit and the
same cache (app.jobs.compare takes a long vocabulary's logits that way), over the product paths whose kernel depends
on the batch (k-quants tiled from 8 rows, Q4_0 and IQ4_NL repacked, Q2_K in eights, BF16 tinyBLAS); an
encoder-decoder says it cannot."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.generate import head_blocks, logits_checked, run_checked, run_hidden_checked
from engine.model import load_model
from tests.engine.arch_files import arch_file

ARCHS = [("llama3", "Q4_K_M"), ("llama3", "Q4_0"), ("llama3", "IQ4_NL"), ("gemma2", "Q8_0"), ("gemma3", "Q4_0"),
         ("qwen35", "Q4_K_M"), ("qwen3moe", "Q2_K"), ("gemma4", None), ("phi3", "BF16")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hidden")


@pytest.mark.parametrize("name, preset", ARCHS)
@pytest.mark.parametrize("cache_type", ["F32", "F16"])
def test_the_head_a_few_rows_at_a_time_equals_the_whole_forward(folder: Path, name: str, preset: str | None,
                                                                cache_type: str) -> None:
    model = load_model(arch_file(folder, name, preset))
    rng = np.random.default_rng(7)
    ids = [int(i) for i in rng.integers(0, int(model.args.n_vocab), 90)]
    chunks = (ids[:40], ids[40:77], ids[77:])  # blocks of 16+24, 16+21, and 13 rows whole
    whole_cache, split_cache = model.new_cache(96, cache_type), model.new_cache(96, cache_type)
    want = np.concatenate([run_checked(model, c, whole_cache, None, all_logits=True) for c in chunks])
    parts = []
    for chunk in chunks:
        x = run_hidden_checked(model, chunk, split_cache, None)
        assert x is not None and x.shape == (len(chunk), int(model.args.dim))
        parts += [logits_checked(model, x[r0:r1]) for r0, r1 in head_blocks(len(chunk), 16)]
    np.testing.assert_array_equal(np.concatenate(parts), want)
    assert split_cache.length == whole_cache.length == len(ids)
    if hasattr(whole_cache, "k"):
        np.testing.assert_array_equal(np.asarray(split_cache.k[0][: len(ids)]), np.asarray(whole_cache.k[0][: len(ids)]))


def test_head_blocks_start_at_eights_and_never_hold_under_16_rows() -> None:
    assert head_blocks(40, 16) == [(0, 16), (16, 40)] and head_blocks(13, 16) == [(0, 13)]
    assert head_blocks(128, 48) == [(0, 48), (48, 96), (96, 128)] and head_blocks(128, 82) == [(0, 80), (80, 128)]
    assert head_blocks(50, 48) == [(0, 50)] and head_blocks(1, 48) == [(0, 1)]
    for rows in range(1, 300):
        for most in (16, 20, 48, 82, 128):
            blocks = head_blocks(rows, most)
            assert blocks[0][0] == 0 and blocks[-1][1] == rows
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))
            assert all(r0 % 8 == 0 and (r1 - r0 >= 16 or len(blocks) == 1) for r0, r1 in blocks)


def test_an_encoder_decoder_cannot_stop_before_its_head(folder: Path) -> None:
    model = load_model(arch_file(folder, "t5"))
    assert model.forward_hidden([1, 2, 3], model.new_cache(16), None) is None
