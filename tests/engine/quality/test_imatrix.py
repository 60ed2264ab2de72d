"""Importance matrices: llama.cpp's file formats, the chunks llama-imatrix runs, and our values against its own.

Fixtures from tools/make_imatrix_fixtures.py (llama-imatrix on assets/imatrix_calibration.txt, flash attention
off): tests/fixtures/imatrix/smollm2.short.imatrix.gguf (2 chunks of 128 tokens), and the whole-text run in the
GGUF and legacy .dat formats.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelFormatError, SettingError
from engine.quality.imatrix import (
    ImportanceMatrix,
    quant_weights_for,
    quantize_metadata,
    read_imatrix,
    relative_difference,
    write_imatrix,
    write_imatrix_legacy,
)
from engine.quality.imatrix_collect import chunk_tokens, compute_imatrix
from tests.conftest import SMOLLM2_FILE, model_path

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures" / "imatrix"
TEXT = ROOT / "assets" / "imatrix_calibration.txt"


def _synthetic() -> ImportanceMatrix:
    rng = np.random.default_rng(3)
    im = ImportanceMatrix(datasets=["calib.txt"], chunk_count=3, chunk_size=64)
    im.add("blk.0.attn_q.weight", rng.random(96).astype(np.float32) * 192, 192)
    im.add("blk.0.ffn_down.weight", rng.random(256).astype(np.float32) * 192, 192)
    im.sums["blk.1.ffn_up.weight"] = rng.random((1, 96)).astype(np.float32)
    im.counts["blk.1.ffn_up.weight"] = np.array([0], np.int64)  # no tokens: llama-quantize reads 1s
    return im


def test_gguf_and_legacy_round_trip(tmp_path: Path) -> None:
    im = _synthetic()
    write_imatrix(tmp_path / "a.gguf", im)
    back = read_imatrix(tmp_path / "a.gguf")
    assert back.names() == im.names() and back.datasets == ["calib.txt"] and back.chunk_count == 3
    assert back.chunk_size == 64 and not back.legacy
    for n in im.names():
        np.testing.assert_array_equal(back.values(n), im.values(n))
    np.testing.assert_array_equal(back.values("blk.1.ffn_up.weight"), np.ones(96, np.float32))
    write_imatrix_legacy(tmp_path / "a.dat", im)
    old = read_imatrix(tmp_path / "a.dat")
    assert old.legacy and old.datasets == ["calib.txt"] and old.chunk_count == 3
    assert max(relative_difference(old, im).values()) < 1e-6


def test_malformed_files_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.dat"
    bad.write_bytes(struct.pack("<i", 2) + struct.pack("<i", 5) + b"blk.0")
    with pytest.raises(ModelFormatError, match="truncated"):
        read_imatrix(bad)
    bad.write_bytes(b"\xff\xff\xff\x7f")
    with pytest.raises(ModelFormatError, match="neither a GGUF nor a legacy imatrix"):
        read_imatrix(bad)
    with pytest.raises(SettingError, match="cannot read"):
        read_imatrix(tmp_path / "missing.gguf")


def test_quant_weights_checks_and_metadata() -> None:
    im = _synthetic()
    w = quant_weights_for(im, {"blk.0.attn_q.weight": (96, 8), "blk.9.attn_q.weight": (96, 8)})
    assert list(w) == ["blk.0.attn_q.weight"]  # a tensor missing from the matrix is quantized without
    with pytest.raises(SettingError, match="imatrix size 96 is different from tensor size 128"):
        quant_weights_for(im, {"blk.0.attn_q.weight": (128, 8)})
    keys = quantize_metadata(im, "x" * 200)
    assert [k for k, _, _ in keys] == ["quantize.imatrix.file", "quantize.imatrix.dataset",
                                       "quantize.imatrix.entries_count", "quantize.imatrix.chunks_count"]
    assert len(keys[0][1]) == 127 and keys[2][1] == 3


def test_chunks_as_llama_imatrix() -> None:
    ids = list(range(10, 110))
    chunks = chunk_tokens(ids, 32, bos=1)
    assert len(chunks) == 3 and all(len(c) == 32 and c[0] == 1 for c in chunks) and chunks[1][1:4] == [43, 44, 45]
    assert chunk_tokens(ids, 32, bos=None, max_chunks=2)[1][0] == 42
    assert chunk_tokens(ids, 32, bos=None, skip=1)[0][0] == 42
    with pytest.raises(SettingError, match="at least 2 chunks"):
        chunk_tokens(ids, 64, bos=1)


def test_fixture_formats_agree() -> None:
    gguf, dat = FIX / "smollm2.imatrix.gguf", FIX / "smollm2.imatrix.dat"
    if not gguf.is_file():
        pytest.skip("imatrix fixtures not made (tools/make_imatrix_fixtures.py)")
    a, b = read_imatrix(gguf), read_imatrix(dat)
    assert a.names() == b.names() and len(a) == 210 and a.datasets == ["calibration.txt"]
    assert a.chunk_size == 512 and a.chunk_count == 6 and b.chunk_count == 6
    assert max(relative_difference(b, a).values()) < 1e-5


@pytest.fixture(scope="module")
def smollm2():
    path = model_path(SMOLLM2_FILE)
    if path is None:
        pytest.skip(f"model {SMOLLM2_FILE} not found")
    from engine.model import load_model

    m = load_model(path)
    yield m
    m.close()


def test_values_equal_llama_imatrix(smollm2) -> None:
    ref_path = FIX / "smollm2.short.imatrix.gguf"
    if not ref_path.is_file():
        pytest.skip("imatrix fixtures not made (tools/make_imatrix_fixtures.py)")
    ref = read_imatrix(ref_path)
    ours = compute_imatrix(smollm2, TEXT.read_text(), n_ctx=128, max_chunks=2, dataset="calibration.txt")
    assert ours is not None and ours.names() == ref.names()
    for n in ref.names():
        assert ours.counts[n].tolist() == ref.counts[n].tolist() == [256]
    diff = relative_difference(ours, ref)
    worst = max(diff, key=diff.get)
    assert diff[worst] <= 1e-3, f"{worst}: relative difference {diff[worst]:.2e}"
