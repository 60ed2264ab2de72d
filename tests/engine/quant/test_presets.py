"""Preset type choice == llama-quantize's, tensor by tensor, for every preset and both test models.

The expected types come from tests/fixtures/quantize_presets.json, made by
tools/make_quantize_fixtures.py with llama.cpp's own llama_model_quantize. Fast: no quantizing.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

from engine.errors import SettingError
from engine.gguf import open_gguf
from engine.quant.presets import (
    PRESETS,
    Category,
    ModelShape,
    category,
    choose_types,
    fit_row,
    layer_sort_key,
    preset_by_name,
)
from engine.quant.presets import _use_more_bits as use_more_bits
from engine.quant.rules import parse_rules
from engine.quant.types import GGMLType
from engine.quality.requantize import make_plan, output_metadata
from tests.conftest import model_path

ROOT = Path(__file__).resolve().parents[3]
FIXTURE = ROOT / "tests" / "fixtures" / "quantize_presets.json"
GOLDEN = json.loads(FIXTURE.read_text())
MODELS = sorted(GOLDEN["models"])
_T = GGMLType


def build_tiny_untied(path: Path) -> Path:
    """The tiny untied model of tools/make_quantize_fixtures.py, byte for byte (checked against its sha256)."""
    spec = importlib.util.spec_from_file_location("make_quantize_fixtures", ROOT / "tools" / "make_quantize_fixtures.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.build_tiny_untied(path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == GOLDEN["models"]["tiny_untied"]["source_sha256"]
    return path


def source_path(key: str, folder: Path) -> Path:
    """The model file the fixture `key` was made from: a test model, or the tiny one built in `folder`."""
    name = GOLDEN["models"][key]["file"]
    if name is None:
        return build_tiny_untied(folder / f"{key}.gguf")
    path = model_path(name)
    if path is None:
        pytest.skip(f"model {name} not found (set GGUF_LENS_MODELS_DIR)")
    return path


def _cases() -> list[tuple[str, str]]:
    return [(m, p) for m in MODELS for p in GOLDEN["models"][m]["presets"]]


def _rule_cases() -> list[tuple[str, str]]:
    return [(m, r) for m in MODELS for r in GOLDEN["models"][m]["rules"]]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory):
    opened: dict[str, object] = {}
    folder = tmp_path_factory.mktemp("sources")

    def get(key: str):
        if key not in opened:
            opened[key] = open_gguf(source_path(key, folder))
        return opened[key]

    yield get
    for g in opened.values():
        g.close()  # type: ignore[attr-defined]


def _check(g, key: str, golden: dict, preset: str, rules: list[str]) -> None:
    plan = make_plan(g, preset, rules)
    names = GOLDEN["models"][key]["tensors"]
    assert list(plan.tensors) == names  # llama.cpp's order: outside blocks first, then by block number
    want = golden["types"].split()
    got = [plan.tensors[n].new.name for n in names]
    diff = [(n, g_, w) for n, g_, w in zip(names, got, want) if g_ != w]
    assert diff == [], f"{len(diff)} of {len(names)} tensors differ from llama-quantize: {diff[:5]}"
    assert plan.file_type == golden["file_type"]


@pytest.mark.parametrize(("key", "preset"), _cases())
def test_preset_types_match_llama_quantize(files, key: str, preset: str) -> None:
    _check(files(key), key, GOLDEN["models"][key]["presets"][preset], preset, [])


@pytest.mark.parametrize(("key", "case"), _rule_cases())
def test_rule_types_match_llama_quantize(files, key: str, case: str) -> None:
    golden = GOLDEN["models"][key]["rules"][case]
    _check(files(key), key, golden, golden["preset"], golden["rules"])


@pytest.mark.parametrize("key", MODELS)
def test_metadata_as_llama_quantize_writes_it(files, key: str) -> None:
    g = files(key)
    golden = GOLDEN["models"][key]
    for name, out in golden["presets"].items():
        md, types = output_metadata(g, make_plan(g, name))
        assert list(md) == golden["metadata_keys"]
        assert md["general.file_type"] == out["file_type"]
        assert types["general.file_type"][0].name == out["file_type_vtype"]
        assert md["general.quantization_version"] == out["quantization_version"]


def test_every_preset_is_in_the_fixture_with_its_ftype() -> None:
    assert GOLDEN["ftypes"] == {name: PRESETS[name].ftype for name in GOLDEN["ftypes"]}
    # an F32 copy of a model is not worth a fixture; MXFP4_MOE matters for Mixture-of-Experts files only and is held
    # to llama-quantize's own files (sha256) on the MoE test models in tests/engine/models/test_arch_logits.py
    missing = set(PRESETS) - set(GOLDEN["ftypes"]) - {"F32", "MXFP4_MOE"}
    assert missing == set()


def test_fallbacks_are_reported(files) -> None:
    g = files("smollm2")
    plan = make_plan(g, "Q4_K_M")
    fell = {t.name: t for t in plan.fallbacks}
    assert fell, "SmolLM2's 576-wide rows cannot hold 256-weight blocks"
    t = plan.tensors["blk.0.attn_q.weight"]
    assert t.fallback and t.new == _T.Q5_0
    assert "576 columns are not a multiple of Q4_K's 256-wide super-block: Q4_K falls back to Q5_0" in t.reason
    assert not plan.tensors["blk.1.ffn_down.weight"].fallback


def test_preset_names() -> None:
    assert preset_by_name("q4_k_m").name == "Q4_K_M"
    assert preset_by_name("Q4_K").name == "Q4_K_M"  # llama-quantize's alias
    assert preset_by_name("Q3_K").name == "Q3_K_M"
    with pytest.raises(SettingError, match="unknown quantization type 'Q7_K'"):
        preset_by_name("Q7_K")


def test_fit_row_follows_llama_cpp_fallback_table() -> None:
    assert fit_row("t", _T.Q4_K, 512) == (_T.Q4_K, None)
    for wanted, fallback in [(_T.Q2_K, _T.Q4_0), (_T.Q3_K, _T.Q4_0), (_T.Q4_K, _T.Q5_0),
                             (_T.Q5_K, _T.Q5_1), (_T.Q6_K, _T.Q8_0)]:
        new, note = fit_row("t", wanted, 576)
        assert new == fallback and note and wanted.name in note
    assert fit_row("t", _T.Q6_K, 48)[0] == _T.F16  # not even 32-weight blocks fit
    with pytest.raises(SettingError, match="no fallback"):
        fit_row("t", _T.Q8_0, 100)


def test_use_more_bits_layers() -> None:
    assert [i for i in range(30) if use_more_bits(i, 30)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert [i for i in range(18) if use_more_bits(i, 18)] == [0, 1, 4, 7, 10, 13, 15, 16, 17]


def test_categories_and_order() -> None:
    assert category("output.weight") == Category.OUTPUT
    assert category("token_embd.weight") == Category.TOKEN_EMBD
    assert category("blk.3.attn_v.weight") == Category.ATTN_V
    assert category("blk.3.attn_qkv.weight") == Category.ATTN_QKV
    assert category("blk.3.ffn_down_exps.weight") == Category.FFN_DOWN
    assert category("blk.3.attn_norm.weight") == Category.OTHER
    names = ["blk.10.a", "blk.2.b", "output_norm.weight", "blk.2.a", "token_embd.weight"]
    assert sorted(names, key=layer_sort_key) == ["output_norm.weight", "token_embd.weight", "blk.2.a", "blk.2.b", "blk.10.a"]


def _toy(untied: bool) -> dict[str, tuple[tuple[int, ...], GGMLType]]:
    t = {"token_embd.weight": ((512, 1000), _T.F16), "output_norm.weight": ((512,), _T.F32)}
    if untied:
        t["output.weight"] = ((512, 1000), _T.F16)
    for i in range(8):
        t[f"blk.{i}.attn_v.weight"] = ((512, 128), _T.F16)
        t[f"blk.{i}.ffn_down.weight"] = ((1024, 512), _T.F16)
        t[f"blk.{i}.attn_output.weight"] = ((512, 512), _T.F16)
    return t


def test_untied_output_and_embeddings() -> None:
    shape = ModelShape("llama", n_layer=8, n_head=8, n_head_kv=2)
    tied = choose_types(_toy(False), shape, preset_by_name("Q4_K_M"))
    assert tied["token_embd.weight"].new == _T.Q6_K  # shares the output's type
    untied = choose_types(_toy(True), shape, preset_by_name("Q4_K_M"))
    assert untied["output.weight"].new == _T.Q6_K
    assert untied["token_embd.weight"].new == _T.Q4_K
    assert untied["output_norm.weight"].new == _T.F32


def test_rules_without_a_preset_change_only_matching_tensors() -> None:
    shape = ModelShape("llama", n_layer=8, n_head=8, n_head_kv=2)
    got = choose_types(_toy(False), shape, None, parse_rules(["attn_v=Q8_0", "ffn_down=Q4_K", ".*=Q2_K"]))
    assert got["blk.0.attn_v.weight"].new == _T.Q8_0
    assert got["blk.0.ffn_down.weight"].new == _T.Q4_K
    assert got["blk.0.attn_output.weight"].new == _T.Q2_K
    assert got["output_norm.weight"].new == _T.F32  # never quantized, whatever the rules say
    assert all(c.reason.startswith(("rule", "1-D")) for c in got.values())
    kept = choose_types(_toy(False), shape, None, parse_rules(["nothing_matches=Q8_0"]))
    assert all(c.new == c.old for c in kept.values())


def test_float_presets_ignore_rules_as_llama_cpp() -> None:
    shape = ModelShape("llama", n_layer=8, n_head=8, n_head_kv=2)
    got = choose_types(_toy(False), shape, preset_by_name("F16"), parse_rules(["attn_v=Q8_0"]))
    assert {c.new for n, c in got.items() if n != "output_norm.weight"} == {_T.F16}


def test_gqa_decides_q2_k_attn_v() -> None:
    toy = _toy(False)
    low = choose_types(toy, ModelShape("llama", 8, 8, 4), preset_by_name("Q2_K"))
    high = choose_types(toy, ModelShape("llama", 8, 8, 2), preset_by_name("Q2_K"))
    assert low["blk.0.attn_v.weight"].new == _T.Q3_K
    assert high["blk.0.attn_v.weight"].new == _T.Q4_K
