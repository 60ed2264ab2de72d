"""The signature a reply carries: the model and its quantization, with the overrides applied when there are any."""
from __future__ import annotations

from app.data.overrides import OverrideSpec
from app.data.signature import reply_signature


def test_the_file_as_it_is_keeps_its_type() -> None:
    assert reply_signature("SmolLM2 · Q4_1", OverrideSpec()) == "SmolLM2 · Q4_1"


def test_rules_are_counted_and_the_first_named() -> None:
    one = reply_signature("SmolLM2 · Q4_1", OverrideSpec(None, ("attn_v=Q8_0",)))
    assert one == "SmolLM2 · Q4_1 + 1 override (attn_v=Q8_0)"
    three = reply_signature("SmolLM2 · Q4_1", OverrideSpec(None, ("attn_v=Q8_0", "ffn_down=Q6_K", r"blk\.0\..*=F16")))
    assert three == "SmolLM2 · Q4_1 + 3 overrides (attn_v=Q8_0, ffn_down=Q6_K, …)"


def test_a_preset_says_what_the_file_became() -> None:
    assert reply_signature("Gemma · Q4_K_M", OverrideSpec("Q2_K")) == "Gemma · Q4_K_M → Q2_K preset"
    both = reply_signature("Gemma · Q4_K_M", OverrideSpec("Q8_0", ("output=Q6_K",)))
    assert both == "Gemma · Q4_K_M → Q8_0 preset + 1 override (output=Q6_K)"
