"""The gguf-lens command: JSON contracts and one-line errors with exit status 2."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.tiny_models import make_tiny_llama


def cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, input=input,
                          timeout=120)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("cli") / "tiny.gguf")


def ok_json(*args: str) -> dict | list:
    r = cli(*args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_inspect_json(tiny: Path) -> None:
    out = ok_json("inspect", str(tiny), "--json")
    assert out["metadata"]["general.architecture"] == "llama"
    names = {t["name"] for t in out["tensors"]}
    assert "blk.0.attn_q.weight" in names
    t = next(t for t in out["tensors"] if t["name"] == "blk.0.attn_q.weight")
    assert t["type"] == "F32" and t["shape"] == [64, 64] and t["bytes"] == 64 * 64 * 4 and t["bpw"] == 32.0


def test_tokenize_flags(tiny: Path) -> None:
    plain = ok_json("tokenize", str(tiny), "--text", "the cat<|im_end|>")
    assert plain[-1] == 2  # <|im_end|> parsed as a special token
    nospecial = ok_json("tokenize", str(tiny), "--text", "the cat<|im_end|>", "--no-special")
    assert 2 not in nospecial and len(nospecial) > len(plain)
    bos = ok_json("tokenize", str(tiny), "--text", "the", "--bos")
    assert bos[0] == 0 and bos[1:] == ok_json("tokenize", str(tiny), "--text", "the")


def test_logits_from_tokens_file(tiny: Path, tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text("[5, 6, 7, 8]")
    r = cli("logits", str(tiny), "--tokens-file", str(tmp_path / "t.json"), "--out", str(tmp_path / "o.npy"))
    assert r.returncode == 0, r.stderr
    a = np.load(tmp_path / "o.npy")
    assert a.shape == (4, 269) and a.dtype == np.float32 and np.isfinite(a).all()


def test_logits_numerics_flag(tiny: Path, tmp_path: Path) -> None:
    """--numerics float32 is the reference; ggml (the default) rounds activations to F32's vec_dot_type (F32 here)
    and keeps an F16 cache, so the two differ a little; an unknown value is refused."""
    (tmp_path / "t.json").write_text(json.dumps(list(range(5, 25))))
    outs = {}
    for numerics in ("ggml", "float32"):
        r = cli("logits", str(tiny), "--tokens-file", str(tmp_path / "t.json"), "--out", str(tmp_path / f"{numerics}.npy"),
                "--numerics", numerics)
        assert r.returncode == 0, r.stderr
        outs[numerics] = np.load(tmp_path / f"{numerics}.npy")
    assert not np.array_equal(outs["ggml"], outs["float32"])
    np.testing.assert_allclose(outs["ggml"], outs["float32"], atol=0.05)
    bad = cli("logits", str(tiny), "--tokens-file", str(tmp_path / "t.json"), "--out", str(tmp_path / "x.npy"),
              "--numerics", "f64")
    assert bad.returncode == 2 and "--numerics" in bad.stderr


def test_generate_and_perplexity_json(tiny: Path, tmp_path: Path) -> None:
    g = ok_json("generate", str(tiny), "--prompt", "the", "-n", "5", "--json")
    assert set(g) >= {"text", "tokens", "prompt_tok_s", "gen_tok_s"} and g["tokens"] == 5
    (tmp_path / "p.txt").write_text("the cat sat on the mat and then the dog sat on the cat")
    p = ok_json("perplexity", str(tiny), "--text-file", str(tmp_path / "p.txt"), "--json")
    assert set(p) == {"ppl", "tokens"} and p["ppl"] > 1.0 and p["tokens"] > 5


def test_bench_json(tiny: Path) -> None:
    b = ok_json("bench", str(tiny), "-p", "16", "-n", "4", "-r", "1", "--json")
    assert set(b) >= {"prompt_tok_s", "gen_tok_s", "load_s", "peak_rss_mb", "backend"} and b["backend"] == "numpy"
    assert b["numerics"] == "ggml"
    assert ok_json("bench", str(tiny), "-p", "16", "-n", "4", "-r", "1", "--json", "--numerics", "float32")["numerics"] == "float32"


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "/nonexistent/model.gguf"],
        ["inspect", "not-a-catalog-name"],
        ["generate", "TINY", "--prompt", "x", "--temp", "-3"],
        ["generate", "TINY", "--prompt", "x", "--top-p", "7"],
        ["tokenize", "TINY"],
        ["bench", "TINY", "-p", "0"],
        ["bench", "TINY", "-p", "300", "-n", "2"],  # past the file's context_length (256)
        ["bench", "TINY", "--flash-attn", "auto-ish"],
        ["logits", "TINY", "--tokens-file", "/nonexistent.json", "--out", "/tmp/x.npy"],
        ["perplexity", "TINY", "--text-file", "/nonexistent.txt"],
        ["nosuchcommand"],
        ["inspect", "BADFILE"],
        ["generate", "TINY", "--prompt", "x", "-n", "notanumber"],
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], tiny: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 16)
    args = [str(tiny) if a == "TINY" else str(bad) if a == "BADFILE" else a for a in args]
    r = cli(*args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr


def test_bench_times_nothing_while_the_late_kernels_compile(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first start compiles the late kernels in a background process; bench waits for it after its warm-up and
    before the first timed prompt (timed beside that compile, a 2-core machine ran the prompt at half speed), and
    says how long in kernels_wait_s."""
    from engine.cli import bench
    from engine.kernels import precompile

    events: list[str] = []
    running = [True]
    monkeypatch.setattr(precompile, "late_status", lambda: 3.0 if running[0] else None)

    def wait(limit: float = 0.0) -> bool:
        events.append("wait")
        running[0] = False
        return True

    monkeypatch.setattr(precompile, "wait_late", wait)
    real = bench._time_decoder

    def timed(model, ids, n_gen, reps, waited, *switch):  # noqa: ANN001
        forward = model.forward

        def spy(tokens, cache, *a, **k):  # noqa: ANN001
            events.append(f"forward {len(tokens)}")
            return forward(tokens, cache, *a, **k)

        model.forward = spy
        return real(model, ids, n_gen, reps, waited, *switch)

    monkeypatch.setattr(bench, "_time_decoder", timed)
    result = bench.run_bench(str(tiny), n_prompt=16, n_gen=2, reps=2)
    assert events[:3] == ["forward 8", "forward 16", "wait"] and events.count("wait") == 1, events
    assert events.count("forward 16") == 1 + 2  # the warm-up's and the two timed prompts, all after it
    assert result["kernels_wait_s"] >= 0.0


