"""The hook API and activation patching on SmolLM2 ("The Eiffel Tower is in the city of" / "The Colosseum ...").

Hooks that keep every value leave the logits as they were, to the bit; a hook's replacement is what the next op reads
(zeroing head 4's hook_z equals ablating it). Patching: every position of a layer's residual stream from the clean run
gives the clean logits exactly; patching nothing changes nothing; one cell equals a run built by hand with a hook;
prompts of unequal length and bad names are refused; cancelling keeps the cells done.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.intervene.ablation import Ablation, ablate
from engine.intervene.hooks import attention_pattern, hook_names, run_with_cache, run_with_hooks
from engine.intervene.patching import PatchingCancelled, patch
from engine.model import load_model

CLEAN, CORRUPT = "The Eiffel Tower is in the city of", "The Colosseum is in the city of"


@pytest.fixture(scope="module")
def model(smollm2_path: Path):  # noqa: ANN201
    m = load_model(smollm2_path, numerics="ggml")
    yield m
    m.close()


@pytest.fixture(scope="module")
def ids(model) -> tuple[list[int], list[int]]:  # noqa: ANN001
    return model.tokenizer.encode(CLEAN), model.tokenizer.encode(CORRUPT)


def test_recording_changes_nothing_and_replacements_are_read(model, ids) -> None:  # noqa: ANN001
    clean, _ = ids
    plain = model.net.forward(clean, model.new_cache(16), all_logits=True)
    logits, acts = run_with_cache(model, clean)
    assert np.array_equal(logits, plain) and len(acts) == len(hook_names(model)) == 30 * 5
    assert acts["blocks.7.attn.hook_z"].shape == (len(clean), 9, 64) and acts["blocks.7.hook_mlp_out"].shape == (len(clean), 576)
    resid = acts["blocks.7.hook_resid_post"]
    assert np.array_equal(resid, acts["blocks.8.hook_resid_pre"])
    assert np.allclose(resid, acts["blocks.7.hook_resid_pre"] + acts["blocks.7.hook_attn_out"] + acts["blocks.7.hook_mlp_out"],
                       atol=1e-3)

    def zero_head(z: np.ndarray, name: str) -> np.ndarray:
        z = z.copy()
        z[:, 4] = 0.0
        return z

    hooked = run_with_hooks(model, clean, [("blocks.3.attn.hook_z", zero_head)])
    ablate(model, Ablation(((3, 4),)))
    try:
        ablated = model.net.forward(clean, model.new_cache(16), all_logits=True)
    finally:
        ablate(model, Ablation())
    assert np.array_equal(hooked, ablated) and not np.array_equal(hooked, plain)
    pattern = attention_pattern(model, clean, 2)
    assert pattern.shape == (9, len(clean), len(clean)) and np.allclose(pattern.sum(-1), 1, atol=1e-5)
    with pytest.raises(SettingError, match="no hook point"):
        run_with_hooks(model, clean, [("blocks.30.hook_resid_pre", lambda v, n: None)])
    with pytest.raises(ValueError, match="returned shape"):
        run_with_hooks(model, clean, [("blocks.1.hook_mlp_out", lambda v, n: v[:1])])
    assert not model.net.hooks  # every hook is gone after its run, an error included


def test_patching_restores_exactly_and_one_cell_is_a_hand_built_run(model, ids) -> None:  # noqa: ANN001
    clean, corrupt = ids
    result = patch(model, clean, corrupt)
    tok = model.tokenizer.token_text
    assert tok(result.answer) == " Paris" and tok(result.wrong) == " Rome"
    assert result.scores.shape == (30, len(clean)) and np.isfinite(result.scores).all()
    logits_clean, acts = run_with_cache(model, clean, ["blocks.12.hook_resid_pre"])
    whole = acts["blocks.12.hook_resid_pre"]
    restored = run_with_hooks(model, corrupt, [("blocks.12.hook_resid_pre", lambda v, n: whole)])
    assert np.array_equal(restored, logits_clean)  # every position of a layer patched: the clean run, to the bit
    nothing = run_with_hooks(model, corrupt, [("blocks.12.hook_resid_pre", lambda v, n: None)])
    assert np.array_equal(nothing, model.net.forward(corrupt, model.new_cache(16), all_logits=True))
    layer, p = 5, 2  # ' iffel' vs 'osse'

    def one_cell(v: np.ndarray, name: str) -> np.ndarray:
        v = v.copy()
        v[p] = run_with_cache(model, clean, [name])[1][name][p]
        return v

    by_hand = run_with_hooks(model, corrupt, [(f"blocks.{layer}.hook_resid_pre", one_cell)])
    row = lambda lg: float(lg[-1, result.answer].astype(np.float64) - lg[-1, result.wrong])  # noqa: E731
    want = (row(by_hand) - result.corrupt_diff) / (result.clean_diff - result.corrupt_diff)
    assert result.scores[layer, p] == want
    assert result.scores[0, 0] == 0.0  # the shared first token carries nothing
    assert result.scores[29, -1] > 0.5  # by the last layer the answer lives at the last position


def test_bad_patching_requests_are_refused_and_cancel_keeps_the_cells_done(model, ids) -> None:  # noqa: ANN001
    clean, corrupt = ids
    with pytest.raises(SettingError, match="same length"):
        patch(model, clean, corrupt[:-1])
    with pytest.raises(SettingError, match="both prompts predict"):
        patch(model, clean, clean)
    with pytest.raises(SettingError, match="not one of"):
        patch(model, clean, corrupt, kind="embed")
    calls = iter(range(100))
    with pytest.raises(PatchingCancelled) as info:
        patch(model, clean, corrupt, cancel=lambda: next(calls) >= 12)
    done = info.value.partial.scores
    assert np.isfinite(done).sum() == 12 and np.isnan(done[-1]).all()
    mlp = patch(model, clean, corrupt, kind="mlp_out")
    assert mlp.kind == "mlp_out" and np.isfinite(mlp.scores).all()


def test_patching_each_heads_output(model, ids) -> None:  # noqa: ANN001
    """kind='heads': one head's output (hook_z) at every position from the clean run, a map of layers x heads; one
    cell equals a hand-built run."""
    clean, corrupt = ids
    result = patch(model, clean, corrupt, kind="heads")
    assert result.scores.shape == (30, 9) and np.isfinite(result.scores).all()
    layer, head = 20, 3
    z = run_with_cache(model, clean, [f"blocks.{layer}.attn.hook_z"])[1][f"blocks.{layer}.attn.hook_z"]

    def one_head(v: np.ndarray, name: str) -> np.ndarray:
        v = v.copy()
        v[:, head] = z[:, head]
        return v

    by_hand = run_with_hooks(model, corrupt, [(f"blocks.{layer}.attn.hook_z", one_head)])
    got = float(by_hand[-1, result.answer].astype(np.float64) - by_hand[-1, result.wrong])
    assert result.scores[layer, head] == (got - result.corrupt_diff) / (result.clean_diff - result.corrupt_diff)
