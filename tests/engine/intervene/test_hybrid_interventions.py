"""Ablation, hooks, patching, control vectors and the importance matrix on a DeltaNet hybrid (qwen35 test model)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.generate import prefill
from engine.gguf import write_gguf
from engine.intervene.ablation import Ablation, ablate, head_means, parse
from engine.intervene.hooks import run_with_cache
from engine.intervene.patching import patch
from engine.model import load_model
from engine.quality.imatrix_collect import compute_imatrix_tokens
from tools.make_arch_models import build, token_ids

IDS = token_ids()[:48]


def _file(tmp_path: Path, zero: tuple[tuple[int, int], ...] = ()) -> Path:
    """The qwen35 test model; with `zero`, each (layer, value head)'s ssm_out columns set to zero."""
    md, ts = build("qwen35")
    out = []
    for name, q, shape, arr in ts:
        for layer, head in zero:
            if name == f"blk.{layer}.ssm_out.weight":
                arr = arr.copy()
                arr[:, head * 64 : (head + 1) * 64] = 0.0  # (dim, value_dim): columns of value head `head`
        out.append((name, q, shape, arr))
    path = tmp_path / ("zeroed.gguf" if zero else "qwen35.gguf")
    write_gguf(path, md, out)
    return path


def _logits(path: Path, numerics: str, ablation: Ablation | None = None) -> np.ndarray:
    model = load_model(path, numerics=numerics)
    try:
        if ablation is not None:
            ablate(model, ablation)
        return prefill(model, IDS, model.new_cache(128), all_logits=True)
    finally:
        model.close()


@pytest.mark.parametrize("numerics", ["ggml", "float32"])
def test_zeroing_a_recurrent_head_is_zeroing_its_ssm_out_columns(tmp_path: Path, numerics: str) -> None:
    heads = ((0, 1), (2, 3))
    got = _logits(_file(tmp_path), numerics, Ablation(heads=heads))
    want = _logits(_file(tmp_path, heads), numerics)
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, _logits(_file(tmp_path), numerics))


def test_heads_are_checked_per_layer_and_mean_ablation_is_for_attention_heads(tmp_path: Path) -> None:
    model = load_model(_file(tmp_path), numerics="float32")
    try:
        with pytest.raises(SettingError, match="value heads"):
            ablate(model, Ablation(heads=((1, 4),)))  # four value heads in a recurrent layer
        assert set(parse(model, heads=["3:3", "0:2"]).heads) == {(3, 3), (0, 2)}
        with pytest.raises(SettingError, match="recurrent"):
            head_means(model, IDS, Ablation(heads=((0, 1),)))
        ablate(model, Ablation(attn_layers=(1,), ffn_layers=(3,)))  # a recurrent layer's mixer switched off
        off = prefill(model, IDS, model.new_cache(128))
        ablate(model, Ablation())
        assert not np.array_equal(off, prefill(model, IDS, model.new_cache(128)))
    finally:
        model.close()


def test_hooks_see_the_recurrent_heads_and_patching_runs_over_every_layer(tmp_path: Path) -> None:
    model = load_model(_file(tmp_path), numerics="float32")
    try:
        _, acts = run_with_cache(model, IDS[:20], ["blocks.0.attn.hook_z", "blocks.3.attn.hook_z",
                                                   "blocks.1.hook_attn_out"])
        assert acts["blocks.0.attn.hook_z"].shape == (20, 4, 64)  # value heads of the DeltaNet layer
        assert acts["blocks.3.attn.hook_z"].shape == (20, 4, 64)  # query heads of the attention layer
        clean, corrupt = IDS[:12], IDS[:5] + [IDS[40]] + IDS[6:12]
        res = patch(model, clean, corrupt, kind="heads")
        assert res.scores.shape == (4, 4) and np.isfinite(res.scores).all()
        res = patch(model, clean, corrupt, kind="resid_pre")
        assert np.isfinite(res.scores).all()
        assert abs(res.scores[0, 5] - 1.0) < 1e-4  # restoring the changed token's residual entering layer 0 restores all
    finally:
        model.close()


def test_a_control_vector_moves_a_hybrid(tmp_path: Path) -> None:
    model = load_model(_file(tmp_path), numerics="ggml")
    try:
        base = prefill(model, IDS, model.new_cache(128))
        model.net.control = {1: np.full(256, 0.05, np.float32)}  # build_cvec after a recurrent block
        moved = prefill(model, IDS, model.new_cache(128))
        model.net.control = {}
        assert not np.array_equal(base, moved)
        np.testing.assert_array_equal(base, prefill(model, IDS, model.new_cache(128)))
    finally:
        model.close()


def test_the_importance_matrix_covers_the_recurrent_layers_products(tmp_path: Path) -> None:
    model = load_model(_file(tmp_path), numerics="ggml")
    try:
        im = compute_imatrix_tokens(model, [IDS[:24], IDS[24:48]])
    finally:
        model.close()
    names = set(im.sums)
    for part in ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out"):
        assert f"blk.0.{part}.weight" in names, sorted(names)[:20]
    assert "blk.3.attn_q.weight" in names and "blk.3.ffn_down.weight" in names
