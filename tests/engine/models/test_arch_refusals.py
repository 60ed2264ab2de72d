"""What GGUF Lens cannot run is refused by name: the architecture, a RoPE scaling type, a missing tensor, a type."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.errors import ModelFormatError
from engine.gguf import write_gguf
from engine.model import load_model
from engine.quant.types import GGMLType
from tests.gguf_factory import default_tensors, make_gguf
from tools.make_arch_models import build


def _write(tmp_path: Path, name: str, drop: tuple[str, ...] = (), **md_changes: object) -> Path:
    md, ts = build(name)
    md.update(md_changes)
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, md, [t for t in ts if t[0] not in drop])
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(ModelFormatError) as err:
        load_model(path, numerics="float32").close()
    return str(err.value)


def test_unknown_architecture_names_itself_and_lists_the_supported(tmp_path: Path) -> None:
    msg = _refusal(_write(tmp_path, "llama3", **{"general.architecture": "mamba2"}))
    assert "mamba2" in msg
    for arch in ("gemma2", "gemma3", "llama", "phi3", "qwen2", "qwen3"):
        assert re.search(rf"\b{arch}\b", msg), msg


def test_unknown_rope_scaling_type_is_named(tmp_path: Path) -> None:
    msg = _refusal(_write(tmp_path, "llama3", **{"llama.rope.scaling.type": "dynamic"}))
    assert "llama.rope.scaling.type" in msg and "dynamic" in msg and "yarn" in msg


@pytest.mark.parametrize(("name", "drop", "named"), [
    ("qwen3", ("blk.1.attn_k_norm.weight",), "blk.1.attn_k_norm.weight"),
    ("qwen2", ("blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"), "blk.0.attn_q.bias"),
    ("qwen2", ("blk.1.attn_v.bias",), "blk.1.attn_v.bias"),
    ("gemma2", ("blk.0.post_ffw_norm.weight",), "blk.0.post_ffw_norm.weight"),
    ("phi3", ("blk.1.ffn_up.weight",), "blk.1.ffn_up.weight"),
    ("phi3", ("blk.0.attn_qkv.weight",), "blk.0.attn_qkv.weight"),
    ("llama3", ("output_norm.weight",), "output_norm.weight"),
])
def test_a_tensor_the_architecture_needs_is_named(tmp_path: Path, name: str, drop: tuple[str, ...], named: str) -> None:
    msg = _refusal(_write(tmp_path, name, drop))
    assert named in msg and "missing" in msg


def test_value_length_other_than_key_length_is_refused(tmp_path: Path) -> None:
    msg = _refusal(_write(tmp_path, "qwen3", **{"qwen3.attention.value_length": 64}))
    assert "qwen3.attention.value_length" in msg


def test_unknown_tensor_type_names_itself_and_lists_the_supported(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    tensors = default_tensors()
    tensors[0].qtype = 99
    path.write_bytes(make_gguf(tensors=tensors))
    msg = _refusal(path)
    assert "99" in msg and GGMLType.Q4_K.name in msg and GGMLType.Q8_0.name in msg


@pytest.mark.parametrize(("name", "words"), [("qwen2", "qwen2"), ("llama_yarn", "magnitude"), ("phi3", "phi3")])
def test_gpu_path_refuses_what_its_kernels_do_not_compute(tmp_path: Path, name: str, words: str) -> None:
    from engine.errors import SettingError  # noqa: PLC0415
    from engine.gpu.plan import arch_plan  # noqa: PLC0415

    model = load_model(_write(tmp_path, name), numerics="float32")
    try:
        with pytest.raises(SettingError, match=words):
            arch_plan(model.net)
    finally:
        model.close()


def test_gpu_plan_of_llama3_rotates_by_the_factored_frequencies(tmp_path: Path) -> None:
    from engine.gpu.plan import arch_plan  # noqa: PLC0415
    from engine.models.rope import rope_freqs  # noqa: PLC0415
    from tools.make_arch_models import llama3_factors  # noqa: PLC0415

    model = load_model(_write(tmp_path, "llama3"), numerics="float32")
    try:
        plan = arch_plan(model.net)
        import numpy as np  # noqa: PLC0415

        np.testing.assert_allclose(plan.layers[0].freqs, rope_freqs(64, 500000.0) / llama3_factors(64, 500000.0), rtol=1e-6)
    finally:
        model.close()


@pytest.mark.parametrize("name", ["blk.0.attn_output.bias", "blk.1.ffn_down.bias", "output.bias", "rope_factors_long.weight"])
def test_an_optional_bias_this_graph_does_not_add_is_refused(tmp_path: Path, name: str) -> None:
    """llama.cpp adds these when a file has them; leaving them out would change every logit, so they are refused."""
    import numpy as np  # noqa: PLC0415

    md, ts = build("llama3")
    n = {"output.bias": 1024, "rope_factors_long.weight": 32}.get(name, 256)
    ts.append((name, GGMLType.F32, (n,), np.zeros(n, np.float32)))
    path = tmp_path / "biased.gguf"
    write_gguf(path, md, ts)
    msg = _refusal(path)
    assert name in msg and "not applied" in msg


def test_rope_freqs_of_the_wrong_length_is_named(tmp_path: Path) -> None:
    """llama.cpp creates rope_freqs.weight as {n_rot/2}: another shape is refused with the tensor's name."""
    import numpy as np  # noqa: PLC0415

    md, ts = build("llama3")
    ts = [t if t[0] != "rope_freqs.weight" else (t[0], t[1], (16,), np.ones(16, np.float32)) for t in ts]
    path = tmp_path / "bad_freqs.gguf"
    write_gguf(path, md, ts)
    msg = _refusal(path)
    assert "rope_freqs.weight" in msg and "shape" in msg
