"""REGEX=TYPE rules: parsing, clear errors, which rule wins, and which tensors llama.cpp quantizes at all."""
from __future__ import annotations

import pytest

from engine.errors import LensError, SettingError
from engine.quant.rules import keep_reason, match_rule, n_dims, parse_rule, parse_rules, quantizable
from engine.quant.types import GGMLType


def test_parse_rule() -> None:
    rule = parse_rule(r"blk\.[0-3]\.attn_v=Q8_0")
    assert rule.pattern == r"blk\.[0-3]\.attn_v"
    assert rule.qtype == GGMLType.Q8_0
    assert str(rule) == r"blk\.[0-3]\.attn_v=Q8_0"
    assert rule.matches("blk.2.attn_v.weight")
    assert not rule.matches("blk.4.attn_v.weight")


def test_type_is_case_insensitive_and_pattern_lowercased_as_llama_quantize() -> None:
    rule = parse_rule("ATTN_V=q4_k")
    assert rule.pattern == "attn_v"
    assert rule.qtype == GGMLType.Q4_K
    assert rule.matches("blk.0.attn_v.weight")


def test_splits_at_the_last_equals_sign() -> None:
    rule = parse_rule("a=b=F16")
    assert rule.pattern == "a=b"
    assert rule.qtype == GGMLType.F16


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("attn_v", "REGEX=TYPE"),
        ("=Q8_0", "no tensor name pattern"),
        ("attn_v=", "no type after"),
        ("attn_v=Q9_9", "'Q9_9' is not a ggml type"),
        ("attn_v=IQ3_S", "cannot quantize to it"),
        ("attn_v=Q8_K", "cannot quantize to it"),
        ("blk.[0-=Q8_0", "not a valid regex"),
        ("(attn=Q4_0", "not a valid regex"),
    ],
)
def test_bad_rules_say_what_is_wrong(text: str, needle: str) -> None:
    with pytest.raises(SettingError) as err:
        parse_rule(text)
    message = str(err.value)
    assert needle in message
    assert "\n" not in message
    assert isinstance(err.value, LensError)


def test_first_matching_rule_wins_as_in_llama_cpp() -> None:
    # llama_tensor_get_type stops at the first pattern that matches (checked against
    # llama-quantize in tests/fixtures/quantize_presets.json, case q4km_first_match)
    rules = parse_rules([r"blk\.1\.=Q2_K", "attn_v=Q5_K"])
    assert match_rule(rules, "blk.1.attn_v.weight").qtype == GGMLType.Q2_K
    assert match_rule(rules, "blk.2.attn_v.weight").qtype == GGMLType.Q5_K
    assert match_rule(rules, "blk.2.attn_q.weight") is None
    assert match_rule((), "blk.2.attn_q.weight") is None


def test_rules_search_anywhere_in_the_name() -> None:
    rules = parse_rules(["attn=Q4_0"])
    assert match_rule(rules, "blk.0.attn_q.weight") is not None
    assert match_rule(parse_rules(["^attn=Q4_0"]), "blk.0.attn_q.weight") is None


def test_parse_rules_keeps_order_and_accepts_parsed_rules() -> None:
    first = parse_rule("ffn=Q4_K")
    rules = parse_rules([first, "attn=Q8_0"])
    assert [str(r) for r in rules] == ["ffn=Q4_K", "attn=Q8_0"]


@pytest.mark.parametrize(
    ("name", "shape", "ok"),
    [
        ("blk.0.attn_q.weight", (576, 576), True),
        ("blk.0.ffn_down.weight", (1536, 576), True),
        ("token_embd.weight", (576, 49152), True),
        ("output.weight", (576, 49152), True),
        ("blk.0.ffn_down_exps.weight", (64, 32, 8), True),
        ("blk.0.attn_norm.weight", (576,), False),
        ("blk.0.attn_q_norm.weight", (256,), False),
        ("output_norm.weight", (576,), False),
        ("rope_freqs.weight", (32,), False),
        ("blk.0.attn_q.weight", (576, 1), False),  # ggml_n_dims ignores trailing 1s
        ("blk.0.attn_q.bias", (576, 4), False),
        ("blk.0.ffn_gate_inp.weight", (576, 8), False),
        ("position_embd.weight", (768, 1024), False),
        ("token_types.weight", (768, 2), False),
        ("blk.0.ssm_conv1d.weight", (4, 1536), False),
        ("blk.0.time_mix_w1.weight", (64, 64), False),
    ],
)
def test_quantizable_as_llama_cpp(name: str, shape: tuple[int, ...], ok: bool) -> None:
    assert quantizable(name, shape) is ok
    assert (keep_reason(name, shape) is None) is ok


def test_keep_reason_explains() -> None:
    assert keep_reason("blk.0.attn_norm.weight", (576,)) == "1-D, kept as is"
    assert "norm" in keep_reason("blk.0.attn_norm.weight", (576, 2))  # type: ignore[operator]


def test_n_dims() -> None:
    assert n_dims((576,)) == 1
    assert n_dims((576, 1)) == 1
    assert n_dims((576, 1, 1)) == 1
    assert n_dims((576, 3, 1)) == 2
    assert n_dims((1, 576)) == 2
