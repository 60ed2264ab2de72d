"""T5 (encoder-decoder) against llama.cpp's decoder logits on the same files (tools/make_t5_model.py).

Each test model (flan-T5's GELU-gated FFN, and T5's ReLU one) is rebuilt from its seed with our GGUF writer and
quantized with our llama-quantize (byte-identical: the fixture's sha256 of llama.cpp's file says so); the encoder
runs on the encoder tokens, then the decoder on its tokens (a batch, then one token per step, as llama.cpp ran
them), and every decoder position's log-probabilities are compared with llama.cpp's. ggml numerics give llama.cpp's
logits (KLD at the fixture's float32 rounding, ~1e-14); float32 numerics are within the rounding floor the other
architectures are held to. Leaving out the position bias, making the decoder's buckets bidirectional, or leaving
out cross-attention each moves the answer by orders of magnitude more: the test model can tell them apart.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine.models.seq2seq as graph_module
from engine.errors import SettingError
from engine.generate import GenerationConfig, generate
from engine.model import load_model
from engine.sampler import SamplerSettings
from tests.engine.golden import kld_topk, log_softmax
from tests.engine.models.arch_cases import F32_BOUNDS, MOE_GGML_KLD_MAX
from tools.make_arch_models import FIXTURES
from tools.make_t5_model import CASES, T5_SPECS, case_ids, t5_file

QUANTS = ("F16", "Q8_0")
ABLATION_KLD_MIN = 0.1  # each ablation's mean KLD is above this: 20x float32's bound, 1e8x ggml's


def model_file(folder: Path, name: str, quant: str) -> Path:
    return t5_file(folder, name, quant)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("t5")


def reference(name: str, quant: str, case: str) -> tuple[np.ndarray, np.ndarray]:
    z = np.load(FIXTURES / f"{name}.npz")
    return z[f"{quant}_{case}_top_ids"], z[f"{quant}_{case}_top_logp"]


def decoder_logits(model: Any, case: str) -> np.ndarray:  # noqa: ANN401
    """Encode the case's input, then its decoder tokens: a prompt of `prefill`, then one token per step."""
    enc, dec = case_ids(case)
    prefill = CASES[case][2]
    cache = model.new_cache()
    model.net.encode(enc, cache)
    rows = [model.forward(dec[:prefill], cache, all_logits=True)]
    cache.commit(dec[:prefill])
    for tok in dec[prefill:]:
        rows.append(model.forward([tok], cache))
        cache.commit([tok])
    return np.concatenate(rows)


def stats(name: str, quant: str, case: str, logits: np.ndarray) -> dict[str, float]:
    top_ids, top_logp = reference(name, quant, case)
    lp = log_softmax(logits)
    kl = kld_topk(top_ids, top_logp, lp)
    same = lp.argmax(-1) == top_ids[:, 0]
    return {"kld_mean": float(kl.mean()), "kld_max": float(kl.max()), "same_top": float(same.mean()),
            "n_same": int(same.sum()), "n": int(same.size)}


CASE_IDS = [(n, q) for n in T5_SPECS for q in QUANTS]


@pytest.mark.parametrize(("name", "quant"), CASE_IDS, ids=[f"{n}-{q}" for n, q in CASE_IDS])
def test_our_quantized_file_is_llama_cpps(folder: Path, name: str, quant: str) -> None:
    meta = json.loads((FIXTURES / f"{name}.json").read_text())
    got = hashlib.sha256(model_file(folder, name, quant).read_bytes()).hexdigest()
    assert got == meta["quants"][quant]["sha256"]


@pytest.mark.parametrize("numerics", ["ggml", "float32"])
@pytest.mark.parametrize(("name", "quant"), CASE_IDS, ids=[f"{n}-{q}" for n, q in CASE_IDS])
def test_decoder_logits_match_llama_cpp(folder: Path, name: str, quant: str, numerics: str) -> None:
    model = load_model(model_file(folder, name, quant), numerics=numerics)
    try:
        same = n = 0
        for case in CASES:
            got = stats(name, quant, case, decoder_logits(model, case))
            print(f"{name} {quant} {numerics} case {case}: {got}")
            same, n = same + got["n_same"], n + got["n"]
            if numerics == "ggml":  # llama.cpp's bits: what is left is the fixture's float32 log-probabilities
                assert got["kld_max"] <= MOE_GGML_KLD_MAX and got["same_top"] == 1.0
            else:
                assert got["kld_mean"] <= F32_BOUNDS[0]
        # the share of same top tokens over the file's positions (68), as the other architectures' is over theirs:
        # per case it would allow no flip at all in case b's 20, where Q8_0's 8-bit activations turn a 0.02-nat tie
        assert same / n >= F32_BOUNDS[1]
    finally:
        model.close()


