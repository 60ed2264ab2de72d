"""Gemma 4 (gemma4: the E2B-like test model, dense; gemma4_moe: the 26B-A4B-like one, experts) against llama.cpp's
logits on the same files (tools/make_gemma4_models.py, tools/make_arch_models.py), and what a malformed file is told.

Each test model is rebuilt from its seed and quantized by our llama-quantize (byte-identical to llama.cpp's: the
sha256 says so), then run as llama.cpp ran it: a 128-token prompt in one batch, then one token per step, and, for
Q8_0, all 200 tokens as one prompt in batches of 48. The files carry everything gemma4.cpp reads: sliding and global
blocks of different head sizes and KV head counts, proportional RoPE on the global blocks, V norms, KV sharing
(gemma4's last four blocks read the cache of blocks 2 and 3), FFNs twice as wide on the sharing blocks, per-layer
inputs, layer output scales, no attn_v on global blocks (gemma4_moe), experts beside the dense FFN with the router's
input scale and each expert's down scale, the final soft-cap. ggml numerics must give llama.cpp's log-probabilities
at every position (a KLD of at most 1e-9, what float32 log-probabilities leave of identical logits, and the same top
token everywhere).

The float32 reference is held to llama.cpp's F16 file within the usual bounds. On the 8- and 4-bit files it is not
llama.cpp's arithmetic (no 8-bit activations): measured mean KLDs 0.002-0.005 (dense) and 0.012-0.016 (experts), held
to the Mixture-of-Experts bound.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.cache import KVCache
from engine.errors import ModelFormatError
from engine.generate import prefill
from engine.gguf import write_gguf
from engine.memory import kv_cache_bytes
from engine.model import load_model
from engine.observe.recorder import Recorder
from engine.quant.types import GGMLType
from tests.engine.models.arch_cases import (
    F32_BOUNDS,
    MOE_F32_BOUNDS,
    MOE_GGML_KLD_MAX,
    model_file,
    our_logits,
    reference,
    sha256,
    split_prompt_stats,
    stats,
)
from tools.make_arch_models import build
from tools.make_gemma4_models import GEMMA4, QUANTS

CASES = [(name, q) for name in GEMMA4 for q in (*QUANTS, *(("MXFP4_MOE",) if GEMMA4[name].n_expert else ()))]
IDS = [f"{n}-{q}" for n, q in CASES]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gemma4")


@pytest.mark.parametrize(("name", "quant"), CASES, ids=IDS)
def test_our_quantized_gemma4_is_llama_cpps(folder: Path, name: str, quant: str) -> None:
    """llama-quantize's choices on Gemma 4's tensors: per_layer_token_embd as the tied head, per_layer_model_proj,
    the norms, scales and rope_freqs kept, the fused gate|up experts, the 128-wide rows' fallbacks."""
    assert sha256(model_file(folder, name, quant)) == reference(name, quant).sha256


@pytest.mark.parametrize("numerics", ["float32", "ggml"])
@pytest.mark.parametrize(("name", "quant"), CASES, ids=IDS)
def test_gemma4_logits_match_llama_cpp(folder: Path, name: str, quant: str, numerics: str) -> None:
    ref = reference(name, quant)
    got = stats(ref, our_logits(model_file(folder, name, quant), ref.ids, numerics))
    print(f"{name} {quant} {numerics}: {got}")
    if numerics == "ggml":
        assert got["kld_max"] <= MOE_GGML_KLD_MAX and got["same_top"] == 1.0
    else:
        kld_bound, top_bound = F32_BOUNDS if quant == "F16" and not GEMMA4[name].n_expert else MOE_F32_BOUNDS
        assert got["kld_mean"] <= kld_bound and got["same_top"] >= top_bound


@pytest.mark.parametrize("name", list(GEMMA4))
def test_a_gemma4_prompt_split_across_batches_matches_llama_cpp(folder: Path, name: str) -> None:
    """The KV-sharing blocks read rows their source wrote in earlier batches; the per-layer inputs are per batch."""
    got = split_prompt_stats(folder, name)
    assert got["kld_max"] <= MOE_GGML_KLD_MAX and got["same_top"] == 1.0, got


