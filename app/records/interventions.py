"""What the Experiments tab sets on the chat's model (ablations, a control vector, a LoRA adapter) and the record
of what that does to the chat: the next-token distribution before and after, the KLD at every position."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
class LoadedAdapter:
    """An adapter file the Experiments tab has on the model (Compare offers it as B without asking for the file)."""

    kind: str  # 'lora' | 'cvec'
    path: str
    scale: float

    @property
    def label(self) -> str:
        """'LoRA style.gguf x1' or 'control vector calm.gguf x0.8', as the replies' signature names them."""
        what = "LoRA" if self.kind == "lora" else "control vector"
        return f"{what} {Path(self.path).name} x{self.scale:g}"


@dataclass(frozen=True)
class InterventionRecord:
    """The interventions now on the model (described for the banner and the reply's signature) and their effect on the
    chat's tokens: the model as it was before Apply (or Clear) against the model as it is after, on the same tokens
    (empty arrays when the chat had none, or the measurement was stopped: `note` says so)."""

    description: str  # "ablated L3h4 · control vector calm.gguf x0.8 · LoRA style.gguf x1" ('' when cleared)
    kld: npt.NDArray[np.float64]  # (T,) KLD(before || after) of the next-token distribution at each chat position
    token_texts: tuple[str, ...]
    top_before: tuple[tuple[str, float], ...]  # the last position's top tokens and probabilities
    top_after: tuple[tuple[str, float], ...]
    elapsed_s: float
    before: str = ""  # what was on before ('' : the model as its file says)
    adapters: tuple[LoadedAdapter, ...] = ()  # the adapter files now on the model
    note: str = ""  # why the effect is not shown: the measurement was stopped or failed (what was asked is set)
    tag: tuple[object, ...] = ()  # what the asker tagged the request with (the chat and model it was for)

    @property
    def mean_kld(self) -> float:
        return float(self.kld.mean()) if self.kld.size else 0.0

    @property
    def next_kld(self) -> float:
        """KLD(before || after) of the next token after the chat (natural log, as llama.cpp's KLD)."""
        return float(self.kld[-1]) if self.kld.size else 0.0

    @property
    def measured(self) -> bool:
        return bool(self.kld.size) and bool(self.top_before) and bool(self.top_after)

    @property
    def top_changed(self) -> bool:
        """Whether the most likely next token is another one after the change."""
        return self.measured and self.top_before[0][0] != self.top_after[0][0]
