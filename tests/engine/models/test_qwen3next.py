"""qwen3next (Qwen3-Next) and qwen3vl / qwen3vlmoe (Qwen3-VL's language model) beyond the logits tests of
test_hybrid_logits.py: what tells them from qwen35 (the two DeltaNet layouts, value heads grouped by key head, the
skipped MTP block, IMROPE's unrotated pairs for text), and broken files refused before any compute with a message
that names the tensor or key (engine.errors.ModelFormatError)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.generate import prefill
from engine.gguf import write_gguf
from engine.model import load_model
from engine.models.deltanet import DeltaNetMixer
from engine.models.rope import rope_freqs
from engine.models.transformer import Transformer
from tests.engine.models.arch_cases import model_file, our_logits, reference, stats
from tools.make_arch_models import build, token_ids, write_arch

U32 = np.uint32
Change = Callable[[tuple[int, ...], np.ndarray], tuple[tuple[int, ...], np.ndarray]]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qwen3next")


def _logits(path: Path, ids: list[int]) -> np.ndarray:
    model = load_model(path, numerics="ggml")
    try:
        cache = model.new_cache(256)
        rows = [prefill(model, ids[:-2], cache, all_logits=True, chunk_size=16)]
        for tok in ids[-2:]:
            rows.append(model.net.forward([tok], cache))
            cache.commit([tok])
        return np.concatenate(rows)
    finally:
        model.close()


def test_the_two_layouts_are_one_model(folder: Path) -> None:
    """attn_qkv + attn_gate + ssm_ba (the layer pattern from attention.recurrent_layers, an MTP block) and the legacy
    ssm_in + ssm_ba (the interval rule) hold the same weights: the same logits to the bit, prompt and steps."""
    ids = token_ids()[:40]
    now = _logits(write_arch(folder / "now.gguf", "qwen3next"), ids)
    legacy = _logits(write_arch(folder / "legacy.gguf", "qwen3next_legacy"), ids)
    assert np.array_equal(now, legacy)


def _tiled(net: Any) -> None:
    """qwen35's head mapping instead (value head h reads key head h % n_k)."""
    for layer in net.layers:
        mixer = getattr(layer, "mixer", None)
        if mixer is not None:
            r = mixer.dims.v_heads // mixer.dims.k_heads
            mixer.key_heads = lambda x, r=r: np.tile(x, (1, r, 1))


def _all_pairs_rotated(net: Any) -> None:
    """Plain NEOX on every pair instead of IMROPE's text positions."""
    net.freqs_by_base = {base: rope_freqs(net.args.rope_dim, base) for base in net.freqs_by_base}


@pytest.mark.parametrize(("name", "change", "at_least"), [
    ("qwen3next", _tiled, 0.5), ("qwen3next_legacy", _tiled, 0.5), ("qwen3vl", _all_pairs_rotated, 1e-3),
])
def test_what_sets_them_apart_from_qwen35_moves_the_logits(folder: Path, name: str, change: Any,
                                                           at_least: float) -> None:
    """The features the logits tests hold to llama.cpp are not invisible there: each one done qwen35's (or plain
    RoPE's) way is far from llama.cpp (float32 numerics, F16 file: without the change the mean KLD is ~1e-6)."""
    ref = reference(name, "F16")
    got = stats(ref, our_logits(model_file(folder, name, "F16"), ref.ids, "float32", change))
    assert got["kld_mean"] >= at_least, got


def test_the_mtp_block_is_loaded_not_run(folder: Path) -> None:
    """nextn_predict_layers = 1: block 4 (attention, experts, nextn.*) is left out and said to be unused."""
    model = load_model(write_arch(folder / "mtp.gguf", "qwen3next"), numerics="float32", warm=False)
    try:
        net = model.net
        assert (net.args.n_layers, net.args.n_nextn, len(net.layers)) == (4, 1, 4)
        assert net.args.recurrent == (True, True, True, False)
        assert any("blk.4.nextn.eh_proj.weight" in w or "blk.4." in w for w in model.warnings)
    finally:
        model.close()


# ---- broken files


