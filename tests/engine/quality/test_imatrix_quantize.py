"""quantize --imatrix against llama-quantize --imatrix: the plan of every case, and the bytes of sample tensors.

Fixture: tests/fixtures/imatrix/quantize.json and <model>.imatrix.gguf from tools/make_imatrix_fixtures.py
(llama-quantize --allow-requantize [--imatrix <model>.imatrix.gguf] [--tensor-type ...] on the catalog models).
The bytes of blk.0's attn_q and ffn_down (and the output matrix where the file has one) are requantized here in
every case, and two whole files (a k-quant preset with rules on SmolLM2, Q3_K_M on Gemma 3) are written by the CLI
and compared with llama-quantize's file by sha256.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from engine.cli.main import main
from engine.gguf import open_gguf
from engine.quality.imatrix import quant_weights_for, read_imatrix
from engine.quality.requantize import make_plan, output_metadata, requantize_rows
from tests.conftest import GEMMA3_FILE, SMOLLM2_FILE, model_path

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "imatrix"
GOLDEN = json.loads((FIX / "quantize.json").read_text()) if (FIX / "quantize.json").is_file() else None
FILES = {"smollm2": SMOLLM2_FILE, "gemma3": GEMMA3_FILE}
SAMPLE = re.compile(r"^(blk\.0\.(attn_q|ffn_down)\.weight|output\.weight)$")  # the narrow and the wide rows


def _golden(key: str):
    if GOLDEN is None:
        pytest.skip("imatrix fixtures not made (tools/make_imatrix_fixtures.py)")
    path = model_path(FILES[key])
    if path is None:
        pytest.skip(f"model {FILES[key]} not found")
    return GOLDEN["models"][key], path, read_imatrix(FIX / f"{key}.imatrix.gguf")


def _pairs() -> list[tuple[str, str]]:
    if GOLDEN is None:
        return [("smollm2", "none")]
    return [(k, c) for k, m in GOLDEN["models"].items() for c in sorted(m["cases"])]


@pytest.mark.parametrize(("key", "case"), _pairs())
def test_plan_and_metadata_as_llama_quantize(key: str, case: str) -> None:
    model, path, im = _golden(key)
    spec, want = GOLDEN["cases"][case], model["cases"][case]
    with open_gguf(path) as g:
        plan = make_plan(g, spec["preset"], spec["rules"], has_imatrix=spec["imatrix"])
        assert {n: t.new.name for n, t in plan.tensors.items()} == want["types"]
        md, _ = output_metadata(g, plan, (im, f"{key}.imatrix.gguf") if spec["imatrix"] else None)
    assert list(md) == want["metadata_keys"]
    assert {k: v for k, v in md.items() if k.startswith("quantize.imatrix.")} == want["imatrix_keys"]


@pytest.mark.parametrize(("key", "case"), _pairs())
def test_sample_tensors_byte_identical(key: str, case: str) -> None:
    model, path, im = _golden(key)
    spec, want = GOLDEN["cases"][case], model["cases"][case]
    with open_gguf(path) as g:
        plan = make_plan(g, spec["preset"], spec["rules"], has_imatrix=spec["imatrix"])
        sample = [tp for n, tp in plan.tensors.items() if SAMPLE.match(n)]
        assert sample
        weights = quant_weights_for(im, {tp.name: tp.shape for tp in sample}) if spec["imatrix"] else {}
        for tp in sample:  # a tensor that keeps its type keeps the file's bytes, as llama-quantize copies it
            blocks = (requantize_rows(g.rows(tp.name), tp.old, tp.new, quant_weights=weights.get(tp.name))
                      if tp.changed else g.rows(tp.name))
            got = hashlib.sha256(np.ascontiguousarray(blocks).tobytes()).hexdigest()[:16]
            assert got == want["hashes"][tp.name], f"{tp.name} as {tp.new.name}"


@pytest.mark.slow
@pytest.mark.parametrize(("key", "case"), [("smollm2", "Q4_K_M_rules"), ("gemma3", "Q3_K_M")])
def test_whole_file_byte_identical(key: str, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, path, _ = _golden(key)
    spec = GOLDEN["cases"][case]
    # the file names the imatrix as it was given: llama-quantize was handed "<key>.imatrix.gguf" in its folder
    shutil.copy(FIX / f"{key}.imatrix.gguf", tmp_path / f"{key}.imatrix.gguf")
    monkeypatch.chdir(tmp_path)
    rules = [a for r in spec["rules"] for a in ("--tensor-type", r)]
    assert main(["quantize", str(path), "out.gguf", "--type", spec["preset"], *rules,
                 "--imatrix", f"{key}.imatrix.gguf", "--threads", "2"]) == 0
    h = hashlib.sha256((tmp_path / "out.gguf").read_bytes()).hexdigest()
    assert h == model["cases"][case]["file_sha256"]
