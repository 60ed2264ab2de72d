"""What a reply is signed with: the model and the quantization that wrote it, overrides included (no Qt).

"SmolLM2 135M · Q4_1" for the file as it is; "SmolLM2 135M · Q4_1 + 3 overrides (attn_v=Q8_0, …)" after
per-tensor rules were applied in the Quantization lens; "… · Q4_1 → Q2_K preset" after a whole preset.
"""
from __future__ import annotations

from app.data.overrides import OverrideSpec

LISTED_RULES = 2  # rules named in the signature; the rest are counted


def reply_signature(model_label: str, spec: OverrideSpec) -> str:
    """The model label ('name · file type') with the overrides the chat's model holds now (empty: the file's)."""
    if spec.empty:
        return model_label
    parts = [model_label + (f" → {spec.preset} preset" if spec.preset else "")]
    if spec.rules:
        n = len(spec.rules)
        named = ", ".join(spec.rules[:LISTED_RULES]) + (", …" if n > LISTED_RULES else "")
        parts.append(f"{n} override{'s' if n > 1 else ''} ({named})")
    return " + ".join(parts)
