"""Type overrides for the Quantization lens: a preset and REGEX=TYPE rules, previewed from a ModelRecord (no Qt).

The preview runs engine.quant.presets.choose_types (llama-quantize's choice of types) on the types and
shapes in the ModelRecord, so it is instant and needs no engine object on the GUI thread; the worker
plans again from the file itself when it applies the overrides (engine.requantize.Requantizer.plan).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from app.records.model import ModelRecord, TensorRow
from engine.quality.requantize import Plan, TensorPlan
from engine.quant.presets import ModelShape, Preset, choose_types, preset_by_name
from engine.quant.rules import RULE_TYPES, Rule, keep_reason, parse_rules
from engine.quant.types import TYPES, GGMLType

RULE_TYPE_NAMES: tuple[str, ...] = tuple(t.name for t in RULE_TYPES)
EVAL_TEXT_PATH = Path(__file__).resolve().parents[2] / "assets" / "eval_text.txt"
FALLBACK_EVAL_TEXT = (
    "The harbour was quiet in the early morning. A few boats rocked at their moorings, and the gulls waited on the "
    "wall for the first fishermen to come back with their catch. By nine the market opened, and the town woke up."
)


def eval_text() -> str:
    """The bundled evaluation text (assets/eval_text.txt), or a short built-in paragraph when it is missing."""
    try:
        text = EVAL_TEXT_PATH.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return FALLBACK_EVAL_TEXT
    return text or FALLBACK_EVAL_TEXT


@dataclass(frozen=True)
class OverrideSpec:
    """What the user asked for: a preset (None keeps the file's types) and rules, the first match winning."""

    preset: str | None = None
    rules: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.preset is None and not self.rules

    def label(self) -> str:
        """'file + attn_v=Q8_0', 'Q4_K_M', ... (as engine Plan.label)."""
        return " + ".join([self.preset or "file", *self.rules])

    def parsed(self) -> tuple[Preset | None, tuple[Rule, ...]]:
        """The preset and rules as engine objects; SettingError for a bad one."""
        return (preset_by_name(self.preset) if self.preset else None), parse_rules(self.rules)


def model_shape(record: ModelRecord) -> ModelShape:
    """The hyper-parameters the preset mixes look at, from a ModelRecord (no expert count: dense models)."""
    return ModelShape(arch=record.arch, n_layer=record.n_layers, n_head=record.n_heads, n_head_kv=record.n_kv_heads)


def _file_types(record: ModelRecord) -> dict[str, tuple[tuple[int, ...], GGMLType]]:
    out = {}
    for t in record.tensors:
        try:
            out[t.name] = (t.shape, GGMLType[t.type_name])
        except KeyError:
            continue  # a type this build does not know: it is never requantized
    return out


def preview_plan(record: ModelRecord, spec: OverrideSpec, has_imatrix: bool = False) -> Plan:
    """The plan the worker would apply (with an imatrix in use or not), computed from the record; SettingError for a
    bad preset or rule."""
    preset, rules = spec.parsed()
    tensors = _file_types(record)
    choices = choose_types(tensors, model_shape(record), preset, rules, has_imatrix)
    return Plan(preset, rules, {
        n: TensorPlan(n, tuple(tensors[n][0]), c.old, c.new, c.reason, c.fallback) for n, c in choices.items()
    })


def rule_counts(record: ModelRecord, rules: tuple[Rule, ...]) -> list[tuple[int, int]]:
    """For each rule: (tensors whose name it matches, of them the ones it decides: matched first and quantizable)."""
    matched = [0] * len(rules)
    decided = [0] * len(rules)
    for t in record.tensors:
        first = True
        for i, rule in enumerate(rules):
            if rule.matches(t.name):
                matched[i] += 1
                if first and keep_reason(t.name, t.shape) is None:
                    decided[i] += 1
                first = False
    return list(zip(matched, decided))


def layer_rule(layer: int | None, role: str | None, qtype: str) -> str:
    """A rule for one tensor role in one layer; None means every layer / every tensor of the layer."""
    if layer is None and role is None:
        return f".*={qtype}"
    if layer is None:
        return f"{re.escape(role)}\\.weight$={qtype}" if role else f".*={qtype}"
    if role is None:
        return f"^blk\\.{layer}\\.={qtype}"
    return f"^blk\\.{layer}\\.{re.escape(role)}\\.weight$={qtype}"


def global_rule(name: str, qtype: str) -> str:
    """A rule for one model-wide tensor by its full name (token_embd.weight, output.weight)."""
    return f"^{re.escape(name)}$={qtype}"


def with_types(record: ModelRecord, types: dict[str, GGMLType]) -> ModelRecord:
    """The record with some tensors' types (and bytes) replaced: what the model holds after Apply."""
    rows = []
    for t in record.tensors:
        new = types.get(t.name)
        if new is None or t.type_name == new.name:
            rows.append(t)
            continue
        info = TYPES[new]
        nbytes = info.row_bytes(t.shape[0]) * (t.n_elements // max(1, t.shape[0]))
        rows.append(dataclasses.replace(t, type_name=new.name, nbytes=nbytes, bpw=info.bits_per_weight))
    return dataclasses.replace(record, tensors=tuple(rows))


def role_choices(record: ModelRecord) -> tuple[list[str], list[TensorRow]]:
    """(per-layer roles that can be requantized, model-wide tensors that can), for the quick-add menus."""
    roles: dict[str, None] = {}
    globals_: list[TensorRow] = []
    for t in record.tensors:
        if keep_reason(t.name, t.shape) is not None:
            continue
        if t.layer is None:
            globals_.append(t)
        else:
            roles.setdefault(t.role, None)
    return list(roles), globals_


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def plan_summary(plan: Plan) -> str:
    """One line for the preview: tensors that change, size and bits per weight before and after."""
    fb = len(plan.fallbacks)
    return (f"{len(plan.changed)} of {len(plan.tensors)} tensors change · {mib(plan.old_bytes)} → {mib(plan.new_bytes)} · "
            f"{plan.old_bpw:.3f} → {plan.new_bpw:.3f} bits/weight"
            + (f" · {fb} fell back to a type that fits their rows" if fb else ""))
