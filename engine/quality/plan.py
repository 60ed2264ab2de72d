"""A requantization plan: the type every tensor of a file gets under a preset and rules, with sizes and reasons.

make_plan chooses the types as llama-quantize does (engine.quant.presets); nothing is quantized here.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.gguf import GGUFFile
from engine.quant.presets import ModelShape, Preset, choose_types, preset_by_name
from engine.quant.rules import Rule, parse_rules
from engine.quant.types import TYPES, GGMLType


@dataclass(frozen=True)
class TensorPlan:
    """One tensor's change: its type now and after, why, and the sizes."""

    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    old: GGMLType
    new: GGMLType
    reason: str
    fallback: bool  # the wanted type did not fit the row; `new` is llama.cpp's fallback

    @property
    def changed(self) -> bool:
        return self.old != self.new

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def old_bytes(self) -> int:
        return _nbytes(self.old, self.shape)

    @property
    def new_bytes(self) -> int:
        return _nbytes(self.new, self.shape)

    @property
    def old_bpw(self) -> float:
        return TYPES[self.old].bits_per_weight

    @property
    def new_bpw(self) -> float:
        return TYPES[self.new].bits_per_weight

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "shape": list(self.shape), "old": self.old.name, "new": self.new.name,
            "reason": self.reason, "fallback": self.fallback, "old_bytes": self.old_bytes,
            "new_bytes": self.new_bytes, "old_bpw": self.old_bpw, "new_bpw": self.new_bpw,
        }


def _nbytes(qtype: GGMLType, shape: tuple[int, ...]) -> int:
    return math.prod(shape[1:]) * TYPES[qtype].row_bytes(shape[0])


def _bpw(nbytes: int, n: int) -> float:
    return 8.0 * nbytes / n if n else 0.0


@dataclass(frozen=True)
class Plan:
    """The type of every tensor of a file under a preset and rules, in llama.cpp's tensor order."""

    preset: Preset | None  # None: the file's types stay, only rules change tensors
    rules: tuple[Rule, ...]
    tensors: dict[str, TensorPlan]

    @property
    def file_type(self) -> int | None:
        """general.file_type to write (the preset's llama_ftype), None to keep the file's."""
        return self.preset.ftype if self.preset is not None else None

    def types(self) -> dict[str, tuple[GGMLType, GGMLType, str]]:
        """{tensor name: (old type, new type, reason)}."""
        return {t.name: (t.old, t.new, t.reason) for t in self.tensors.values()}

    @property
    def changed(self) -> list[TensorPlan]:
        return [t for t in self.tensors.values() if t.changed]

    @property
    def fallbacks(self) -> list[TensorPlan]:
        return [t for t in self.tensors.values() if t.fallback]

    @property
    def n_elements(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())

    @property
    def old_bytes(self) -> int:
        return sum(t.old_bytes for t in self.tensors.values())

    @property
    def new_bytes(self) -> int:
        return sum(t.new_bytes for t in self.tensors.values())

    @property
    def old_bpw(self) -> float:
        return _bpw(self.old_bytes, self.n_elements)

    @property
    def new_bpw(self) -> float:
        return _bpw(self.new_bytes, self.n_elements)

    def label(self) -> str:
        """A short name for the plan: 'Q4_K_M', 'Q8_0 + attn_v=Q6_K', 'file + ffn_down=Q4_K'."""
        head = self.preset.name if self.preset is not None else "file"
        return " + ".join([head, *map(str, self.rules)])

    def summary(self) -> str:
        """One line: what changes and the size before and after."""
        return (
            f"{self.label()}: {len(self.changed)} of {len(self.tensors)} tensors change, "
            f"{self.old_bytes / 2**20:.1f} MiB -> {self.new_bytes / 2**20:.1f} MiB "
            f"({self.old_bpw:.2f} -> {self.new_bpw:.2f} bits per weight)"
            + (f", {len(self.fallbacks)} fell back to a type that fits their rows" if self.fallbacks else "")
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "label": self.label(), "preset": self.preset.name if self.preset else None,
            "file_type": self.file_type, "rules": [str(r) for r in self.rules],
            "old_bytes": self.old_bytes, "new_bytes": self.new_bytes,
            "old_bpw": self.old_bpw, "new_bpw": self.new_bpw, "n_changed": len(self.changed),
            "n_fallback": len(self.fallbacks), "tensors": [t.as_dict() for t in self.tensors.values()],
        }


def make_plan(
    gguf: GGUFFile, preset: str | Preset | None, rules: Sequence[str | Rule] = (), has_imatrix: bool = False
) -> Plan:
    """Choose every tensor's type as llama-quantize would (with an imatrix or not); SettingError for a bad preset or rule."""
    if isinstance(preset, str):
        preset = preset_by_name(preset)
    parsed = parse_rules(rules)
    shape = ModelShape.from_metadata(gguf.metadata)
    infos = gguf.tensors
    choices = choose_types({n: (t.shape, t.qtype) for n, t in infos.items()}, shape, preset, parsed, has_imatrix)
    tensors = {
        n: TensorPlan(n, tuple(infos[n].shape), c.old, c.new, c.reason, c.fallback) for n, c in choices.items()
    }
    return Plan(preset, parsed, tensors)
