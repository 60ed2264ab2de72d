"""Flash attention against llama.cpp's with flash attention on (tools/make_flash_fixtures.py made the fixtures).

Each model runs as llama.cpp ran it: a 40-token batch (ggml's one-row kernel), a 100-token batch (the tiled
kernel), then one token per step (the one-row kernel, and on the real models past 256 cells the split-KV path
with the fixture's thread count). Our logits at llama.cpp's top-K ids must be its float32 values bit for bit,
with flash attention on and off, and the two runs must differ as llama.cpp's do.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.generate import prefill
from engine.model import load_model
from engine.quality.requantize import quantize_file
from tools.make_flash_fixtures import FIXTURES, N_CTX, PHASES, RANDOM, difference, write_random

CASES = ["smollm2", "gemma3", *RANDOM]
REAL = {"smollm2": "smollm2_path", "gemma3": "gemma3_path"}


def fixture(name: str) -> tuple[dict[str, np.ndarray], dict]:
    return dict(np.load(FIXTURES / f"{name}.npz")), json.loads((FIXTURES / f"{name}.json").read_text())


def model_path(request: pytest.FixtureRequest, name: str, folder: Path) -> Path:
    """The real file, or the random-weight one rebuilt with our writer and quantizer (llama.cpp's bytes)."""
    if name in REAL:
        return request.getfixturevalue(REAL[name])
    out = folder / f"{name}.Q8_0.gguf"
    if not out.exists():
        quantize_file(write_random(folder / f"{name}.F32.gguf", name), out, "Q8_0")
    return out


def run(path: Path, ids: list[int], flash: str, threads: int, cache_type: str | None = None) -> np.ndarray:
    """Logits at every position in the fixture's batches, then one token per step (K and V rows of `cache_type`)."""
    model = load_model(path, flash_attn=flash, cache_type=cache_type)
    try:
        model.net.ops.flash_threads = threads  # llama.cpp's, for the split-KV path's chunks
        cache = model.new_cache(N_CTX)
        first, second = PHASES
        rows = [prefill(model, ids[:first], cache, all_logits=True, chunk_size=512),
                prefill(model, ids[: first + second], cache, all_logits=True, chunk_size=512)]
        for n in range(first + second + 1, len(ids) + 1):
            rows.append(prefill(model, ids[:n], cache, all_logits=True))
        return np.concatenate(rows)
    finally:
        model.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("flash")


@pytest.fixture(scope="module", params=CASES)
def logits(request: pytest.FixtureRequest, folder: Path) -> tuple[str, dict, dict, dict[str, np.ndarray]]:
    name = request.param
    z, meta = fixture(name)
    path = model_path(request, name, folder)
    if name not in REAL:
        from tests.engine.models.arch_cases import sha256  # noqa: PLC0415

        assert sha256(path) == meta["sha256"]  # the file llama.cpp ran
    ids = z["ids"].tolist()
    got = {tag: run(path, ids, on, meta["threads"]) for tag, on in (("flash", "on"), ("no_flash", "off"))}
    return name, z, meta, got


@pytest.mark.parametrize("tag", ["flash", "no_flash"])
def test_logits_are_llama_cpps_bit_for_bit(logits, tag: str) -> None:
    """Flash on and off: llama.cpp's top-K ids in its order, their float32 logits identical."""
    name, z, _, got = logits
    top = z[f"{tag}_top_ids"].astype(np.int64)
    ours = np.take_along_axis(got[tag], top, axis=1)
    wrong = np.nonzero((ours != z[f"{tag}_top_logits"]).any(1))[0]
    assert wrong.size == 0, f"{name} {tag}: {wrong.size} positions differ, first {wrong[:8]}, max " \
                            f"{np.abs(ours - z[f'{tag}_top_logits']).max()}"
    assert (got[tag].argmax(1) == top[:, 0]).all()


def test_flash_differs_from_no_flash_as_llama_cpps_does(logits) -> None:
    """Our flash and non-flash runs are as far apart as llama.cpp's two (KLD, same top token, perplexities)."""
    name, z, meta, got = logits
    ours = difference(z["ids"].tolist(), got["flash"], got["no_flash"])
    assert ours["kld_mean"] > 0.0
    for key, value in ours.items():
        assert value == pytest.approx(meta[key], rel=1e-9), (name, key)


def test_unknown_flash_value_refused_before_any_work(tmp_path: Path) -> None:
    """A value it does not know: a SettingError naming it, before the (missing) file is even looked for."""
    with pytest.raises(SettingError, match="--flash-attn 'auto' is not one of off, on"):
        load_model(tmp_path / "missing.gguf", flash_attn="auto")


def test_flash_needs_ggml_numerics(tmp_path: Path) -> None:
    with pytest.raises(SettingError, match="needs --numerics ggml"):
        load_model(tmp_path / "missing.gguf", numerics="float32", flash_attn="on")


@pytest.mark.parametrize("cmd", [["logits", "--tokens-file", "t.json", "--out", "o.npy"], ["bench"],
                                 ["perplexity", "--text-file", "t.txt"], ["compare", "--text-file", "t.txt", "--type", "Q8_0"]])
def test_cli_refuses_an_unknown_flash_value(tmp_path: Path, capsys: pytest.CaptureFixture[str], cmd: list[str]) -> None:
    """Every command that takes numerics: one clear line and exit 2, nothing read or written."""
    from engine.cli.main import main  # noqa: PLC0415

    with pytest.raises(SystemExit) as exc:
        main([cmd[0], str(tmp_path / "m.gguf"), *cmd[1:], "--flash-attn", "auto"])
    assert exc.value.code == 2
    assert "--flash-attn: invalid choice: 'auto'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