def _no_bias(net: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN401
    for layer in [*net.enc_layers, *net.dec_layers]:
        monkeypatch.setattr(layer, "rel_bias", np.zeros_like(layer.rel_bias))


def _bidirectional_decoder(net: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN401
    real = graph_module.position_bias
    monkeypatch.setattr(graph_module, "position_bias", lambda table, q, k, bidirectional: real(table, q, k, True))


def _no_cross(net: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN401
    monkeypatch.setattr(net, "cross_attention", lambda i, layer, h, enc, probe, recorder=None: np.zeros_like(h))


ABLATIONS: dict[str, Callable[[Any, pytest.MonkeyPatch], None]] = {
    "no_position_bias": _no_bias, "bidirectional_decoder_buckets": _bidirectional_decoder, "no_cross_attention": _no_cross}


@pytest.mark.parametrize("ablation", list(ABLATIONS))
def test_each_part_of_t5_moves_the_answer(folder: Path, ablation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ablation's KLD from llama.cpp is far above both numerics' floors: the fixture pins each part down."""
    model = load_model(model_file(folder, "t5", "Q8_0"))
    try:
        ABLATIONS[ablation](model.net, monkeypatch)
        for case in CASES:
            got = stats("t5", "Q8_0", case, decoder_logits(model, case))
            print(f"{ablation} case {case}: {got}")
            assert got["kld_mean"] > ABLATION_KLD_MIN
    finally:
        model.close()


def test_buckets_are_llama_cpps() -> None:
    """relative_bucket equals llama_relative_position_bucket (recorded from libllama) at every relative position in
    [-300, 300], for 8, 32 and 128 buckets, bidirectional and causal (the causal one only where keys are visible)."""
    from engine.models.encoder_decoder import relative_bucket  # noqa: PLC0415

    z = np.load(FIXTURES / "t5.npz")
    rel = z["bucket_rel"]
    for n in (8, 32, 128):
        assert np.array_equal(relative_bucket(rel, n, True), z[f"bucket_bi_{n}"])
        past = rel <= 0
        assert np.array_equal(relative_bucket(rel, n, False)[past], z[f"bucket_causal_{n}"][past])


def test_generate_encodes_the_prompt_and_decodes_greedily(folder: Path) -> None:
    """engine.generate with a T5 model: the prompt is the encoder's input, decoding starts from the start token,
    and each greedy token is the argmax of the decoder's logits given the tokens before it."""
    model = load_model(model_file(folder, "t5", "Q8_0"))
    try:
        enc, _ = case_ids("a")
        steps = list(generate(model, enc, GenerationConfig(max_tokens=6, sampler=SamplerSettings(temperature=0.0))))
        tokens = [s.token_id for s in steps if s.token_id >= 0]
        assert len(tokens) >= 1
        cache = model.new_cache()
        model.net.encode(enc, cache)
        dec = [model.net.decoder_start_token, *tokens[:-1]]
        logits = model.forward(dec, cache, all_logits=True)
        assert logits.argmax(-1).tolist() == tokens
    finally:
        model.close()


def test_decoder_needs_an_encoding(folder: Path) -> None:
    model = load_model(model_file(folder, "t5", "Q8_0"), warm=False)
    try:
        with pytest.raises(SettingError, match="encoder input"):
            model.forward([1, 5], model.new_cache())
        with pytest.raises(SettingError, match="empty"):
            model.net.encode([], model.new_cache())
    finally:
        model.close()


def test_a_new_encoding_restarts_the_decoder(folder: Path) -> None:
    """The cache's decoder positions were computed against the old encoding: a different input empties them."""
    model = load_model(model_file(folder, "t5", "Q8_0"), warm=False)
    try:
        enc_a, dec = case_ids("a")
        enc_b, _ = case_ids("b")
        cache = model.new_cache()
        model.net.encode(enc_a, cache)
        model.forward(dec[:4], cache)
        cache.commit(dec[:4])
        model.net.encode(enc_a, cache)
        assert cache.length == 4 and cache.encoder_ids == tuple(enc_a)
        model.net.encode(enc_b, cache)
        assert cache.length == 0 and cache.encoder_ids == tuple(enc_b)
    finally:
        model.close()


def test_generate_on_a_reused_cache_encodes_each_new_prompt(folder: Path) -> None:
    """A cache kept across calls (a terminal chat's): a different prompt is encoded afresh, the same prompt reuses
    the encoding, and either way the output is what a fresh cache gives."""
    model = load_model(model_file(folder, "t5", "Q8_0"))
    try:
        greedy = GenerationConfig(max_tokens=4, sampler=SamplerSettings(temperature=0.0))

        def run(prompt: list[int], cache: Any = None) -> list[int]:  # noqa: ANN401
            return [s.token_id for s in generate(model, prompt, greedy, cache=cache) if s.token_id >= 0]

        first, second = case_ids("a")[0], case_ids("b")[0]
        cache = model.new_cache()
        assert run(first, cache) == run(first)
        assert run(second, cache) == run(second) and cache.encoder_ids == tuple(second)
        assert run(second, cache) == run(second)
    finally:
        model.close()
