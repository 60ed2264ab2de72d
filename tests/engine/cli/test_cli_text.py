"""The CLI's text input and tokenize flags: --text-file byte for byte (CRLF kept, as llama.cpp), refusals with one
line, BOS/EOS as the metadata says with --bos/--no-bos to force; inspect's warnings on a file that cannot run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli.options import read_text_file
from engine.errors import SettingError
from tests.conftest import GEMMA3_FILE, SMOLLM2_FILE, model_path
from tests.engine.tokenizer import corpus
from tests.tiny_models import make_tiny_llama

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("cli_text") / "tiny.gguf")


def _real(short: str) -> Path:
    path = model_path({"smollm2": SMOLLM2_FILE, "gemma3": GEMMA3_FILE}[short])
    if path is None:
        pytest.skip(f"{short} not found (set GGUF_LENS_MODELS_DIR)")
    return path


CR_TEXTS = {e["name"]: e["text"] for e in corpus.load()["entries"] if "\r" in e["text"]}


@pytest.mark.parametrize("name", sorted(CR_TEXTS))
@pytest.mark.parametrize("short", ["smollm2", "gemma3"])
def test_tokenize_text_file_keeps_crlf_like_llama_cpp(short: str, name: str, tmp_path: Path) -> None:
    """The file's bytes, tokenized by default (add_special, parse_special), equal llama_tokenize's ids."""
    texts = CR_TEXTS
    fx = json.loads((FIXTURES / f"tokens_{short}.json").read_text(encoding="utf-8"))
    want = corpus.unpack(fx["entries"][name], fx["combos"].index("add_special+parse_special"))
    path = tmp_path / "crlf.txt"
    path.write_bytes(texts[name].encode("utf-8"))
    assert b"\r\n" in path.read_bytes() or b"\r" in path.read_bytes()
    r = cli("tokenize", str(_real(short)), "--text-file", str(path))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == want


def test_read_text_file_is_byte_exact_and_refuses_bad_input(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_bytes(b"a\r\nb\rc\n\xef\xbb\xbfbom")
    assert read_text_file(str(good)) == "a\r\nb\rc\n\ufeffbom"
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\r\n\xc3\x28 then")
    with pytest.raises(SettingError, match=r"not valid UTF-8 at byte offset 4"):
        read_text_file(str(bad))
    with pytest.raises(SettingError, match=r"more than the 10-byte cap"):
        read_text_file(str(good), cap=10)
    with pytest.raises(SettingError, match="no such file"):
        read_text_file(str(tmp_path / "missing.txt"))
    with pytest.raises(SettingError, match="not a regular file"):
        read_text_file(str(tmp_path))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_text_file_refuses_devices_and_fifos_without_reading(tiny: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in ("/dev/urandom", "/dev/zero", str(fifo)):
        r = cli("tokenize", str(tiny), "--text-file", path)
        assert r.returncode == 2 and "not a regular file" in r.stderr, (path, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1


def test_invalid_utf8_names_the_offset_on_every_text_command(tiny: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"hello \xff world")
    for cmd in (["tokenize"], ["perplexity"], ["logits", "--out", str(tmp_path / "o.npy")]):
        r = cli(cmd[0], str(tiny), "--text-file", str(bad), *cmd[1:])
        assert r.returncode == 2 and "byte offset 6" in r.stderr, (cmd, r.stderr)


def test_tokenize_bos_follows_the_metadata_unless_forced(tiny: Path, tmp_path: Path) -> None:
    plain = json.loads(cli("tokenize", str(tiny), "--text", "the cat").stdout)
    forced = json.loads(cli("tokenize", str(tiny), "--text", "the cat", "--bos").stdout)
    assert forced == [0] + plain  # the tiny model's metadata adds no BOS
    assert json.loads(cli("tokenize", str(tiny), "--text", "the cat", "--no-bos").stdout) == plain
    r = cli("tokenize", str(tiny), "--text", "x", "--bos", "--no-bos")
    assert r.returncode == 2 and "not allowed with" in r.stderr


@pytest.mark.parametrize("short, has_bos", [("smollm2", False), ("gemma3", True)])
def test_tokenize_real_models_add_special_like_llama_cpp(short: str, has_bos: bool) -> None:
    fx = json.loads((FIXTURES / f"tokens_{short}.json").read_text(encoding="utf-8"))
    assert fx["add_bos"] is has_bos
    path = str(_real(short))
    default = json.loads(cli("tokenize", path, "--text", "Hello world").stdout)
    assert default == corpus.unpack(fx["entries"]["hello"], fx["combos"].index("add_special+parse_special"))
    no_bos = json.loads(cli("tokenize", path, "--text", "Hello world", "--no-bos").stdout)
    with_bos = json.loads(cli("tokenize", path, "--text", "Hello world", "--bos").stdout)
    assert with_bos == [fx["bos"]] + no_bos
    assert default == (with_bos if has_bos else no_bos)


@pytest.mark.parametrize("overrides, field, rule", [
    ({"llama.attention.head_count": 0}, "llama.attention.head_count = 0", "must be between 1 and"),
    ({"llama.block_count": 100000}, "llama.block_count = 100000", "must be between 1 and"),
    ({"general.architecture": "mamba9"}, "general.architecture = 'mamba9'", "is not supported"),
])
def test_inspect_lists_a_file_that_cannot_run_and_warns(tmp_path: Path, overrides: dict, field: str,
                                                        rule: str) -> None:
    path = make_tiny_llama(tmp_path / "bad.gguf", overrides=overrides)
    r = cli("inspect", str(path))
    assert r.returncode == 0, r.stderr
    assert "tensors:" in r.stdout and "blk.0.attn_q.weight" in r.stdout
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert any(field in w and rule in w and w.endswith("this model cannot run") for w in warnings), r.stderr
    report = json.loads(cli("inspect", str(path), "--json").stdout)
    assert any(p.startswith(field) and rule in p for p in report["problems"]), report["problems"]
    assert report["tensors"]


def test_inspect_of_a_runnable_file_has_no_problems(tiny: Path) -> None:
    r = cli("inspect", str(tiny), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["problems"] == []
    assert "cannot run" not in r.stderr


def test_inspect_lists_experts_and_warns_about_a_bad_count(tmp_path: Path) -> None:
    from engine.gguf import write_gguf  # noqa: PLC0415
    from tools.make_arch_models import U32, build, write_arch  # noqa: PLC0415

    good = write_arch(tmp_path / "moe.gguf", "qwen3moe")
    r = cli("inspect", str(good))
    assert r.returncode == 0 and "experts: 8 per layer, 2 used per token; expert tensors 6" in r.stdout, r.stdout
    report = json.loads(cli("inspect", str(good), "--json").stdout)
    ex = report["experts"]
    routed = 2 * 3 * 256 * 256 * 8 * 4  # 2 layers x gate/up/down, 256 x 256 x 8 experts, F32
    assert ex["expert_bytes"] == routed and ex["bytes_per_token"] == ex["total_bytes"] - routed + routed // 4
    assert report["problems"] == [] and json.loads(cli("inspect", str(_tiny_path(tmp_path)), "--json").stdout)["experts"] is None
    md, ts = build("qwen3moe")
    md["qwen3moe.expert_used_count"] = U32(12)
    bad = tmp_path / "bad-moe.gguf"
    write_gguf(bad, md, ts)
    r = cli("inspect", str(bad))
    assert r.returncode == 0 and "experts: 8 per layer, 12 used per token" in r.stdout
    assert any("qwen3moe.expert_used_count = 12" in w and "cannot run" in w for w in r.stderr.splitlines()), r.stderr


def _tiny_path(folder: Path) -> Path:
    return make_tiny_llama(folder / "dense.gguf")


def test_routing_writes_each_tokens_experts_as_json(tmp_path: Path) -> None:
    from tools.make_arch_models import write_arch  # noqa: PLC0415

    path = write_arch(tmp_path / "moe.gguf", "qwen3moe")
    r = cli("routing", str(path), "--text", "experts, please")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["moe_layers"] == [0, 1] and report["n_positions"] == len(report["tokens"]) > 3
    cell = report["tokens"][2]["layers"][0]
    assert len(cell["experts"]) == 2 and abs(sum(cell["weights"]) - 1) < 1e-5 and 0 < cell["entropy_bits"] <= 3
    layer = report["layers"][1]
    assert sum(layer["load"]) == 2 * report["n_positions"] and len(layer["tokens_of_expert"]) == 8
    dense = cli("routing", str(_tiny_path(tmp_path)), "--text", "hi")
    assert dense.returncode != 0 and "dense model: it has no experts" in dense.stderr


def test_compare_reports_where_quantization_changes_routing(tmp_path: Path) -> None:
    """compare on a Mixture-of-Experts file: per MoE layer the share of positions whose chosen experts differ (0
    against itself, some at Q2_K), in the JSON and the text; a dense model's report has none."""
    from tools.make_arch_models import write_arch  # noqa: PLC0415

    path = write_arch(tmp_path / "moe.gguf", "qwen3moe")
    text = tmp_path / "text.txt"
    text.write_text("The experts of a mixture are chosen per token, layer by layer, by a small router. " * 3)
    r = cli("compare", str(path), "--text-file", str(text), "--against", str(path), "--json")
    assert r.returncode == 0, r.stderr
    same = json.loads(r.stdout)
    assert [x["layer"] for x in same["routing"]] == [0, 1]
    assert all(x["changed_pct"] == 0 and x["swapped_mean"] == 0 for x in same["routing"])
    r = cli("compare", str(path), "--text-file", str(text), "--type", "Q2_K", "--json")
    assert r.returncode == 0, r.stderr
    moved = json.loads(r.stdout)
    assert any(x["changed_pct"] > 0 for x in moved["routing"])
    for x in moved["routing"]:  # a share of positions, and at most k = 2 experts swapped per position
        assert 0 <= x["changed_pct"] <= 100 and 0 <= x["swapped_mean"] <= 2
        assert (x["changed_pct"] == 0) == (x["swapped_mean"] == 0)
    r = cli("compare", str(path), "--text-file", str(text), "--type", "Q2_K")
    assert r.returncode == 0 and "of token-layer pairs choose other experts" in r.stdout
    dense = cli("compare", str(_tiny_path(tmp_path)), "--text-file", str(text), "--type", "Q8_0", "--json")
    assert dense.returncode == 0 and json.loads(dense.stdout)["routing"] == []
