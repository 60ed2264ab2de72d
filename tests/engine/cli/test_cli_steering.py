"""`bench` and `generate` with --lora and --control-vector: they run with them and say so (bench times the model
without them too, in the same process)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.gguf import write_gguf
from engine.intervene import control_vector as cv
from engine.quant.types import GGMLType
from tests.engine.cli.test_cli import cli, ok_json
from tests.tiny_models import make_tiny_llama


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny llama (dim 64, two layers), a rank-4 F16 adapter on its attn_q and ffn_up, a control vector."""
    folder = tmp_path_factory.mktemp("cli-steering")
    rng = np.random.default_rng(3)
    tensors = []
    for layer in range(2):
        for mat, n_out in (("attn_q", 64), ("ffn_up", 128)):
            base = f"blk.{layer}.{mat}.weight"
            a, b = rng.standard_normal((4, 64)), rng.standard_normal((n_out, 4))
            tensors += [(base + ".lora_a", GGMLType.F16, (64, 4), a.astype(np.float16)),
                        (base + ".lora_b", GGMLType.F16, (4, n_out), b.astype(np.float16))]
    md = {"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora",
          "adapter.lora.alpha": np.float32(8.0)}
    write_gguf(folder / "style.gguf", md, tensors)
    cv.save(folder / "calm.gguf", {1: rng.standard_normal(64).astype(np.float32)}, "llama", 2)
    return {"model": make_tiny_llama(folder / "tiny.gguf"), "lora": folder / "style.gguf", "cvec": folder / "calm.gguf"}


def test_bench_names_the_interventions_and_times_without_them(files: dict[str, Path]) -> None:
    model, steer = str(files["model"]), ["--lora", f"{files['lora']}:0.5", "--control-vector", str(files["cvec"])]
    b = ok_json("bench", model, "-p", "8", "-n", "4", "-r", "2", "--json", *steer)
    assert b["interventions"] == ["LoRA style.gguf x0.5", "control vector calm.gguf x1"]
    assert b["gen_tok_s"] > 0 and b["plain_gen_tok_s"] > 0 and b["plain_prompt_tok_s"] > 0
    plain = ok_json("bench", model, "-p", "8", "-n", "4", "-r", "1", "--json")
    assert plain["interventions"] == [] and "plain_gen_tok_s" not in plain
    text = cli("bench", model, "-p", "8", "-n", "4", "-r", "1", *steer)
    assert text.returncode == 0, text.stderr
    assert "with LoRA style.gguf x0.5; control vector calm.gguf x1" in text.stdout
    assert text.stdout.count("without them") == 2  # pp and tg, each with its ratio


def test_generate_json_reports_the_interventions_it_ran_with(files: dict[str, Path]) -> None:
    model = str(files["model"])
    plain = ok_json("generate", model, "--prompt", "the", "-n", "6", "--json")
    steered = ok_json("generate", model, "--prompt", "the", "-n", "6", "--json", "--lora", f"{files['lora']}:2",
                      "--control-vector", f"{files['cvec']}:4", "--ablate-head", "1:0")
    assert plain["interventions"] == []
    assert steered["interventions"] == ["ablated L1h0", "control vector calm.gguf x4", "LoRA style.gguf x2"]
    assert steered["token_ids"] != plain["token_ids"]


def test_a_bad_adapter_in_bench_exits_2_with_one_line(files: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "nope.gguf").write_bytes(b"not a gguf")
    r = cli("bench", str(files["model"]), "-p", "8", "-n", "2", "--lora", str(tmp_path / "nope.gguf"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "LoRA nope.gguf" in r.stderr, r.stderr
