"""Tensor-type rules (`REGEX=TYPE`, llama-quantize's --tensor-type) and which tensors may be quantized at all.

Rules are matched against GGUF tensor names with `re.search`, in the order given, and the first
rule that matches decides the type: this is what llama_tensor_get_type in llama.cpp's
src/llama-quant.cpp does (it stops at the first match), checked against llama-quantize's output
in tests/fixtures/quantize_presets.json. As llama-quantize's parse_tensor_type, the pattern is
lowercased and the type name is case-insensitive.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..errors import SettingError
from .types import GGMLType

# the types a rule may ask for: those GGUF Lens can quantize to (engine.quant.QUANTIZERS)
RULE_TYPES: tuple[GGMLType, ...] = (
    GGMLType.F32, GGMLType.F16, GGMLType.BF16,
    GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
    GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
    GGMLType.IQ4_NL, GGMLType.IQ4_XS,
)


@dataclass(frozen=True)
class Rule:
    """One `REGEX=TYPE` rule: tensors whose name matches `pattern` are stored as `qtype`."""

    pattern: str
    qtype: GGMLType
    regex: re.Pattern[str] = field(compare=False, repr=False)

    def matches(self, name: str) -> bool:
        """True when the pattern is found anywhere in the tensor name (std::regex_search)."""
        return self.regex.search(name) is not None

    def __str__(self) -> str:
        return f"{self.pattern}={self.qtype.name}"


def parse_type(text: str, what: str = "type") -> GGMLType:
    """A ggml type name GGUF Lens can quantize to (case-insensitive), or SettingError naming the choices."""
    name = text.strip().upper()
    try:
        qtype = GGMLType[name]
    except KeyError:
        raise SettingError(
            f"{what} {text!r} is not a ggml type; use one of {', '.join(t.name for t in RULE_TYPES)}"
        ) from None
    if qtype not in RULE_TYPES:
        raise SettingError(
            f"{what} {qtype.name}: GGUF Lens cannot quantize to it; use one of {', '.join(t.name for t in RULE_TYPES)}"
        )
    return qtype


def parse_rule(text: str) -> Rule:
    """Parse `REGEX=TYPE` (split at the last '=') into a Rule; SettingError for a bad regex or type."""
    pattern, sep, type_name = text.rpartition("=")
    if not sep:
        raise SettingError(f"tensor type rule {text!r} must look like REGEX=TYPE, e.g. 'attn_v=Q8_0'")
    if not pattern:
        raise SettingError(f"tensor type rule {text!r} has no tensor name pattern before '='")
    if not type_name.strip():
        raise SettingError(f"tensor type rule {text!r} has no type after '='")
    qtype = parse_type(type_name, what=f"tensor type rule {text!r}: type")
    pattern = pattern.lower()  # as llama-quantize's parse_tensor_type
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise SettingError(f"tensor type rule {text!r}: {pattern!r} is not a valid regex ({exc})") from None
    return Rule(pattern, qtype, regex)


def parse_rules(texts: Iterable[str | Rule]) -> tuple[Rule, ...]:
    """Parse several rules, keeping their order (it decides which one wins)."""
    return tuple(t if isinstance(t, Rule) else parse_rule(t) for t in texts)


def match_rule(rules: Sequence[Rule], name: str) -> Rule | None:
    """The rule that decides `name`'s type: the first one that matches, as llama.cpp; None if none does."""
    for rule in rules:
        if rule.matches(name):
            return rule
    return None


# --- which tensors llama.cpp quantizes at all (tensor_allows_quantization in llama-quant.cpp) ---

# names containing any of these stay as they are: small or sensitive tensors of various architectures
_KEEP_SUBSTRINGS: tuple[tuple[str, str], ...] = (
    ("_norm.weight", "a norm"),
    ("ffn_gate_inp.weight", "an expert router"),
    ("ffn_gate_tid2eid.weight", "an expert routing table"),
    ("altup", "a small AltUp tensor"),
    ("laurel", "a small LAuReL tensor"),
    ("per_layer_model_proj", "a small projection"),
    ("ssm_conv1d", "a small conv1d"),
    ("shortconv.conv.weight", "a small conv"),
    ("indexer.k_proj.weight", "a small indexer projection"),
    ("indexer.q_proj.weight", "a small indexer projection"),
    ("attn_rel_b.weight", "a relative position bias"),
    (".position_embd", "a positional embedding"),
    ("sam.pos_embd", "a positional embedding"),
    ("sam.neck.", "a vision tensor"),
    ("sam.net_", "a vision tensor"),
    (".rel_pos", "a positional tensor"),
    (".patch_embd", "a patch embedding"),
    (".patch_merger", "a patch merger"),
    ("a.rvq.codebook", "an audio codebook"),
    ("mm.a.code_embd", "an audio codebook"),
) + tuple(
    (f"time_mix_{part}.weight", "a small RWKV tensor")
    for part in ("first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1", "a2", "g1", "g2",
                 "decay_w1", "decay_w2", "lerp_fused")
)
_KEEP_NAMES: dict[str, str] = {
    "position_embd.weight": "a positional embedding",
    "token_types.weight": "a token-type embedding",
}


def n_dims(shape: Sequence[int]) -> int:
    """Dimensions as ggml_n_dims counts them: trailing 1s do not count, and a scalar has one."""
    n = len(shape)
    while n > 1 and shape[n - 1] == 1:
        n -= 1
    return max(n, 1)


def keep_reason(name: str, shape: Sequence[int]) -> str | None:
    """Why llama-quantize leaves this tensor's type alone (None when it may be quantized)."""
    if n_dims(shape) < 2:
        return "1-D, kept as is"
    if not name.endswith("weight"):
        return "not a weight, kept as is"
    if name in _KEEP_NAMES:
        return f"{_KEEP_NAMES[name]}, kept as is"
    for part, what in _KEEP_SUBSTRINGS:
        if part in name:
            return f"{what}, kept as is"
    return None


def quantizable(name: str, shape: Sequence[int]) -> bool:
    """True when llama-quantize would give this tensor a new type (2-D+ weights that are not norms etc.)."""
    return keep_reason(name, shape) is None

