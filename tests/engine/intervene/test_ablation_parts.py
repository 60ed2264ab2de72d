"""Ablating a layer's attention, its FFN, an expert, or a head by its mean: each equals a file built to do the same.

- a layer's attention or FFN left out equals a copy of the file whose `attn_output` / `ffn_down` blocks are all zero
  (SmolLM2, both numerics, prompt and decode steps, bit for bit);
- an expert ablated equals a copy of the gpt-oss test model whose router bias for that expert is -inf (the router can
  never choose it), and the routing recorder never shows it;
- a mean-ablated head equals running the plain model with a hook that writes the head's mean output (taken by the
  test from the plain run) at every position, and differs from the zeroed head and the plain model.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.generate import prefill
from engine.gguf import open_gguf, write_gguf
from engine.intervene import ablation as ab
from engine.intervene.hooks import run_with_cache, run_with_hooks
from engine.model import load_model
from engine.observe.recorder import Recorder
from tests.engine.intervene.test_ablation import TOKENS, _logits
from tools.make_arch_models import build


def _zeroed_tensors(src: Path, dst: Path, names: list[str]) -> Path:
    """src with every byte of the named tensors zero (every ggml type then decodes to 0: its scales are 0)."""
    data = bytearray(src.read_bytes())
    with open_gguf(src) as g:
        for name in names:
            info = g.tensors[name]
            data[info.offset : info.offset + info.nbytes] = bytes(info.nbytes)
    dst.write_bytes(bytes(data))
    return dst


def _run(path: Path, numerics: str, what: ab.Ablation) -> np.ndarray:
    model = load_model(path, numerics=numerics)
    try:
        ab.ablate(model, what)
        return _logits_of(model)
    finally:
        model.close()


def _logits_of(model) -> np.ndarray:  # noqa: ANN001
    cache = model.new_cache(64)
    rows = [prefill(model, TOKENS[:16], cache, all_logits=True)]
    for tok in TOKENS[16:]:
        rows.append(model.net.forward([tok], cache))
        cache.commit([tok])
    return np.concatenate(rows)


@pytest.mark.parametrize("numerics", ["ggml", "float32"])
def test_a_layers_attention_or_ffn_left_out_is_a_zeroed_tensor(smollm2_path: Path, tmp_path: Path, numerics: str) -> None:
    what = ab.Ablation(attn_layers=(4,), ffn_layers=(11, 29))
    copy = _zeroed_tensors(smollm2_path, tmp_path / "zeroed.gguf",
                           ["blk.4.attn_output.weight", "blk.11.ffn_down.weight", "blk.29.ffn_down.weight"])
    ablated = _run(smollm2_path, numerics, what)
    assert np.array_equal(ablated, _logits(copy, numerics))
    assert np.abs(ablated - _logits(smollm2_path, numerics)).max() > 1e-1


def _gpt_oss(tmp_path: Path, bias_minus_inf: tuple[int, int] | None = None) -> Path:
    md, ts = build("gpt_oss")
    out = []
    for name, qtype, shape, arr in ts:
        if bias_minus_inf is not None and name == f"blk.{bias_minus_inf[0]}.ffn_gate_inp.bias":
            arr = np.array(arr, np.float32, copy=True)
            arr[bias_minus_inf[1]] = -np.inf
        out.append((name, qtype, shape, arr))
    path = tmp_path / f"gpt_oss-{bias_minus_inf}.gguf"
    write_gguf(path, md, out)
    return path


def _oss_logits(path: Path, numerics: str, what: ab.Ablation, rec: Recorder | None = None) -> np.ndarray:
    model = load_model(path, numerics=numerics)
    try:
        ab.ablate(model, what)
        ids = list(range(3, 40))
        return model.net.forward(ids, model.new_cache(64), rec, all_logits=True)
    finally:
        model.close()


@pytest.mark.parametrize("numerics", ["ggml", "float32"])
def test_an_ablated_expert_is_one_the_router_cannot_choose(tmp_path: Path, numerics: str) -> None:
    plain_path, layer = _gpt_oss(tmp_path), 1
    rec = Recorder()
    rec.begin(0, 37)
    plain = _oss_logits(plain_path, numerics, ab.Ablation(), rec)
    rec.commit()
    counts = np.bincount(rec.routing_of(layer)[0].ravel(), minlength=8)
    expert = int(np.argmax(counts))  # the expert chosen most often: ablating it changes the most
    rec = Recorder()
    rec.begin(0, 37)
    ablated = _oss_logits(plain_path, numerics, ab.Ablation(experts=((layer, expert),)), rec)
    rec.commit()
    chosen, _, probs = rec.routing_of(layer)
    assert chosen.shape == (37, 4) and expert not in chosen and np.all(probs[:, expert] == 0)
    assert np.array_equal(ablated, _oss_logits(_gpt_oss(tmp_path, (layer, expert)), numerics, ab.Ablation()))
    assert np.abs(ablated - plain).max() > 1e-3


def test_a_mean_ablated_head_outputs_its_mean_over_the_context(smollm2_path: Path) -> None:
    model = load_model(smollm2_path, numerics="ggml")
    try:
        ids, (layer, head) = TOKENS[:20], (3, 4)
        plain, acts = run_with_cache(model, ids, [f"blocks.{layer}.attn.hook_z"])
        mean = acts[f"blocks.{layer}.attn.hook_z"][:, head].astype(np.float64).mean(axis=0).astype(np.float32)

        def put_mean(z: np.ndarray, name: str) -> np.ndarray:
            z = z.copy()
            z[:, head] = mean
            return z

        want = run_with_hooks(model, ids, [(f"blocks.{layer}.attn.hook_z", put_mean)])
        what = ab.head_means(model, ids, ab.Ablation(heads=((layer, head),)))
        assert what.describe() == "ablated L3h4 (mean over 20 tokens)"
        ab.ablate(model, what)
        got = model.net.forward(ids, model.new_cache(32), all_logits=True)
        assert np.array_equal(got, want)
        ab.ablate(model, ab.Ablation(heads=((layer, head),)))
        zeroed = model.net.forward(ids, model.new_cache(32), all_logits=True)
        assert np.abs(got - plain).max() > 1e-3 and np.abs(got - zeroed).max() > 1e-3
        with pytest.raises(SettingError, match="context to average over"):
            ab.head_means(model, [], ab.Ablation(heads=((layer, head),)))
    finally:
        model.close()


def test_bad_parts_are_refused_by_name(smollm2_path: Path) -> None:
    model = load_model(smollm2_path, numerics="ggml")
    try:
        for kwargs, pattern in (({"attn": ["30"]}, "--ablate-attn 30: layer 30 out of range"),
                                ({"ffn": ["x"]}, "--ablate-ffn 'x': expected a layer number"),
                                ({"experts": ["1:2"]}, "--ablate-expert 1:2: the model has no experts")):
            with pytest.raises(SettingError, match=pattern):
                ab.parse(model, **kwargs)
        what = ab.parse(model, heads=["2:1"], attn=["5", "5"], ffn=["7"])
        assert what.describe() == "ablated L2h1, attention L5, FFN L7"
    finally:
        model.close()


def test_the_cli_takes_every_kind(smollm2_path: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "t.json"
    tokens.write_text(str(TOKENS[:12]))
    out = tmp_path / "a.npy"
    run = [sys.executable, "-m", "engine.cli", "logits", str(smollm2_path), "--tokens-file", str(tokens), "--out", str(out)]
    done = subprocess.run([*run, "--ablate-head", "3:4", "--ablate-mean", "--ablate-attn", "6", "--ablate-ffn", "9"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "ablated L3h4 (mean over 12 tokens), attention L6, FFN L9" in done.stderr
    model = load_model(smollm2_path, numerics="ggml")
    try:
        what = ab.head_means(model, TOKENS[:12], ab.Ablation(heads=((3, 4),), attn_layers=(6,), ffn_layers=(9,)))
        ab.ablate(model, what)
        want = model.net.forward(TOKENS[:12], model.new_cache(32), all_logits=True)
    finally:
        model.close()
    assert np.array_equal(np.load(out), want)
    for extra, message in ((["--ablate-mean"], "no --ablate-head to mean-ablate"),
                           (["--ablate-expert", "0:1"], "the model has no experts")):
        bad = subprocess.run([*run, *extra], capture_output=True, text=True)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