@pytest.mark.parametrize("name", list(GEMMA4))
def test_float32_decode_steps_agree_with_one_prompt(folder: Path, name: str) -> None:
    """float32 numerics: the compiled one-token attention (blocks with their own K/V) and the NumPy path (KV-sharing
    blocks) after a prompt give the logits of the whole sequence as one prompt, up to the summation order."""
    ids = reference(name, "F16").ids
    model = load_model(model_file(folder, name, "F16"), numerics="float32")
    try:
        whole = prefill(model, ids, model.new_cache(1024), all_logits=True, chunk_size=256)
        cache = model.new_cache(1024)
        rows = [prefill(model, ids[:128], cache, all_logits=True, chunk_size=256)]
        for tok in ids[128:]:
            rows.append(model.net.forward([tok], cache))
            cache.commit([tok])
    finally:
        model.close()
    assert np.abs(np.concatenate(rows) - whole).max() < 2e-3


def test_kv_sharing_blocks_hold_no_rows_and_read_their_sources(folder: Path) -> None:
    """Blocks 4-6 (sliding) read block 2's rows, block 7 (global) block 3's; each kind in its own shape; the recorded
    attention of a sharing block is over its source's keys."""
    model = load_model(model_file(folder, "gemma4", "F16"), numerics="float32")
    try:
        cache = model.new_cache(256)
        assert cache.shared == {4: 2, 5: 2, 6: 2, 7: 3} and cache.kv_layers == frozenset(range(4))
        rec = Recorder()
        ids = reference("gemma4", "F16").ids[:40]
        model.net.forward(ids, cache, rec, all_logits=True)
        cache.commit(ids)
        rec.commit()
        assert cache.keys(5).shape == (1, 40, 64) and cache.keys(7).shape == (1, 40, 128)
        assert np.array_equal(cache.keys(6), cache.keys(2))
        assert np.array_equal(cache.values(7), cache.values(3))
        assert cache.bytes_for(40) == 2 * 40 * 4 * (3 * 64 + 128)  # float32 rows of blocks 0-3 only
        for cache_type in ("F32", "F16", "Q8_0"):  # the memory preflight counts what the cache allocates
            assert kv_cache_bytes(model.net.args, 40, cache_type) == model.new_cache(256, cache_type).bytes_for(40)
        weights = rec.attention(cache, 6, 0)
        assert weights.shape == (40, 40) and np.allclose(weights.sum(-1), 1.0, atol=1e-5)
        assert np.all(weights[39, : 39 - 32 + 1] == 0)  # a sliding block: 32 keys at most
    finally:
        model.close()


def test_a_kv_cache_refuses_a_layer_reading_a_layer_of_another_shape() -> None:
    with pytest.raises(ValueError, match="cannot read"):
        KVCache(3, 1, 64, 16, layer_shapes=[(1, 64), (1, 128), (1, 64)], shared={2: 1})
    cache = KVCache(3, 1, 64, 16, "Q8_0", layer_shapes=[(2, 64), (1, 128), (2, 64)], shared={2: 0})
    cache.reserve(4)
    cache.put(1, 0, np.ones((1, 4, 128), np.float32), np.ones((1, 4, 128), np.float32))
    assert cache.keys(1, 4).shape == (1, 4, 128) and cache.keys(2, 4).shape == (2, 4, 64)


# ---- what a malformed Gemma 4 file is told, before anything runs


def _write(tmp_path: Path, name: str, drop: tuple[str, ...] = (), replace: dict[str, tuple[int, ...]] | None = None,
           metadata: dict[str, Any] | None = None) -> Path:
    """Test model `name` without the tensors `drop`, with `replace`'s tensors in other shapes and `metadata`'s keys
    changed (None: removed)."""
    md, ts = build(name)
    for key, value in (metadata or {}).items():
        md.pop(key, None)
        if value is not None:
            md[key] = value
    out = []
    for t in ts:
        if t[0] in drop:
            continue
        if replace and t[0] in replace:
            shape = replace[t[0]]
            t = (t[0], GGMLType.F32, shape, np.full(shape[::-1], 0.5, np.float32))
        out.append(t)
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, md, out)
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(ModelFormatError) as err:
        load_model(path, numerics="float32", warm=False).close()
    return str(err.value)


