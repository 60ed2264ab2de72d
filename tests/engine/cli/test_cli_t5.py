"""The gguf-lens command with an encoder-decoder (T5) model: `logits --encoder-tokens-file` and `generate`, and the
one-line refusals when a decoder-only model is given an encoder input or a T5 model is given none."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.engine.golden import kld_topk, log_softmax
from tests.engine.models.arch_cases import MOE_GGML_KLD_MAX
from tests.tiny_models import make_tiny_llama
from tools.make_arch_models import FIXTURES
from tools.make_t5_model import case_ids, dec_start, n_vocab


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, timeout=180,
                          check=False)


@pytest.fixture(scope="module")
def t5(t5_q8_path: Path) -> Path:
    return t5_q8_path


@pytest.fixture()
def ids_files(tmp_path: Path) -> tuple[Path, Path]:
    enc, dec = case_ids("b")  # the fixture's case run as one batch, as `logits` runs it
    (tmp_path / "e.json").write_text(json.dumps(enc))
    (tmp_path / "d.json").write_text(json.dumps(dec))
    return tmp_path / "e.json", tmp_path / "d.json"


def one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_logits_with_an_encoder_input_are_llama_cpps(t5: Path, ids_files: tuple[Path, Path], tmp_path: Path) -> None:
    enc, dec = ids_files
    out = tmp_path / "o.npy"
    r = cli("logits", str(t5), "--encoder-tokens-file", str(enc), "--tokens-file", str(dec), "--out", str(out))
    assert r.returncode == 0, r.stderr
    logits = np.load(out)
    assert logits.shape == (20, n_vocab()) and logits.dtype == np.float32
    z = np.load(FIXTURES / "t5.npz")
    kl = kld_topk(z["Q8_0_b_top_ids"], z["Q8_0_b_top_logp"], log_softmax(logits))
    assert kl.max() <= MOE_GGML_KLD_MAX


def test_float32_numerics_from_the_cli(t5: Path, ids_files: tuple[Path, Path], tmp_path: Path) -> None:
    enc, dec = ids_files
    out = tmp_path / "o.npy"
    r = cli("logits", str(t5), "--encoder-tokens-file", str(enc), "--tokens-file", str(dec), "--out", str(out),
            "--numerics", "float32")
    assert r.returncode == 0, r.stderr
    z = np.load(FIXTURES / "t5.npz")
    assert kld_topk(z["Q8_0_b_top_ids"], z["Q8_0_b_top_logp"], log_softmax(np.load(out))).mean() < 0.005


def test_t5_without_an_encoder_input_is_refused(t5: Path, ids_files: tuple[Path, Path], tmp_path: Path) -> None:
    _, dec = ids_files
    line = one_line_error(cli("logits", str(t5), "--tokens-file", str(dec), "--out", str(tmp_path / "o.npy")))
    assert "encoder-decoder" in line and "--encoder-tokens-file" in line and f"start token {dec_start()}" in line
    assert not (tmp_path / "o.npy").exists()


def test_an_encoder_input_for_a_decoder_only_model_is_refused(ids_files: tuple[Path, Path], tmp_path: Path) -> None:
    tiny = make_tiny_llama(tmp_path / "tiny.gguf")
    (tmp_path / "t.json").write_text("[5, 6, 7]")
    line = one_line_error(cli("logits", str(tiny), "--encoder-tokens-file", str(ids_files[0]), "--tokens-file",
                              str(tmp_path / "t.json"), "--out", str(tmp_path / "o.npy")))
    assert "decoder-only" in line and "--encoder-tokens-file" in line


@pytest.mark.parametrize(("content", "why"), [("not json", "not JSON"), ("[1, 2.5]", "list of integers"),
                                              ("[]", "empty"), ("[1, 99999]", "out of range")])
def test_a_bad_encoder_file_is_one_line(t5: Path, ids_files: tuple[Path, Path], tmp_path: Path, content: str,
                                        why: str) -> None:
    (tmp_path / "bad.json").write_text(content)
    line = one_line_error(cli("logits", str(t5), "--encoder-tokens-file", str(tmp_path / "bad.json"), "--tokens-file",
                              str(ids_files[1]), "--out", str(tmp_path / "o.npy")))
    assert why in line


def test_the_decoder_input_must_be_token_ids(t5: Path, ids_files: tuple[Path, Path], tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("hello")
    line = one_line_error(cli("logits", str(t5), "--encoder-tokens-file", str(ids_files[0]), "--text-file",
                              str(tmp_path / "t.txt"), "--out", str(tmp_path / "o.npy")))
    assert "--tokens-file" in line


def test_generate_encodes_the_prompt(t5: Path) -> None:
    """`generate` on a T5 file encodes the prompt and decodes greedily from the start token."""
    r = cli("generate", str(t5), "--prompt", "translate this, please", "-n", "5", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert 1 <= out["tokens"] <= 5 and out["finish_reason"] in ("length", "eos")
    again = json.loads(cli("generate", str(t5), "--prompt", "translate this, please", "-n", "5", "--json").stdout)
    assert again["text"] == out["text"]  # greedy: the same output each time


def test_generate_tokenizes_and_decodes_as_llama_cpp(t5: Path) -> None:
    """The fixture's prompt: our UGM tokenizer's ids (as `generate` asks for them, and as `tokenize` prints them) are
    llama_tokenize's, and `generate -n 8` gives llama.cpp's greedy decoder ids for that encoding (llama_encode, then
    llama_decode from the start token), up to its first EOS."""
    from engine.model import load_model  # noqa: PLC0415

    meta = json.loads((FIXTURES / "t5.json").read_text())
    prompt, want_ids = meta["prompt"], meta["prompt_ids"]
    model = load_model(t5, warm=False)
    try:
        assert model.tokenizer.encode(prompt, add_special=True, parse_special=False) == want_ids
        eos = model.tokenizer.eos_id
    finally:
        model.close()
    r = cli("tokenize", str(t5), "--text", prompt)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == want_ids
    r = cli("generate", str(t5), "--prompt", prompt, "-n", "8", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    greedy = meta["quants"]["Q8_0"]["greedy_ids"]
    want = greedy[: greedy.index(eos)] if eos in greedy else greedy
    assert out["token_ids"] == want and out["tokens"] == len(want)
    assert out["finish_reason"] == ("eos" if eos in greedy else "length")


def test_perplexity_is_of_the_text_given_the_encoder_input(t5: Path, tmp_path: Path) -> None:
    """`perplexity --encoder-text E --text T` is exp(mean NLL) of T's tokens, each predicted from the start token and
    those before it, in the decoder's logits given E's tokens (`logits --encoder-tokens-file`, llama.cpp's numbers)."""
    source, target = "translate English to German: The house is wonderful.", "Das Haus ist wunderbar."
    r = cli("perplexity", str(t5), "--encoder-text", source, "--text", target, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    enc, dec = (json.loads(cli("tokenize", str(t5), "--text", t, "--no-special").stdout) for t in (source, target))
    assert got["tokens"] == len(dec) and got["encoder_tokens"] == len(enc) and dec[-1] == 2  # T5 adds EOS
    (tmp_path / "e.json").write_text(json.dumps(enc))
    (tmp_path / "d.json").write_text(json.dumps([dec_start(), *dec[:-1]]))
    r = cli("logits", str(t5), "--encoder-tokens-file", str(tmp_path / "e.json"), "--tokens-file",
            str(tmp_path / "d.json"), "--out", str(tmp_path / "o.npy"))
    assert r.returncode == 0, r.stderr
    nll = -log_softmax(np.load(tmp_path / "o.npy"))[np.arange(len(dec)), dec]
    assert got["ppl"] == pytest.approx(float(np.exp(nll.mean(dtype=np.float64))), rel=1e-6)
    (tmp_path / "other.txt").write_text("The weather is cold today.")
    other = json.loads(cli("perplexity", str(t5), "--encoder-text-file", str(tmp_path / "other.txt"), "--text", target,
                           "--json").stdout)
    assert other["tokens"] == got["tokens"] and abs(other["ppl"] - got["ppl"]) > 1e-3 * got["ppl"]  # the input counts


def test_perplexity_of_t5_without_an_encoder_text_is_refused(t5: Path) -> None:
    line = one_line_error(cli("perplexity", str(t5), "--text", "Das Haus ist wunderbar."))
    assert "encoder-decoder" in line and "--encoder-text" in line and "llama-perplexity" in line


def test_an_encoder_text_for_a_decoder_only_model_is_refused(tmp_path: Path) -> None:
    tiny = make_tiny_llama(tmp_path / "tiny.gguf")
    line = one_line_error(cli("perplexity", str(tiny), "--encoder-text", "x", "--text", "the cat sat"))
    assert "decoder-only" in line and "--encoder-text" in line


def test_bench_encodes_the_prompt_and_times_the_decoder(t5: Path) -> None:
    """bench on T5: pp is the encoder's reading of -p tokens, tg the decoder's -n steps against it (no timing bound)."""
    r = cli("bench", str(t5), "-p", "24", "-n", "4", "-r", "1", "--json")
    assert r.returncode == 0, r.stderr
    b = json.loads(r.stdout)
    assert b["prompt_phase"] == "encoder" and b["n_prompt"] == 24 and b["n_gen"] == 4
    assert b["prompt_tok_s"] > 0 and b["gen_tok_s"] > 0 and b["backend"] == "numpy"
    r = cli("bench", str(t5), "-p", "16", "-n", "2", "-r", "1")
    assert r.returncode == 0, r.stderr
    assert "pp16:" in r.stdout and "(encoder)" in r.stdout and "tg2:" in r.stdout and "(decoder)" in r.stdout
    line = one_line_error(cli("bench", str(t5), "-p", "600", "-n", "2", "-r", "1"))
    assert "-p 600" in line and "512" in line


def test_imatrix_of_t5_is_refused_as_llama_imatrix_collects_nothing(t5: Path, tmp_path: Path) -> None:
    (tmp_path / "cal.txt").write_text("The house is wonderful. " * 200)
    line = one_line_error(cli("imatrix", str(t5), "--text-file", str(tmp_path / "cal.txt"), "-o",
                              str(tmp_path / "im.gguf"), "-c", "32"))
    assert "encoder-decoder" in line and "enc.blk" in line
    assert not (tmp_path / "im.gguf").exists()
