"""T5 files that cannot run are refused by name (a ModelFormatError naming the key or tensor), and what the
metadata leaves out falls back as llama.cpp does (the decoder block count, the decoder start token)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import ModelFormatError, SettingError
from engine.gguf import write_gguf
from engine.model import load_model
from engine.models.encoder_decoder import position_bias, relative_bucket
from engine.quant.types import GGMLType
from tools.make_t5_model import build_t5

Tensors = list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]]


def write(tmp_path: Path, md: dict[str, Any], ts: Tensors, name: str = "bad.gguf") -> Path:
    path = tmp_path / name
    write_gguf(path, md, ts)
    return path


def without(ts: Tensors, name: str) -> Tensors:
    assert any(t[0] == name for t in ts)
    return [t for t in ts if t[0] != name]


def load(path: Path) -> Any:  # noqa: ANN401
    return load_model(path, warm=False)


@pytest.mark.parametrize("tensor", ["enc.blk.1.attn_q.weight", "enc.output_norm.weight", "dec.blk.0.cross_attn_k.weight",
                                    "dec.blk.1.ffn_down.weight", "dec.output_norm.weight", "enc.blk.0.attn_rel_b.weight",
                                    "dec.blk.0.attn_rel_b.weight"])
def test_a_missing_tensor_is_named(tmp_path: Path, tensor: str) -> None:
    md, ts = build_t5("t5")
    with pytest.raises(ModelFormatError, match=tensor.replace(".", r"\.")):
        load(write(tmp_path, md, without(ts, tensor)))


@pytest.mark.parametrize("count", [0, 2, 100_000])
def test_an_absurd_bucket_count_is_named(tmp_path: Path, count: int) -> None:
    md, ts = build_t5("t5")
    md["t5.attention.relative_buckets_count"] = np.uint32(count)
    with pytest.raises(ModelFormatError, match="relative_buckets_count"):
        load(write(tmp_path, md, ts))


def test_a_missing_bucket_count_is_named(tmp_path: Path) -> None:
    md, ts = build_t5("t5")
    del md["t5.attention.relative_buckets_count"]
    with pytest.raises(ModelFormatError, match="relative_buckets_count"):
        load(write(tmp_path, md, ts))


def test_a_bias_table_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    """attn_rel_b is n_head x n_buckets: a table for 16 buckets in a file that says 32 is refused by name."""
    md, ts = build_t5("t5")
    name = "dec.blk.0.attn_rel_b.weight"
    ts = [(n, q, (4, 16), a[:16]) if n == name else (n, q, s, a) for n, q, s, a in ts]
    with pytest.raises(ModelFormatError, match=r"dec\.blk\.0\.attn_rel_b\.weight.*shape"):
        load(write(tmp_path, md, ts))


def test_a_start_token_outside_the_vocabulary_is_named(tmp_path: Path) -> None:
    md, ts = build_t5("t5")
    md["t5.decoder_start_token_id"] = np.uint32(5000)
    with pytest.raises(ModelFormatError, match="decoder_start_token_id"):
        load(write(tmp_path, md, ts))


def test_the_start_token_falls_back_to_bos(tmp_path: Path) -> None:
    md, ts = build_t5("t5")
    model = load(write(tmp_path, md, ts, "with.gguf"))
    assert model.net.decoder_start_token == 0  # the file's decoder_start_token_id (T5's pad, here <unk>)
    model.close()
    del md["t5.decoder_start_token_id"]
    model = load(write(tmp_path, md, ts, "bos.gguf"))
    assert model.net.decoder_start_token == 1  # llama_vocab_bos, as llama.cpp's examples fall back
    model.close()
    del md["tokenizer.ggml.bos_token_id"]
    model = load(write(tmp_path, md, ts, "none.gguf"))
    with pytest.raises(SettingError, match="decoder_start_token_id"):
        _ = model.net.decoder_start_token
    model.close()


def test_decoder_block_count_defaults_to_the_encoders(tmp_path: Path) -> None:
    md, ts = build_t5("t5")
    del md["t5.decoder_block_count"]
    model = load(write(tmp_path, md, ts))
    try:
        assert len(model.net.dec_layers) == len(model.net.enc_layers) == 2
        assert model.new_cache().n_layers == 2
    finally:
        model.close()


def test_a_layer_with_its_own_bias_uses_it(tmp_path: Path) -> None:
    """llama.cpp uses a block's own attn_rel_b when the file has one, layer 0's otherwise."""
    md, ts = build_t5("t5")
    own = np.full((32, 4), 0.5, np.float32)
    ts = ts + [("dec.blk.1.attn_rel_b.weight", GGMLType.F32, (4, 32), own)]
    model = load(write(tmp_path, md, ts))
    try:
        net = model.net
        assert np.array_equal(net.dec_layers[1].rel_bias, own)
        assert net.dec_layers[0].rel_bias is not net.dec_layers[1].rel_bias
        assert net.enc_layers[1].rel_bias is net.enc_layers[0].rel_bias
    finally:
        model.close()


def test_bucket_layout_by_hand() -> None:
    """32 buckets as T5 has them: bidirectional, 16 per side with 8 exact distances; causal, 16 exact distances;
    past 128 every distance shares the last bucket; future keys are bucket 0 in the causal layout."""
    assert relative_bucket([0, -1, -7, -8, -127, -128, -5000], 32, True).tolist() == [0, 1, 7, 8, 15, 15, 15]
    assert relative_bucket([1, 7, 8, 5000], 32, True).tolist() == [17, 23, 24, 31]
    assert relative_bucket([0, -15, -16, -128, -5000, 3], 32, False).tolist() == [0, 15, 16, 31, 31, 0]


def test_position_bias_is_the_table_looked_up_by_bucket() -> None:
    rng = np.random.default_rng(0)
    table = rng.standard_normal((32, 3)).astype(np.float32)
    bias = position_bias(table, np.arange(5), np.arange(7), True)
    assert bias.shape == (3, 5, 7)
    for i in range(5):
        for j in range(7):
            assert np.array_equal(bias[:, i, j], table[relative_bucket(j - i, 32, True)])


def test_a_gpu_backend_falls_back_to_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No CUDA path runs an encoder: 'auto' on a GPU machine runs T5 on the CPU (saying so, ggml numerics kept);
    an explicit 'cupy' is refused with a message."""
    import types

    import engine.model as model_module
    from engine.backend import Backend

    real = model_module.get_backend
    fake_gpu = Backend("cupy", types.ModuleType("fake_cupy"))
    monkeypatch.setattr(model_module, "get_backend", lambda name="auto": real("numpy") if name == "numpy" else fake_gpu)
    md, ts = build_t5("t5")
    path = write(tmp_path, md, ts, "t5.gguf")
    model = load_model(path, backend="auto", warm=False)
    try:
        assert not model.backend.is_device and model.numerics == "ggml"
        assert any("runs on the CPU" in w for w in model.warnings)
    finally:
        model.close()
    with pytest.raises(SettingError, match="CPU only"):
        load_model(path, backend="cupy", warm=False)
