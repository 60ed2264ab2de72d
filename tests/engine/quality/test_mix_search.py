"""The mix search: the knapsack against brute force, the budget and block sizes, the cache, cancel, a written file."""
from __future__ import annotations

import itertools
import json
import shlex
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.errors import SettingError
from engine.gguf import open_gguf
from engine.model import load_model
from engine.quality.mix_search import MixPlan, find_mix, solve, solve_choices
from engine.quality.requantize import quantize_file
from engine.quality.sensitivity import (
    Sensitivities,
    TensorSensitivity,
    candidate_types,
    measure_all,
)
from engine.quality.sensitivity_cache import SensitivityCache, cache_key
from engine.quant.types import TYPES, GGMLType
from tests.llama_cpp_tools import LLAMA_QUANTIZE, llama_cpp_n_vocab, need_llama_python, need_llama_quantize
from tests.tiny_models import make_tiny_llama

TEXT = "the cat sat on the mat and the dog sat on the log, while 12 birds sang in the old tree by the river"


def _brute(options, budget):
    best = (np.inf, None)
    for pick in itertools.product(*[range(len(o)) for o in options]):
        size = sum(options[i][j][0] for i, j in enumerate(pick))
        cost = sum(options[i][j][1] for i, j in enumerate(pick))
        if size <= budget and cost < best[0] - 1e-12:
            best = (cost, pick)
    return best


def test_knapsack_finds_the_brute_force_optimum() -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(2, 6))
        options = [[(int(rng.integers(1, 30)), float(rng.random())) for _ in range(int(rng.integers(1, 4)))]
                   for _ in range(n)]
        low = sum(min(b for b, _ in o) for o in options)
        budget = low + int(rng.integers(0, 40))
        chosen, cost = solve_choices(options, budget, resolution=10_000)  # sizes are whole grid units: exact
        want, _ = _brute(options, budget)
        assert cost == pytest.approx(want, abs=1e-12)
        assert sum(options[i][j][0] for i, j in enumerate(chosen)) <= budget
        assert sum(options[i][j][1] for i, j in enumerate(chosen)) == pytest.approx(cost)
    with pytest.raises(SettingError, match="below the smallest mix"):
        solve_choices([[(10, 0.0)], [(10, 0.0)]], 15)
    # a coarse grid rounds every upgrade up; the exact fill afterwards still finds the mix that fits exactly
    chosen, cost = solve_choices([[(100, 1.0), (137, 0.0)]] * 50, 50 * 137, resolution=10)
    assert cost == 0.0 and chosen == [1] * 50


