"""A broken hybrid file (qwen35) is refused before any compute, with a message that names the key or tensor, and
the app's model (another file loaded before) is not touched: load_model raises, nothing else changes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.gguf import write_gguf
from engine.model import load_model
from tools.make_arch_models import build


def _write(tmp_path: Path, name: str = "qwen35", drop: tuple[str, ...] = (), change: dict | None = None,
           **md_changes: object) -> Path:
    md, ts = build(name)
    md.update(md_changes)
    ts = [t for t in ts if t[0] not in drop]
    for key, fn in (change or {}).items():
        ts = [(n, q, *fn(shape, arr)) if n == key else (n, q, shape, arr) for n, q, shape, arr in ts]
    path = tmp_path / f"{name}.gguf"
    write_gguf(path, md, ts)
    return path


def _refusal(path: Path) -> str:
    with pytest.raises(ModelFormatError) as err:
        load_model(path, numerics="float32").close()
    return str(err.value)


@pytest.mark.parametrize("tensor", ["blk.0.ssm_conv1d.weight", "blk.1.ssm_a", "blk.2.ssm_dt.bias", "blk.0.attn_gate.weight",
                                    "blk.1.ssm_beta.weight", "blk.2.ssm_alpha.weight", "blk.0.ssm_norm.weight",
                                    "blk.1.ssm_out.weight", "blk.0.attn_qkv.weight", "blk.3.attn_q_norm.weight"])
def test_a_missing_recurrent_or_attention_tensor_is_named(tmp_path: Path, tensor: str) -> None:
    msg = _refusal(_write(tmp_path, drop=(tensor,)))
    assert tensor in msg and "missing" in msg


def test_a_wrong_shaped_tensor_is_named(tmp_path: Path) -> None:
    narrow = lambda shape, arr: ((shape[0], shape[1] - 64), arr[:-64])  # noqa: E731 - 64 channels fewer
    msg = _refusal(_write(tmp_path, change={"blk.1.attn_qkv.weight": narrow}))
    assert "blk.1.attn_qkv.weight" in msg and "shape" in msg


@pytest.mark.parametrize(("key", "value", "named"), [
    ("qwen35.ssm.conv_kernel", np.uint32(3), "blk.0.ssm_conv1d.weight"),  # the tensor has 4 taps
    ("qwen35.ssm.group_count", np.uint32(3), "qwen35.ssm.group_count"),  # does not divide 4 value heads
    ("qwen35.ssm.inner_size", np.uint32(300), "qwen35.ssm.inner_size"),
    ("qwen35.ssm.state_size", np.uint32(0), "qwen35.ssm.state_size"),
    ("qwen35.ssm.conv_kernel", np.uint32(1), "qwen35.ssm.conv_kernel"),
    ("qwen35.full_attention_interval", np.uint32(9), "qwen35.full_attention_interval"),
    ("qwen35.nextn_predict_layers", np.uint32(4), "qwen35.nextn_predict_layers"),
    ("qwen35.attention.recurrent_layers", np.array([1, 1, 1, 0, 1], np.int32), "qwen35.attention.recurrent_layers"),
    ("qwen35.rope.dimension_sections", np.array([20, 10, 10, 0], np.int32), "qwen35.rope.dimension_sections"),
])
def test_sizes_that_do_not_fit_the_tensors_are_named(tmp_path: Path, key: str, value: object, named: str) -> None:
    msg = _refusal(_write(tmp_path, **{key: value}))
    assert named in msg, msg


def test_a_missing_ssm_key_is_named(tmp_path: Path) -> None:
    md, ts = build("qwen35")
    del md["qwen35.ssm.time_step_rank"]
    write_gguf(tmp_path / "a.gguf", md, ts)
    assert "qwen35.ssm.time_step_rank" in _refusal(tmp_path / "a.gguf")


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_ssm_a_is_refused(tmp_path: Path, bad: float) -> None:
    poison = lambda shape, arr: (shape, np.where(np.arange(arr.size) == 1, np.float32(bad), arr).astype(np.float32))  # noqa: E731
    msg = _refusal(_write(tmp_path, change={"blk.2.ssm_a": poison}))
    assert "blk.2.ssm_a" in msg and "finite" in msg


def test_the_layer_pattern_from_the_file_is_used(tmp_path: Path) -> None:
    """attention.recurrent_layers overrides the interval rule (here: layer 3 recurrent needs its tensors)."""
    msg = _refusal(_write(tmp_path, **{"qwen35.attention.recurrent_layers": np.array([1, 1, 1, 1], np.int32)}))
    assert "blk.3." in msg and "missing" in msg