def test_bench_runs_prompts_in_llama_cpp_batches_and_can_generate_after_the_prompt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prompt goes through the engine's prefill in llama.cpp's batches of 512 (n_ubatch: the peak memory of a
    long prompt is one batch's activations); --gen-after-prompt times the steps at depth -p (llama-bench -d)."""
    from engine.cli import bench
    from engine.generate import UBATCH

    path = make_tiny_llama(tmp_path / "long.gguf", n_ctx=2048)
    seen: list[tuple[str, int, int]] = []
    real = bench._time_decoder

    def timed(model, ids, n_gen, reps, waited, *rest):  # noqa: ANN001
        forward, step = model.forward, model.greedy_step

        def spy_forward(tokens, cache, *a, **k):  # noqa: ANN001
            seen.append(("forward", len(tokens), cache.length))
            return forward(tokens, cache, *a, **k)

        def spy_step(token, cache):  # noqa: ANN001
            seen.append(("step", 1, cache.length))
            return step(token, cache)

        model.forward, model.greedy_step = spy_forward, spy_step
        return real(model, ids, n_gen, reps, waited, *rest)

    monkeypatch.setattr(bench, "_time_decoder", timed)
    for after in (False, True):
        seen.clear()
        result = bench.run_bench(str(path), n_prompt=UBATCH + 100, n_gen=3, reps=1, gen_after_prompt=after)
        batches = [n for kind, n, _ in seen if kind == "forward" and n > 8]
        assert batches == [UBATCH, 100] * 2, batches  # the warm-up's prompt and the timed one
        steps = [at for kind, _, at in seen if kind == "step"]
        assert steps[-3:] == ([UBATCH + 100 + i for i in range(3)] if after else [0, 1, 2]), steps
        assert result["gen_depth"] == (UBATCH + 100 if after else 0)
