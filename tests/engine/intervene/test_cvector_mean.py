"""A control vector from prompt pairs, as llama-cvector-generator's mean method makes one (its own example prompts,
tests/fixtures/cvec/positive.txt and negative.txt from llama.cpp's tools/cvector-generator), checked against the
method computed here by hand in float64 from the recorded block outputs; and the file it writes applies."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.cli.cvector import prompt_lines
from engine.errors import SettingError
from engine.intervene import control_vector as cv
from engine.intervene.cvector_mean import _block_outputs, _tokens, mean_directions
from engine.model import load_model

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "cvec"


def test_prompt_files_are_read_as_the_generator_reads_them() -> None:
    pos = prompt_lines(str(FIX / "positive.txt"), "--positive-file")
    assert len(pos) == 4 and pos[0].startswith("<|start_header_id|>system<|end_header_id|>\n\nAct like")
    assert "\\n" not in "".join(pos)


def test_mean_directions_are_the_normalised_mean_of_the_kept_differences(smollm2_path: Path) -> None:
    pos = prompt_lines(str(FIX / "positive.txt"), "p")
    neg = prompt_lines(str(FIX / "negative.txt"), "n")
    model = load_model(smollm2_path, numerics="ggml")
    try:
        got = mean_directions(model, list(zip(pos, neg)))
        assert sorted(got) == list(range(1, 30))
        rows: dict[int, list[np.ndarray]] = {i: [] for i in range(29)}
        for p, n in zip(pos, neg):
            a, b = _tokens(model, p, n)
            assert len(a) == len(b)
            out_a, out_b = _block_outputs(model, a), _block_outputs(model, b)
            for i in range(29):
                d = (out_a[i] - out_b[i]).astype(np.float64)
                rows[i].append(d[(d > 1e-6).any(axis=1)])
        for i in range(29):
            mean = np.concatenate(rows[i]).mean(axis=0)
            want = mean / np.linalg.norm(mean)
            assert np.allclose(got[i + 1], want, atol=2e-6), i
            assert abs(float(np.linalg.norm(got[i + 1].astype(np.float64))) - 1) < 1e-5
        with pytest.raises(SettingError, match="same outputs"):
            mean_directions(model, [(pos[0], pos[0])])
    finally:
        model.close()


def test_the_cli_writes_a_control_vector_that_applies(smollm2_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "happy.gguf"
    run = [sys.executable, "-m", "engine.cli", "cvector", str(smollm2_path), "--positive-file", str(FIX / "positive.txt"),
           "--negative-file", str(FIX / "negative.txt"), "-o", str(out)]
    done = subprocess.run(run, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    vec = cv.load([(str(out), 4.0)], 576, 30, "llama")
    assert sorted(vec.directions) == list(range(1, 30))
    gen = subprocess.run([sys.executable, "-m", "engine.cli", "generate", str(smollm2_path), "--prompt", "I feel",
                          "-n", "8", "--control-vector", f"{out}:4", "--json"], capture_output=True, text=True)
    assert gen.returncode == 0 and "control vector happy.gguf x4" in gen.stderr
    one_sided = tmp_path / "one.txt"
    one_sided.write_text("just one\n")
    bad = subprocess.run([*run[:6], str(one_sided), *run[7:]], capture_output=True, text=True)
    assert bad.returncode == 2 and "they go in pairs" in bad.stderr
