"""llama-quantize's presets (Q4_K_M, Q8_0, ...): which type every tensor of a model gets.

The logic follows llama_tensor_get_type in llama.cpp's src/llama-quant.cpp for the non-IQ
presets: a preset has a base type, and some tensors get more bits (the output matrix and tied
embeddings, attn_v and ffn_down in some layers, attn_output in the Q2/Q3 mixes). Rules
(`REGEX=TYPE`) replace that choice for the tensors they match. A type whose blocks do not fit
the row (576 weights is not a multiple of 256) falls back to one that does, as
tensor_type_fallback does. Tests compare every tensor with llama-quantize's own output.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..errors import SettingError
from .rules import Rule, keep_reason, match_rule
from .types import TYPES, GGMLType

_T = GGMLType


@dataclass(frozen=True)
class Preset:
    """One llama-quantize file type: its llama_ftype id (general.file_type) and base tensor type."""

    name: str
    ftype: int
    base: GGMLType


# llama_ftype ids from enum llama_ftype in llama.h, base types from llama_ftype_get_default_type
PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset("F32", 0, _T.F32),
        Preset("F16", 1, _T.F16),
        Preset("BF16", 32, _T.BF16),
        Preset("Q8_0", 7, _T.Q8_0),
        Preset("Q6_K", 18, _T.Q6_K),
        Preset("Q5_1", 9, _T.Q5_1),
        Preset("Q5_0", 8, _T.Q5_0),
        Preset("Q5_K_M", 17, _T.Q5_K),
        Preset("Q5_K_S", 16, _T.Q5_K),
        Preset("Q4_1", 3, _T.Q4_1),
        Preset("Q4_0", 2, _T.Q4_0),
        Preset("Q4_K_M", 15, _T.Q4_K),
        Preset("Q4_K_S", 14, _T.Q4_K),
        Preset("Q3_K_L", 13, _T.Q3_K),
        Preset("Q3_K_M", 12, _T.Q3_K),
        Preset("Q3_K_S", 11, _T.Q3_K),
        Preset("Q2_K", 10, _T.Q2_K),
        Preset("IQ4_NL", 25, _T.IQ4_NL),
        Preset("IQ4_XS", 30, _T.IQ4_XS),
        Preset("MXFP4_MOE", 38, _T.MXFP4),
    )
}
# llama-quantize accepts these short names for the _M mixes
ALIASES: dict[str, str] = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
FTYPE_NAMES: dict[int, str] = {p.ftype: p.name for p in PRESETS.values()}

# tensor_type_fallback: a 256-weight type that does not fit the row becomes a 32-weight one
FALLBACK: dict[GGMLType, GGMLType] = {
    _T.Q2_K: _T.Q4_0,
    _T.Q3_K: _T.Q4_0,
    _T.Q4_K: _T.Q5_0,
    _T.Q5_K: _T.Q5_1,
    _T.Q6_K: _T.Q8_0,
    _T.IQ4_XS: _T.IQ4_NL,
}


def preset_by_name(name: str) -> Preset:
    """The preset called `name` (case-insensitive; Q4_K means Q4_K_M), or SettingError listing them."""
    key = name.strip().upper()
    key = ALIASES.get(key, key)
    if key not in PRESETS:
        raise SettingError(f"unknown quantization type {name!r}; use one of {', '.join(PRESETS)}")
    return PRESETS[key]


class Category(Enum):
    """The broad tensor roles llama_tensor_get_type tells apart (tensor_get_category)."""

    TOKEN_EMBD = "token_embd"
    OUTPUT = "output"
    ATTN_V = "attn_v"  # attn_v, and the fused attn_qkv / attn_kv_b that contain V
    ATTN_QKV = "attn_qkv"
    ATTN_K = "attn_k"
    ATTN_Q = "attn_q"
    ATTN_OUTPUT = "attn_output"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    OTHER = "other"


# (substring of the tensor name, category), the first that is found wins
_CATEGORY_BY_SUBSTRING: tuple[tuple[str, Category], ...] = (
    ("attn_qkv.weight", Category.ATTN_QKV),
    ("attn_kv_b.weight", Category.ATTN_V),
    ("attn_v.weight", Category.ATTN_V),
    ("attn_k.weight", Category.ATTN_K),
    ("attn_q.weight", Category.ATTN_Q),
    ("attn_output.weight", Category.ATTN_OUTPUT),
    ("ffn_up", Category.FFN_UP),
    ("ffn_gate", Category.FFN_GATE),
    ("ffn_down", Category.FFN_DOWN),
)


def category(name: str) -> Category:
    """The role of a tensor, from its GGUF name."""
    if name == "output.weight":
        return Category.OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return Category.TOKEN_EMBD
    for part, cat in _CATEGORY_BY_SUBSTRING:
        if part in name:
            return cat
    return Category.OTHER


def _counts_as_attn_v(cat: Category) -> bool:
    return cat in (Category.ATTN_V, Category.ATTN_QKV)


@dataclass(frozen=True)
class ModelShape:
    """The hyper-parameters llama_tensor_get_type looks at."""

    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        """Query heads per KV head (0 when the model has no KV heads), as hparams.n_gqa()."""
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        """llama with 80 layers and grouped-query attention: llama.cpp's LLM_TYPE_70B."""
        return self.arch == "llama" and self.n_layer == 80 and self.n_head != self.n_head_kv

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> ModelShape:
        """Read `{arch}.block_count`, head counts and expert count from GGUF metadata."""
        arch = md.get("general.architecture")
        if not isinstance(arch, str):
            raise SettingError("general.architecture is missing; cannot choose quantization types")

        def first_int(key: str, default: int) -> int:
            v = md.get(f"{arch}.{key}", default)
            if hasattr(v, "__len__") and not isinstance(v, str):  # per-layer arrays: layer 0, as n_head(0)
                v = v[0] if len(v) else default
            return int(v)

        n_head = first_int("attention.head_count", 0)
        return cls(
            arch=arch,
            n_layer=first_int("block_count", 0),
            n_head=n_head,
            n_head_kv=first_int("attention.head_count_kv", n_head),
            n_expert=first_int("expert_count", 0),
        )


