"""`gguf-lens quantize` and `gguf-lens compare`: JSON keys, llama.cpp-identical output, one-line errors."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import engine.cli.main as cli

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
GOLDEN = json.loads((FIXTURES / "quantize_presets.json").read_text())["models"]["smollm2"]
COMPARE_KEYS = {"kld_mean", "kld_median", "kld_p99", "kld_max", "same_top_pct",
                "ppl_base", "ppl_other", "ppl_ratio", "per_layer"}


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(argv))
    except SystemExit as exc:  # argparse errors
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc: int, err: str) -> None:
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "error" in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "extra",
    [
        ["--tensor-type", "blk.[0=Q8_0"],
        ["--tensor-type", "attn_v=Q9_0"],
        ["--tensor-type", "attn_v"],
        ["--tensor-type", "attn_v=IQ2_XS"],
    ],
)
def test_quantize_bad_rules_exit_2_with_one_line(capsys, tmp_path: Path, extra: list[str]) -> None:
    src = tmp_path / "in.gguf"
    src.write_bytes(b"not read: the rule is checked first")
    rc, out, err = _run(capsys, "quantize", str(src), str(tmp_path / "out.gguf"), "--type", "Q4_K_M", *extra)
    _one_line_error(rc, err)
    assert not (tmp_path / "out.gguf").exists()


def test_quantize_bad_type_and_paths_exit_2(capsys, tmp_path: Path, smollm2_path: Path) -> None:
    rc, _, err = _run(capsys, "quantize", str(smollm2_path), str(tmp_path / "o.gguf"), "--type", "Q7_K")
    _one_line_error(rc, err)
    assert "Q4_K_M" in err  # names the valid choices
    rc, _, err = _run(capsys, "quantize", str(smollm2_path), str(smollm2_path), "--type", "Q8_0")
    _one_line_error(rc, err)
    rc, _, err = _run(capsys, "quantize", str(tmp_path / "missing.gguf"), str(tmp_path / "o.gguf"), "--type", "Q8_0")
    _one_line_error(rc, err)
    rc, _, err = _run(capsys, "quantize", str(smollm2_path), str(tmp_path / "no" / "o.gguf"), "--type", "Q8_0")
    _one_line_error(rc, err)
    rc, _, err = _run(capsys, "quantize", str(smollm2_path), str(tmp_path / "o.gguf"))
    _one_line_error(rc, err)  # --type is required


def test_quantize_writes_what_llama_quantize_writes(capsys, tmp_path: Path, smollm2_path: Path) -> None:
    out_path = tmp_path / "q4_0.gguf"
    rc, out, err = _run(capsys, "quantize", str(smollm2_path), str(out_path), "--type", "q4_0", "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["preset"] == "Q4_0" and report["file_type"] == 2
    assert hashlib.sha256(out_path.read_bytes()).hexdigest() == GOLDEN["presets"]["Q4_0"]["file_sha256"]


def test_quantize_says_which_tensors_fell_back(capsys, tmp_path: Path, smollm2_path: Path) -> None:
    golden = GOLDEN["rules"]["q4km_first_match"]
    rules = [a for r in golden["rules"] for a in ("--tensor-type", r)]
    rc, out, err = _run(capsys, "quantize", str(smollm2_path), str(tmp_path / "r.gguf"), "--type", "Q4_K_M", *rules)
    assert rc == 0, err
    assert "wrote" in out and "fell back" in out
    warnings = err.strip().splitlines()
    assert any("blk.0.attn_k.weight" in w and "Q4_K falls back to Q5_0" in w for w in warnings), err
    assert len(warnings) <= 5  # grouped by kind, not one line per tensor
    assert hashlib.sha256((tmp_path / "r.gguf").read_bytes()).hexdigest() == golden["file_sha256"]


@pytest.mark.parametrize(
    "extra",
    [
        [],  # neither rules nor --against
        ["--tensor-type", "(=Q8_0"],
        ["--tensor-type", "attn_v=Q8_0", "--against", "x.gguf"],
        ["--type", "Q1_Z"],
    ],
)
def test_compare_bad_settings_exit_2_with_one_line(capsys, smollm2_path: Path, extra: list[str]) -> None:
    rc, _, err = _run(capsys, "compare", str(smollm2_path), "--text-file", str(FIXTURES / "prose.txt"), *extra)
    _one_line_error(rc, err)


def test_compare_json_keys(capsys, smollm2_path: Path) -> None:
    rc, out, err = _run(capsys, "compare", str(smollm2_path), "--text-file", str(FIXTURES / "prose.txt"),
                        "--tensor-type", "attn_v=Q4_0", "--tensor-type", "ffn_down=Q4_0", "--max-tokens", "48", "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert COMPARE_KEYS <= set(report)
    assert len(report["per_layer"]) == 30  # SmolLM2's layers
    assert report["n_tokens"] == 48
    assert report["kld_mean"] > 0 and 0 <= report["same_top_pct"] <= 100
    assert report["ppl_ratio"] == pytest.approx(report["ppl_other"] / report["ppl_base"])


def test_compare_against_a_file(capsys, tmp_path: Path, smollm2_path: Path) -> None:
    other = tmp_path / "q8.gguf"
    assert _run(capsys, "quantize", str(smollm2_path), str(other), "--type", "Q8_0")[0] == 0
    rc, out, err = _run(capsys, "compare", str(smollm2_path), "--text-file", str(FIXTURES / "prose.txt"),
                        "--against", str(other), "--max-tokens", "32")
    assert rc == 0, err
    assert "KLD" in out and "same top token" in out and "per layer" in out
