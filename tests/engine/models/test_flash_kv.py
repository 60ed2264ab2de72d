"""Flash attention over a quantized K and V cache (Q8_0, Q4_0) against llama.cpp's with `-fa on -ctk/-ctv` (the
fixtures: tools/make_flash_fixtures.py --kv q8_0 / q4_0). Each model runs as llama.cpp ran it (a 40-token batch, a
100-token batch, then one token per step: ggml's one-row kernel every time over a quantized cache), and our logits at
llama.cpp's top-K ids must be its float32 values bit for bit."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.generate import prefill
from engine.model import load_model
from tests.engine.models.test_flash_attention import REAL, model_path, run
from tools.make_flash_fixtures import FIXTURES

CASES = [(name, kv) for kv in ("q8_0", "q4_0") for name in ("smollm2", "gemma3", "llama3", "gemma2")]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flash_kv")


@pytest.mark.parametrize(("name", "kv"), CASES)
def test_quantized_cache_logits_are_llama_cpps_bit_for_bit(request: pytest.FixtureRequest, folder: Path, name: str,
                                                           kv: str) -> None:
    z = dict(np.load(FIXTURES / f"{name}.kv_{kv}.npz"))
    meta = json.loads((FIXTURES / f"{name}.kv_{kv}.json").read_text())
    path = model_path(request, name, folder)
    if name not in REAL:
        from tests.engine.models.arch_cases import sha256  # noqa: PLC0415

        assert sha256(path) == meta["sha256"]  # the file llama.cpp ran
    got = run(path, z["ids"].tolist(), "on", meta["threads"], kv)
    top = z["top_ids"].astype(np.int64)
    ours = np.take_along_axis(got, top, axis=1)
    wrong = np.nonzero((ours != z["top_logits"]).any(1))[0]
    assert wrong.size == 0, f"{name} {kv}: {wrong.size} positions differ, first {wrong[:8]}, max " \
                            f"{np.abs(ours - z['top_logits']).max()}"


def test_a_cache_type_flash_attention_does_not_take_is_refused(request: pytest.FixtureRequest, folder: Path) -> None:
    """An F32 cache with flash on: a SettingError naming the types it takes (llama.cpp's flash kernel would take
    it, but the engine has no F32 path for it); the model keeps working."""
    model = load_model(model_path(request, "llama3", folder), flash_attn="on")
    try:
        with pytest.raises(SettingError, match="need an F16, Q8_0 or Q4_0 KV cache, not F32"):
            prefill(model, [5, 17, 3], model.new_cache(64, "F32"))
        assert prefill(model, [5, 17, 3], model.new_cache(64, "Q8_0")).shape[-1] == model.args.n_vocab
    finally:
        model.close()


def test_load_model_and_the_cli_take_the_cache_type(request: pytest.FixtureRequest, folder: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--cache-type / cache_type= sets every cache the model makes (llama.cpp's -ctk and -ctv); the CLI's logits
    with it equal the library's; F32 with flash attention and an unknown type are refused before any work."""
    from engine.cli.main import main  # noqa: PLC0415

    path = model_path(request, "llama3", folder)
    ids = [5, 17, 3, 40, 9]
    model = load_model(path, flash_attn="on", cache_type="q8_0")
    try:
        cache = model.new_cache(64)
        assert cache.cache_type == "Q8_0"
        want = prefill(model, ids, cache, all_logits=True)
        assert cache.rotated  # llama.cpp's Hadamard rotation around a quantized cache
    finally:
        model.close()
    tokens, out = tmp_path / "t.json", tmp_path / "o.npy"
    tokens.write_text(json.dumps(ids))
    assert main(["logits", str(path), "--tokens-file", str(tokens), "--out", str(out), "--flash-attn", "on",
                 "--cache-type", "q8_0"]) == 0
    np.testing.assert_array_equal(np.load(out)[-1], want[-1])
    assert main(["logits", str(path), "--tokens-file", str(tokens), "--out", str(out), "--flash-attn", "on",
                 "--cache-type", "f32"]) == 2
    assert "reads an F16, Q8_0 or Q4_0 KV cache, not F32" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["logits", str(path), "--tokens-file", str(tokens), "--out", str(out), "--cache-type", "q5_0"])
