"""Head ablation equals a file whose attn_output columns for that head are zero, run unablated (the issue's check).

The copy is written here from the real SmolLM2 Q4_1 file: in every row of blk.L.attn_output.weight the Q4_1 blocks
covering head h's 64 columns get scale and minimum 0 (every weight in them 0). Both numerics give the same logits
bit for bit at every position of a prompt and of decode steps; an ablation that changes nothing is impossible to
pass (the ablated logits differ from the plain ones); bad --ablate-head values are refused by name.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.generate import prefill
from engine.gguf import open_gguf
from engine.intervene.ablation import Ablation, ablate, current, parse_heads
from engine.model import load_model

TOKENS = [1, 504, 3458, 282, 253, 1345, 314, 2724, 28, 357, 3100, 5864, 30, 1032, 1076, 2183, 278, 260, 1619, 42,
          216, 50, 1186, 18, 28]
PREFILL = 16
HEADS = ((3, 4), (20, 0))


def _zeroed_copy(src: Path, dst: Path, heads: tuple[tuple[int, int], ...]) -> Path:
    """src with each (layer, head)'s attn_output columns zeroed in place in its Q4_1 blocks (20 bytes per 32)."""
    data = bytearray(src.read_bytes())
    with open_gguf(src) as g:
        d = g.metadata["llama.embedding_length"] // g.metadata["llama.attention.head_count"]
        for layer, head in heads:
            info = g.tensors[f"blk.{layer}.attn_output.weight"]
            assert info.qtype.name == "Q4_1" and d % 32 == 0
            n_in, n_out = info.shape
            row = n_in // 32 * 20
            for r in range(n_out):
                at = info.offset + r * row + head * d // 32 * 20
                data[at : at + d // 32 * 20] = bytes(d // 32 * 20)
    dst.write_bytes(bytes(data))
    return dst


def _logits(path: Path, numerics: str, heads: tuple[tuple[int, int], ...] = ()) -> np.ndarray:
    model = load_model(path, numerics=numerics)
    try:
        if heads:
            ablate(model, Ablation(heads))
        cache = model.new_cache(64)
        rows = [prefill(model, TOKENS[:PREFILL], cache, all_logits=True)]
        for tok in TOKENS[PREFILL:]:  # decode steps: the ablated model leaves the compiled step for the graph's
            rows.append(model.net.forward([tok], cache))
            cache.commit([tok])
        return np.concatenate(rows)
    finally:
        model.close()


@pytest.mark.parametrize("numerics", ["ggml", "float32"])
def test_ablating_a_head_is_zeroing_its_output_columns(smollm2_path: Path, tmp_path: Path, numerics: str) -> None:
    copy = _zeroed_copy(smollm2_path, tmp_path / "zeroed.gguf", HEADS)
    ablated = _logits(smollm2_path, numerics, HEADS)
    assert np.array_equal(ablated, _logits(copy, numerics))
    plain = _logits(smollm2_path, numerics)
    assert np.abs(plain - ablated).max() > 1e-2  # the heads did something


def test_bad_heads_are_refused_and_clearing_restores(smollm2_path: Path) -> None:
    for text, pattern in (("3", "expected LAYER:HEAD"), ("30:0", "layer 30 out of range"), ("0:9", "head 9 out of range"),
                          ("a:b", "expected LAYER:HEAD")):
        with pytest.raises(SettingError, match=pattern):
            parse_heads([text], 30, 9)
    assert parse_heads(["3:4", " 3 : 4", "1:0"], 30, 9).heads == ((1, 0), (3, 4))
    assert parse_heads(["3:4", "1:0"], 30, 9).describe() == "ablated L1h0, L3h4"
    model = load_model(smollm2_path, numerics="ggml")
    try:
        cache = model.new_cache(32)
        plain = model.net.forward(TOKENS[:8], cache, all_logits=True)
        ablate(model, Ablation(((2, 2),)))
        assert current(model).describe() == "ablated L2h2"
        ablate(model, Ablation())  # cleared: every head back on
        assert current(model).heads == () and np.array_equal(plain, model.net.forward(TOKENS[:8], model.new_cache(32),
                                                                                          all_logits=True))
    finally:
        model.close()


def test_the_cli_takes_ablate_head(smollm2_path: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "t.json"
    tokens.write_text(str(TOKENS[:12]))
    out = tmp_path / "a.npy"
    run = [sys.executable, "-m", "engine.cli", "logits", str(smollm2_path), "--tokens-file", str(tokens), "--out", str(out)]
    done = subprocess.run([*run, "--ablate-head", "3:4", "--ablate-head", "20:0"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "ablated L3h4, L20h0" in done.stderr
    model = load_model(smollm2_path, numerics="ggml")
    try:
        ablate(model, Ablation(HEADS))
        want = prefill(model, TOKENS[:12], model.new_cache(), all_logits=True)
    finally:
        model.close()
    assert np.array_equal(np.load(out), want)
    bad = subprocess.run([*run, "--ablate-head", "99:0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "layer 99 out of range" in bad.stderr and bad.stderr.count("\n") == 1