@dataclass(frozen=True)
class TypeChoice:
    """The type one tensor gets and why."""

    name: str
    old: GGMLType
    new: GGMLType
    reason: str
    fallback: bool = False  # the wanted type did not fit the row and was replaced


def _use_more_bits(i_layer: int, n_layers: int) -> bool:
    """The layers llama.cpp's mixes give more bits: the first and last eighth, and every third between."""
    eighth = n_layers // 8
    return i_layer < eighth or i_layer >= 7 * n_layers // 8 or (i_layer - eighth) % 3 == 2


def layer_sort_key(name: str) -> tuple[int, str]:
    """llama.cpp's weight_name_comparer: tensors outside blocks first, then by block number, then by name."""
    m = re.match(r"blk\.(\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


class _MixState:
    """The counters llama_tensor_get_type keeps while it walks the tensors in order."""

    def __init__(self, shape: ModelShape, names: Sequence[str], has_imatrix: bool = False):
        self.shape = shape
        self.has_imatrix = has_imatrix  # qs.has_imatrix: llama-quantize was given an importance matrix
        self.tied = "output.weight" not in names
        self.n_attn_v = sum(_counts_as_attn_v(category(n)) for n in names)
        self.i_attn_v = 0
        self.i_ffn_down = 0

    def _layer(self, counter: int, name: str) -> int:
        if self.shape.n_expert > 1:  # expert tensors are not in layer order: read the layer from the name
            m = re.match(r"blk\.(\d+)\.", name)
            if m is None:
                raise SettingError(f"cannot tell the layer of tensor {name!r}")
            return int(m.group(1))
        return counter

    def choose(self, preset: str, base: GGMLType, name: str, cat: Category, n_cols: int, n_mats: int = 1,
               ) -> tuple[GGMLType, str]:
        """The mix's type for one tensor (before the row-size fallback), and the reason; `n_mats` is the tensor's
        third dimension (the experts of a Mixture-of-Experts weight)."""
        s = self.shape
        falcon = s.arch == "falcon"
        if preset == "MXFP4_MOE":  # the experts' 3-D tensors in MXFP4, every other matrix Q8_0
            if n_mats > 1 and cat not in (Category.OUTPUT, Category.TOKEN_EMBD):
                return _T.MXFP4, f"{preset}: an experts tensor gets MXFP4"
            return _T.Q8_0, f"{preset}: a tensor outside the experts gets Q8_0"
        if cat == Category.OUTPUT or (self.tied and cat == Category.TOKEN_EMBD):
            what = "output" if cat == Category.OUTPUT else "tied embeddings/output"
            if falcon or n_cols % TYPES[base].block_size:
                return _T.Q8_0, f"{preset}: {what} get Q8_0"
            if base != _T.Q8_0:
                return _T.Q6_K, f"{preset}: {what} get Q6_K"
            return base, f"{preset}: {what}"
        if cat == Category.TOKEN_EMBD:
            return base, f"{preset} base type"
        if _counts_as_attn_v(cat):
            i, n = self.i_attn_v, self.n_attn_v
            self.i_attn_v += 1
            new = _attn_v_type(preset, base, i, n, s)
            if new != base:
                return new, f"{preset}: attn_v #{i} of {n} gets {new.name}"
            return base, f"{preset} base type"
        if cat == Category.FFN_DOWN:
            i = self._layer(self.i_ffn_down, name)
            self.i_ffn_down += 1
            new = _ffn_down_type(preset, base, i, s.n_layer, falcon, self.has_imatrix)
            if new != base:
                return new, f"{preset}: ffn_down #{i} of {s.n_layer} gets {new.name}"
            return base, f"{preset} base type"
        if cat == Category.ATTN_K and s.n_expert == 8:
            return _T.Q8_0, f"{preset}: attn_k of an 8-expert model gets Q8_0"
        if cat == Category.ATTN_OUTPUT:
            new = _attn_output_type(preset, base, s, falcon)
            if new != base:
                return new, f"{preset}: attn_output gets {new.name}"
        if cat == Category.ATTN_QKV:
            new = {"Q3_K_M": _T.Q4_K, "Q3_K_L": _T.Q4_K, "Q4_K_M": _T.Q5_K, "Q5_K_M": _T.Q6_K}.get(preset, base)
            if new != base:
                return new, f"{preset}: attn_qkv gets {new.name}"
        return base, f"{preset} base type"


def _attn_v_type(preset: str, base: GGMLType, i: int, n: int, s: ModelShape) -> GGMLType:
    new = base
    if preset == "Q2_K":
        new = _T.Q4_K if s.n_gqa >= 4 else _T.Q3_K
    elif preset == "Q3_K_M":
        new = _T.Q5_K if i < 2 else _T.Q4_K
    elif preset == "Q3_K_L":
        new = _T.Q5_K
    elif preset in ("Q4_K_M", "Q5_K_M") and _use_more_bits(i, n):
        new = _T.Q6_K
    elif (preset == "Q4_K_S" and i < 4) or (preset in ("IQ4_NL", "IQ4_XS") and s.n_gqa >= 4):
        new = _T.Q5_K
    if s.is_70b and new in (_T.Q3_K, _T.Q4_K):  # V is 8x smaller than Q in the 70B: cheap to widen
        new = _T.Q5_K
    if s.n_expert == 8:
        new = _T.Q8_0
    return new


def _ffn_down_type(preset: str, base: GGMLType, i: int, n: int, falcon: bool, has_imatrix: bool = False) -> GGMLType:
    more = _use_more_bits(i, n)
    if preset == "Q2_K":
        return _T.Q3_K
    if preset == "Q3_K_M":
        if i < n // 16:
            return _T.Q5_K
        return _T.Q4_K if not falcon or more else _T.Q3_K
    if preset == "Q3_K_L":
        return _T.Q4_K if falcon else _T.Q5_K
    if preset == "Q4_K_M":
        if falcon:
            return _T.Q6_K if i < n // 16 else _T.Q5_K if more else _T.Q4_K
        return _T.Q6_K if more else base
    if preset == "Q5_K_M" and more:
        return _T.Q6_K
    if preset == "Q4_K_S" and not falcon and i < n // 8:
        return _T.Q5_K
    if preset in ("IQ4_NL", "IQ4_XS") and i < n // 8 and not has_imatrix:
        return _T.Q5_K
    if preset in ("Q4_0", "Q5_0") and has_imatrix and i < n // 8:  # guard the first ffn_down layers
        return _T.Q4_1 if preset == "Q4_0" else _T.Q5_1
    return base


def _attn_output_type(preset: str, base: GGMLType, s: ModelShape, falcon: bool) -> GGMLType:
    if falcon:
        return _T.Q4_K if preset == "Q3_K_L" else base
    if s.n_expert == 8:
        return _T.Q5_K if preset in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M", "IQ4_NL", "IQ4_XS") else base
    return {"Q2_K": _T.Q3_K, "Q3_K_M": _T.Q4_K, "Q3_K_L": _T.Q5_K}.get(preset, base)


def fit_row(name: str, qtype: GGMLType, n_cols: int) -> tuple[GGMLType, str | None]:
    """`qtype`, or the type llama.cpp falls back to when its blocks do not divide the row; with a note."""
    block = TYPES[qtype].block_size
    if n_cols % block == 0:
        return qtype, None
    new = FALLBACK.get(qtype)
    if new is None:
        raise SettingError(
            f"{name}: row size {n_cols} is not a multiple of {qtype.name} block size {block}, "
            "and llama.cpp has no fallback for that type"
        )
    first = new
    if n_cols % TYPES[new].block_size:
        new = _T.F16
    also = f" (its {TYPES[first].block_size}-wide blocks do not fit either)" if new != first else ""
    return new, (f"{n_cols} columns are not a multiple of {qtype.name}'s {block}-wide super-block: "
                 f"{qtype.name} falls back to {new.name}{also}, as llama.cpp does")


def choose_types(
    tensors: Mapping[str, tuple[Sequence[int], GGMLType]],
    shape: ModelShape,
    preset: Preset | None,
    rules: Sequence[Rule] = (),
    has_imatrix: bool = False,
) -> dict[str, TypeChoice]:
    """The type of every tensor ({name: (shape, type)}) under a preset and rules, in llama.cpp's order.

    `has_imatrix`: an importance matrix is given, which changes a few choices (ffn_down of Q4_0, Q5_0, IQ4_*).
    With preset None the file's own types stay and only the rules change tensors (with the same
    row-size fallback), which is how the app tries a rule on a model as it is.
    """
    names = sorted(tensors, key=layer_sort_key)
    mix = _MixState(shape, names, has_imatrix)
    out: dict[str, TypeChoice] = {}
    for name in names:
        dims, old = tensors[name]
        old, n_cols = GGMLType(old), int(dims[0])
        keep = keep_reason(name, dims)
        if keep is not None:
            out[name] = TypeChoice(name, old, old, keep)
            continue
        if preset is not None and TYPES[preset.base].block_size == 1:
            # an unquantized base type (F16, BF16, F32): llama.cpp applies neither rules nor the mix
            out[name] = TypeChoice(name, old, preset.base, f"{preset.name} base type")
            continue
        rule = match_rule(rules, name)
        if rule is not None:
            wanted, reason = rule.qtype, f"rule {rule}"
        elif preset is not None:
            n_mats = int(dims[2]) if len(dims) > 2 else 1
            wanted, reason = mix.choose(preset.name, preset.base, name, category(name), n_cols, n_mats)
        else:
            out[name] = TypeChoice(name, old, old, "kept")
            continue
        new, note = fit_row(name, wanted, n_cols)
        if note:
            reason = f"{reason}; {note}"
        out[name] = TypeChoice(name, old, new, reason, note is not None)
    return out