def _write(tmp_path: Path, name: str = "qwen3next", drop: tuple[str, ...] = (), change: dict[str, Change] | None = None,
           add: tuple[tuple[str, tuple[int, ...]], ...] = (), md_changes: dict[str, Any] | None = None) -> Path:
    """Test model `name` with tensors dropped, changed (new shape and data) or added (zeros), and metadata changed
    (None: the key removed)."""
    md, ts = build(name)
    for key, value in (md_changes or {}).items():
        if value is None:
            md.pop(key, None)
        else:
            md[key] = value
    ts = [t for t in ts if t[0] not in drop]
    for key, fn in (change or {}).items():
        assert any(n == key for n, *_ in ts), key
        ts = [(n, q, *fn(shape, arr)) if n == key else (n, q, shape, arr) for n, q, shape, arr in ts]
    for key, shape in add:
        ts.append((key, ts[-1][1], shape, np.zeros(shape[::-1], np.float32)))
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, md, ts)
    return path


@pytest.fixture
def no_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refusal comes before any layer runs."""
    def boom(*_: Any, **__: Any) -> None:
        raise AssertionError("a layer ran before the file was refused")

    monkeypatch.setattr(Transformer, "run_layers", boom)
    monkeypatch.setattr(DeltaNetMixer, "__call__", boom)


def _refusal(path: Path) -> str:
    with pytest.raises(ModelFormatError) as err:
        load_model(path, numerics="ggml").close()
    return str(err.value)


def _narrow(by: int) -> Change:
    """The tensor's rows (its second ggml dimension) `by` fewer."""
    return lambda shape, arr: ((shape[0], shape[1] - by, *shape[2:]), arr[:-by])


@pytest.mark.parametrize(("name", "tensor"), [
    ("qwen3next", "blk.0.attn_gate.weight"), ("qwen3next", "blk.1.ssm_ba.weight"),
    ("qwen3next", "blk.2.ssm_conv1d.weight"),
    ("qwen3next", "blk.0.ssm_a"), ("qwen3next", "blk.1.ssm_dt.bias"), ("qwen3next", "blk.2.ssm_norm.weight"),
    ("qwen3next", "blk.0.ssm_out.weight"), ("qwen3next", "blk.3.attn_q_norm.weight"),
    ("qwen3next", "blk.1.ffn_gate_inp.weight"), ("qwen3next", "blk.2.ffn_up_shexp.weight"),
    ("qwen3next_legacy", "blk.2.ssm_ba.weight"), ("qwen3next_legacy", "blk.1.ssm_out.weight"),
    ("qwen3vl", "blk.1.attn_k_norm.weight"), ("qwen3vlmoe", "blk.0.ffn_gate_exps.weight"),
])
def test_a_missing_tensor_is_named(tmp_path: Path, no_compute: None, name: str, tensor: str) -> None:
    msg = _refusal(_write(tmp_path, name, drop=(tensor,)))
    assert tensor in msg and "missing" in msg, msg


@pytest.mark.parametrize("name", ["qwen3next", "qwen3next_legacy"])
def test_a_recurrent_layer_without_its_input_products_names_both_layouts(tmp_path: Path, no_compute: None,
                                                                         name: str) -> None:
    drop = ("blk.1.attn_qkv.weight",) if name == "qwen3next" else ("blk.1.ssm_in.weight",)
    msg = _refusal(_write(tmp_path, name, drop=drop))
    assert "blk.1.attn_qkv.weight" in msg and "blk.1.ssm_in.weight" in msg and "missing" in msg, msg


@pytest.mark.parametrize(("name", "tensor", "by"), [
    ("qwen3next_legacy", "blk.1.ssm_in.weight", 64),  # 2 key_dim + 2 value_dim wide
    ("qwen3next_legacy", "blk.0.ssm_ba.weight", 4),  # 2 value heads wide
    ("qwen3next", "blk.2.ssm_ba.weight", 2),
    ("qwen3next", "blk.0.attn_qkv.weight", 64),
    ("qwen3next", "blk.1.attn_gate.weight", 64),
    ("qwen3next", "blk.3.attn_q.weight", 64),  # query and gate: 2 x heads x key_length
    ("qwen3vl", "blk.0.attn_q.weight", 64),
])
def test_a_wrong_shaped_tensor_is_named(tmp_path: Path, no_compute: None, name: str, tensor: str, by: int) -> None:
    msg = _refusal(_write(tmp_path, name, change={tensor: _narrow(by)}))
    assert tensor in msg and "shape" in msg, msg


