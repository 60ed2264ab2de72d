"""`gguf-lens imatrix` and `quantize --imatrix`: the file written, --show, one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import engine.cli.main as cli
from engine.quality.imatrix import read_imatrix
from tests.conftest import SMOLLM2_FILE, model_path

TEXT = Path(__file__).resolve().parents[3] / "assets" / "imatrix_calibration.txt"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_imatrix_command_writes_both_formats(capsys, tmp_path: Path) -> None:
    path = model_path(SMOLLM2_FILE)
    if path is None:
        pytest.skip(f"model {SMOLLM2_FILE} not found")
    out = tmp_path / "im.gguf"
    rc, stdout, err = _run(capsys, "imatrix", str(path), "--text-file", str(TEXT), "-o", str(out),
                           "-c", "64", "--chunks", "2", "--json")
    assert rc == 0, err
    report = json.loads(stdout)
    assert report["tensors"] == 210 and report["chunks"] == 2 and report["chunk_size"] == 64
    im = read_imatrix(out)
    assert im.chunk_count == 2 and im.datasets == [str(TEXT)] and im.counts["blk.0.attn_q.weight"].tolist() == [128]
    rc, stdout, _ = _run(capsys, "imatrix", "--show", str(out), "--json")
    shown = json.loads(stdout)
    assert rc == 0 and len(shown["tensors"]) == 210 and shown["tensors"][0]["columns"] == 576
    rc, _, err = _run(capsys, "imatrix", str(path), "-o", str(out))
    assert rc == 2 and "--text-file" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.dat"
    bad.write_bytes(b"\x00\x00\x00\x00")
    rc, _, err = _run(capsys, "quantize", str(path), str(tmp_path / "o.gguf"), "--type", "Q8_0", "--imatrix", str(bad))
    assert rc == 2 and "imatrix" in err and "Traceback" not in err
