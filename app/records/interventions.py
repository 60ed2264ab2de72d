"""What the Experiments tab sets on the chat's model (ablated heads, a control vector, a LoRA adapter) and the record
of what that does to the chat: the next-token distribution before and after, the KLD at every position."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class InterventionSpec:
    """The interventions asked for; empty strings / no heads: none of that kind."""

    heads: str = ""  # "3:4, 10:1" (LAYER:HEAD, comma separated)
    cvec_path: str = ""
    cvec_scale: float = 1.0
    lora_path: str = ""
    lora_scale: float = 1.0

    @property
    def empty(self) -> bool:
        return not (self.heads.strip() or self.cvec_path or self.lora_path)


@dataclass(frozen=True)
class InterventionRecord:
    """The interventions now on the model (described for the banner and the reply's signature) and their effect on the
    chat's tokens (empty arrays when the chat had none)."""

    description: str  # "ablated L3h4 · control vector calm.gguf x0.8 · LoRA style.gguf x1" ('' when cleared)
    kld: npt.NDArray[np.float64]  # (T,) KLD(before || after) of the next-token distribution at each chat position
    token_texts: tuple[str, ...]
    top_before: tuple[tuple[str, float], ...]  # the last position's top tokens and probabilities
    top_after: tuple[tuple[str, float], ...]
    elapsed_s: float

    @property
    def mean_kld(self) -> float:
        return float(self.kld.mean()) if self.kld.size else 0.0