def test_a_wrong_conv_kernel_is_named(tmp_path: Path, no_compute: None) -> None:
    msg = _refusal(_write(tmp_path, "qwen3next_legacy", md_changes={"qwen3next.ssm.conv_kernel": U32(3)}))
    assert "blk.0.ssm_conv1d.weight" in msg and "shape" in msg, msg


@pytest.mark.parametrize(("name", "key", "value", "named"), [
    ("qwen3next", "qwen3next.expert_count", None, "qwen3next.expert_count"),  # qwen3next must have experts
    ("qwen3next", "qwen3next.expert_count", U32(0), "qwen3next.expert_count"),
    ("qwen3next", "qwen3next.ssm.group_count", U32(3), "qwen3next.ssm.group_count"),  # does not divide 4 value heads
    ("qwen3next", "qwen3next.ssm.inner_size", U32(300), "qwen3next.ssm.inner_size"),
    ("qwen3next", "qwen3next.ssm.time_step_rank", None, "qwen3next.ssm.time_step_rank"),
    ("qwen3next", "qwen3next.ssm.state_size", U32(32), "qwen3next.ssm.inner_size"),  # 32 x 4 value heads is not 256
    ("qwen3next", "qwen3next.nextn_predict_layers", U32(5), "qwen3next.nextn_predict_layers"),
    ("qwen3next", "qwen3next.attention.recurrent_layers", np.array([1, 1, 1, 0], np.bool_),
     "qwen3next.attention.recurrent_layers"),  # 4 flags for 5 blocks
    ("qwen3next_legacy", "qwen3next.rope.dimension_count", U32(128), "qwen3next.rope.dimension_count"),
    ("qwen3vl", "qwen3vl.rope.dimension_count", U32(64), "qwen3vl.rope.dimension_count"),  # must turn whole heads
    ("qwen3vl", "qwen3vl.rope.dimension_sections", None, "qwen3vl.rope.dimension_sections"),
    ("qwen3vlmoe", "qwen3vlmoe.rope.dimension_sections", np.array([40, 20, 20, 0], np.int32),
     "qwen3vlmoe.rope.dimension_sections"),
    ("qwen3vlmoe", "qwen3vlmoe.expert_used_count", None, "qwen3vlmoe.expert_used_count"),
])
def test_metadata_that_does_not_fit_is_named(tmp_path: Path, no_compute: None, name: str, key: str, value: Any,
                                              named: str) -> None:
    msg = _refusal(_write(tmp_path, name, md_changes={key: value}))
    assert named in msg, msg


@pytest.mark.parametrize(("name", "sizes", "named"), [
    ("qwen3next", {"state_size": 32, "inner_size": 128}, "blk.0.attn_qkv.weight"),  # the tensors are 64 per head
    ("qwen3next_legacy", {"time_step_rank": 2, "inner_size": 128}, "blk.0.ssm_in.weight"),  # 2 value heads, not 4
    ("qwen3next", {"time_step_rank": 8, "inner_size": 512}, "blk.0.attn_qkv.weight"),
])
def test_sizes_that_agree_but_not_with_the_tensors_name_the_tensor(tmp_path: Path, no_compute: None, name: str,
                                                                   sizes: dict[str, int], named: str) -> None:
    msg = _refusal(_write(tmp_path, name, md_changes={f"qwen3next.ssm.{k}": U32(v) for k, v in sizes.items()}))
    assert named in msg and "shape" in msg, msg


def test_a_tensor_the_graph_would_skip_is_refused_in_a_block_but_not_in_the_mtp_block(tmp_path: Path) -> None:
    """An expert selection bias llama.cpp's qwen3next graph never reads: refused in block 0 (as every graph refuses
    a tensor it would leave out), ignored in the MTP block, whose tensors are all left out."""
    msg = _refusal(_write(tmp_path, add=(("blk.0.exp_probs_b.bias", (8,)),)))
    assert "blk.0.exp_probs_b.bias" in msg
    load_model(_write(tmp_path, add=(("blk.4.exp_probs_b.bias", (8,)),)), numerics="float32", warm=False).close()