def _synthetic(n_tensors: int = 12, seed: int = 0) -> Sensitivities:
    """Tensors of 576- and 1536-wide rows with errors that halve per bit, and known sizes."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(n_tensors):
        n_cols, n_rows = (576, 576) if i % 3 else (1536, 576)
        types = candidate_types(n_cols, GGMLType.Q4_1)
        nbytes = {q.name: n_rows * TYPES[q].row_bytes(n_cols) for q in types}
        scale = float(rng.uniform(0.5, 5.0))
        err = {q.name: 0.0 if q == GGMLType.Q4_1 else scale * 2.0 ** -TYPES[q].bits_per_weight for q in types}
        name = f"blk.{i // 3}.t{i % 3}.weight"
        tensors[name] = TensorSensitivity(name, i // 3, n_rows * n_cols, "Q4_1", "Q4_0", scale * 1e-3, nbytes, err)
    n = sum(s.n_elements for s in tensors.values())
    return Sensitivities(tensors, 4096, n + 1024, 64)


def test_budget_and_block_sizes_are_respected() -> None:
    sens = _synthetic()
    for bpw in (3.5, 4.2, 5.0, 6.5, 9.0):
        plan = solve(sens, bpw)
        assert plan.nbytes <= bpw * plan.n_elements / 8 and plan.bpw <= bpw
        for name, q in plan.types.items():
            n_cols = 1536 if name.endswith("t0.weight") else 576
            assert n_cols % TYPES[GGMLType[q]].block_size == 0, (name, q)
    assert any(TYPES[GGMLType[q]].block_size == 256 for q in solve(sens, 3.5).types.values())  # 1536-wide rows may
    loose = solve(sens, 9.0)
    assert loose.predicted_kld == 0.0  # everything fits as in the file (or better): nothing is lost
    tight = [solve(sens, b).predicted_kld for b in (3.5, 4.2, 5.0)]
    assert tight[0] > tight[1] > tight[2]  # more bits, less KLD
    with pytest.raises(SettingError, match="below the smallest mix"):
        solve(sens, 1.0)
    assert candidate_types(576, GGMLType.Q4_1) == [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1,
                                                   GGMLType.Q8_0, GGMLType.F16]


def test_rules_give_every_tensor_its_type() -> None:
    from engine.quant.rules import match_rule, parse_rules

    plan = solve(_synthetic(), 4.5)
    rules = parse_rules(plan.rules())
    for name, q in plan.types.items():
        assert match_rule(rules, name).qtype.name == q
    assert match_rule(rules, "blk.11.t0.weight") is None  # blk.1 does not match blk.11


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Rows of 192 (no k-quant fits) and 512 (ffn_down: k-quants fit); uint32 keys, so llama.cpp loads it."""
    keys = {"llama.block_count": 2, "llama.context_length": 256, "llama.embedding_length": 192,
            "llama.feed_forward_length": 512, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
            "llama.rope.dimension_count": 48, "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 2}
    return make_tiny_llama(tmp_path_factory.mktemp("mix") / "tiny.gguf", dim=192, hidden=512, n_heads=4, n_kv_heads=2,
                           qtype=GGMLType.F16, tied=False, overrides={k: np.uint32(v) for k, v in keys.items()})


def test_measure_cancel_resume_and_corrupt_cache(tiny: Path, tmp_path: Path) -> None:
    model = load_model(tiny, warm=False)
    ids = model.tokenizer.encode(TEXT, add_special=True, parse_special=False)
    cache = SensitivityCache(cache_key(tiny, ids, model.numerics), folder=tmp_path)
    stop = threading.Event()
    seen = []

    def progress(what: str, frac: float) -> None:
        seen.append(what)
        if sum("tensor" in w for w in seen) >= 4:
            stop.set()

    assert measure_all(model, ids, cache=cache, progress=progress, cancel=stop) is None  # cancelled
    partial, note = cache.load()
    assert note is None and 2 <= len(partial) < 16
    resumed = measure_all(model, ids, cache=cache)
    assert resumed is not None and resumed.resumed == len(partial) and len(resumed.tensors) == 16
    fresh = measure_all(model, ids)
    for name, s in fresh.tensors.items():
        assert resumed.tensors[name].probe_kld == pytest.approx(s.probe_kld, rel=1e-9, abs=1e-15)
        assert resumed.tensors[name].error == pytest.approx(s.error)
    grouped = measure_all(model, ids, group_layers=2)  # one role of both layers in one run
    pair = [grouped.tensors[f"blk.{i}.ffn_up.weight"] for i in (0, 1)]
    assert pair[0].probe_kld > 0 and pair[1].probe_kld > 0
    assert pair[0].error == pytest.approx(fresh.tensors["blk.0.ffn_up.weight"].error)
    s = fresh.tensors["blk.0.attn_q.weight"]
    assert not any(TYPES[GGMLType[q]].block_size == 256 for q in s.nbytes)  # 192-wide rows
    assert any(TYPES[GGMLType[q]].block_size == 256 for q in fresh.tensors["blk.0.ffn_down.weight"].nbytes)
    assert s.probe_kld > 0 and s.kld("Q8_0") < s.kld("Q4_0") and s.kld("F16") == 0.0
    cache.path.write_text("{not json", encoding="utf-8")
    assert cache.load()[0] == {} and "ignored the sensitivity cache" in cache.load()[1]
    cache.save(fresh.tensors)
    assert len(json.loads(cache.path.read_text(encoding="utf-8"))["tensors"]) == 16  # rewritten whole
    other = SensitivityCache(cache_key(tiny, ids[:-1], model.numerics), folder=tmp_path)
    assert other.path != cache.path and other.load() == ({}, None)  # another text: another key
    model.close()


def test_search_writes_a_file_with_the_plan(tiny: Path, tmp_path: Path) -> None:
    model = load_model(tiny, warm=False)
    ids = model.tokenizer.encode(TEXT, add_special=True, parse_special=False)
    result = find_mix(model, ids, 5.0)
    plan = result.plan
    assert isinstance(plan, MixPlan) and plan.measured_kld is not None and plan.bpw <= 5.0
    assert plan.measured_kld == min(v.measured_kld for v in result.variants)
    model.close()
    out = tmp_path / "mix.gguf"
    written = quantize_file(tiny, out, plan.preset(), plan.rules())
    assert written.new_bytes == plan.nbytes
    with open_gguf(out) as g:
        assert {n: g.tensors[n].qtype.name for n in plan.types} == plan.types
    need_llama_python()
    assert llama_cpp_n_vocab(out, "the cat sat") == model.args.n_vocab


def test_cli_dry_run_prints_pasteable_rules(tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.main import main

    text = tmp_path / "calib.txt"
    text.write_text(TEXT, encoding="utf-8")
    assert main(["quantize", str(tiny), str(tmp_path / "x.gguf"), "--budget-bpw", "4.5", "--calibration-text",
                 str(text), "--dry-run", "--no-cache", "--no-verify", "--group-layers", "2"]) == 0
    out = capsys.readouterr().out
    assert "llama-quantize --allow-requantize" in out and "--tensor-type" in out and "ffn_down" in out
    assert not (tmp_path / "x.gguf").exists()
    assert main(["quantize", str(tiny), str(tmp_path / "x.gguf"), "--budget-bpw", "4.5"]) == 2
    assert "--calibration-text" in capsys.readouterr().err
    need_llama_quantize()
    # pasted into llama-quantize, the rules write the very file the search writes
    command = shlex.split(out.strip().splitlines()[-1])
    assert command[0] == "llama-quantize" and command[-2] == "OUT.gguf"
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    r = subprocess.run([str(LLAMA_QUANTIZE), *command[1:-2], str(theirs), command[-1], "2"], capture_output=True,
                       text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert main(["quantize", str(tiny), str(ours), "--budget-bpw", "4.5", "--calibration-text", str(text),
                 "--no-cache", "--no-verify", "--group-layers", "2"]) == 0
    assert ours.read_bytes() == theirs.read_bytes()
