"""Why each tensor of a file has its type: the llama-quantize preset the file matches, tensor by tensor (no Qt).

A GGUF file does not record why a tensor got its type, but llama-quantize's choice is deterministic
(engine.quant.presets.choose_types): the preset whose choices agree with the most tensors of the file is
the one that made it, and its reason for each tensor is the answer ("Q4_K_M base type; 640 columns are not
a multiple of Q4_K's 256-wide super-block: Q4_K falls back to Q5_0, as llama.cpp does"). A tensor whose type
that preset would not give was set by a --tensor-type rule or another tool, and is said to be so.
"""
from __future__ import annotations

from dataclasses import dataclass

from app.data.overrides import OverrideSpec, preview_plan
from app.records.model import ModelRecord
from engine.errors import SettingError
from engine.quant.presets import PRESETS
from engine.quant.rules import keep_reason

UNQUANTIZED_PRESETS = ("F32", "F16", "BF16")  # they give every tensor one type: never the best explanation of a mix


@dataclass(frozen=True)
class TypeReasons:
    """The preset a file matches and, for every tensor, why it has its type."""

    preset: str | None  # the llama-quantize preset that explains the most tensors (None: none explains most)
    matched: int  # quantizable tensors whose file type is that preset's choice
    quantizable: int  # tensors llama-quantize may quantize at all
    reasons: dict[str, str]  # tensor name -> one sentence
    fallbacks: tuple[str, ...]  # tensors whose type is a fallback (the preset's type did not fit their rows)

    def why(self, name: str) -> str:
        return self.reasons.get(name, "")

    def summary(self) -> str:
        """One line: which preset made the file, and how many tensors fell back."""
        if self.preset is None:
            return "the file's types match no llama-quantize preset"
        n = len(self.fallbacks)
        fb = f" ({n} of them at the type it falls back to where a tensor's rows do not fit the preset's)" if n else ""
        if self.matched == self.quantizable:
            return f"made as llama-quantize's {self.preset}: each of the {self.quantizable} quantizable tensors has the " \
                   f"type it gives{fb}"
        return f"made as llama-quantize's {self.preset}: {self.matched} of {self.quantizable} quantizable tensors have " \
               f"the type it gives{fb}"


def explain_file_types(record: ModelRecord) -> TypeReasons:
    """Find the preset that made the file and give each tensor's reason (norms: why they are never quantized)."""
    quantizable = [t for t in record.tensors if keep_reason(t.name, t.shape) is None]
    best, best_plan, best_hits = None, None, 0
    for name in PRESETS:
        if name in UNQUANTIZED_PRESETS:
            continue
        try:
            plan = preview_plan(record, OverrideSpec(name))
        except SettingError:
            continue
        hits = sum(1 for t in quantizable if (tp := plan.tensors.get(t.name)) is not None and tp.new.name == t.type_name)
        if hits > best_hits:
            best, best_plan, best_hits = name, plan, hits
    if best_plan is None or 2 * best_hits < len(quantizable):
        best, best_plan = None, None
    reasons: dict[str, str] = {}
    fallbacks: list[str] = []
    for t in record.tensors:
        keep = keep_reason(t.name, t.shape)
        if keep is not None:
            reasons[t.name] = f"{keep}: llama-quantize never quantizes it"
            continue
        tp = best_plan.tensors.get(t.name) if best_plan is not None else None
        if tp is None:
            reasons[t.name] = "the file's type (it matches no llama-quantize preset)"
        elif tp.new.name == t.type_name:
            reasons[t.name] = f"as llama-quantize's {best} chooses: {tp.reason.removeprefix(f'{best}: ')}"
            if tp.fallback:
                fallbacks.append(t.name)
        else:
            reasons[t.name] = (f"not {best}'s choice ({tp.new.name}): a --tensor-type rule or another tool set "
                               f"{t.type_name}")
    return TypeReasons(best, best_hits, len(quantizable), reasons, tuple(fallbacks))


def plan_reasons(record: ModelRecord, spec: OverrideSpec) -> dict[str, str]:
    """The reason of each tensor that overrides applied in memory changed (the file's record, the applied spec)."""
    try:
        plan = preview_plan(record, spec)
    except SettingError:
        return {}
    return {n: f"applied in memory ({spec.label()}): {tp.reason}" for n, tp in plan.tensors.items() if tp.new != tp.old}
