"""What the Experiments tab sets on the chat's model (ablations, a control vector, a LoRA adapter) and the record
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
    heads_mean: bool = False  # the heads output their mean over the chat instead of zero
    attn_layers: str = ""  # "2, 5": layers whose attention output is left out
    ffn_layers: str = ""  # layers whose FFN output is left out
    experts: str = ""  # "9:12" (LAYER:EXPERT): experts the router may not choose

    @property
    def empty(self) -> bool:
        return not (self.heads.strip() or self.attn_layers.strip() or self.ffn_layers.strip() or self.experts.strip()
                    or self.cvec_path or self.lora_path)

    @staticmethod
    def items(text: str) -> list[str]:
        """A field's comma-separated items, blanks dropped."""
        return [t for t in (p.strip() for p in text.split(",")) if t]


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