@pytest.mark.parametrize(("name", "tensor"), [
    ("gemma4", "blk.0.attn_q_norm.weight"),
    ("gemma4", "blk.2.attn_k.weight"),  # a block that computes K/V
    ("gemma4", "blk.3.post_ffw_norm.weight"),
    ("gemma4", "rope_freqs.weight"),
    ("gemma4", "per_layer_token_embd.weight"),
    ("gemma4", "blk.5.inp_gate.weight"),
    ("gemma4_moe", "blk.1.ffn_gate_inp.scale"),
    ("gemma4_moe", "blk.4.pre_ffw_norm_2.weight"),
    ("gemma4_moe", "blk.0.ffn_down_exps.weight"),
    ("gemma4_moe", "blk.3.ffn_gate.weight"),
])
def test_a_missing_gemma4_tensor_is_named(tmp_path: Path, name: str, tensor: str) -> None:
    msg = _refusal(_write(tmp_path, name, drop=(tensor,)))
    assert tensor in msg and "missing" in msg


@pytest.mark.parametrize(("name", "tensor", "shape"), [
    ("gemma4", "blk.3.attn_q.weight", (256, 256)),  # a sliding block's size in a global block (128-wide heads)
    ("gemma4", "blk.5.ffn_up.weight", (256, 512)),  # a KV-sharing block's FFN is twice as wide
    ("gemma4", "rope_freqs.weight", (32,)),
    ("gemma4", "per_layer_model_proj.weight", (256, 256)),
    ("gemma4", "blk.6.attn_k.weight", (256, 128)),  # unused, but checked, as llama.cpp does
    ("gemma4_moe", "blk.0.ffn_gate_up_exps.weight", (256, 128, 8)),
    ("gemma4_moe", "blk.2.attn_k_norm.weight", (64,)),
    ("gemma4_moe", "blk.1.ffn_down_exps.scale", (4,)),
])
def test_a_wrong_shaped_gemma4_tensor_is_named(tmp_path: Path, name: str, tensor: str, shape: tuple[int, ...]) -> None:
    msg = _refusal(_write(tmp_path, name, replace={tensor: shape}))
    assert tensor in msg and "shape" in msg


@pytest.mark.parametrize(("name", "key", "change"), [
    ("gemma4", "gemma4.attention.sliding_window_pattern", None),
    ("gemma4", "gemma4.attention.sliding_window_pattern", [True] * 7),
    ("gemma4", "gemma4.attention.key_length_swa", None),
    ("gemma4", "gemma4.attention.value_length_swa", np.uint32(32)),
    ("gemma4", "gemma4.attention.shared_kv_layers", np.uint32(7)),
    ("gemma4", "gemma4.attention.shared_kv_layers", np.uint32(3)),  # sliding block 5 would read global block 3
    ("gemma4", "gemma4.attention.head_count_kv", np.uint32(3)),
    ("gemma4", "gemma4.feed_forward_length", np.array([512] * 7, np.int32)),
    ("gemma4", "gemma4.embedding_length_per_layer_input", None),
    ("gemma4", "gemma4.rope.dimension_count_swa", np.uint32(128)),
    ("gemma4", "gemma4.final_logit_softcapping", -1.0),
    ("gemma4", "gemma4.rope.scaling.factor", 4.0),
    ("gemma4", "gemma4.attention.sliding_window", np.uint32(0)),
    ("gemma4_moe", "gemma4.attention.head_count_kv", np.array([2, 2, 1, 2], np.int32)),
    ("gemma4_moe", "gemma4.expert_feed_forward_length", None),
    ("gemma4_moe", "gemma4.expert_count", None),  # its blocks have routers
])
def test_bad_gemma4_metadata_is_named(tmp_path: Path, name: str, key: str, change: Any) -> None:
    assert key in _refusal(_write(tmp_path, name, metadata={key: change}))


def test_a_rope_factor_that_is_not_positive_is_named(tmp_path: Path) -> None:
    md, ts = build("gemma4")
    ts = [(n, q, s, np.zeros_like(a) if n == "rope_freqs.weight" else a) for n, q, s, a in ts]
    write_gguf(tmp_path / "g.gguf", md, ts)
    assert "rope_freqs.weight" in _refusal(tmp_path / "g.gguf")
