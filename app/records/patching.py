"""The activation patching map as the Patching view draws it (layers x positions, the tokens, the answer pair), and the
effect of one of its cells patched alone: the corrupted prompt's next-token distribution before and after."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class PatchRecord:
    """engine.intervene.patching's result with the token texts it needs on screen."""

    scores: npt.NDArray[np.float64]  # (n_layers, T): share of the clean logit difference restored; NaN: not run
    clean_texts: tuple[str, ...]
    corrupt_texts: tuple[str, ...]
    answer: str
    wrong: str
    clean_diff: float
    corrupt_diff: float
    kind: str
    elapsed_s: float
    complete: bool = True  # False: cancelled part way (the cells run so far are shown)
    cached: bool = False  # the same map made earlier on the same model, shown again without running
    prompts: tuple[str, str] = ("", "")  # (clean, corrupted) as typed: a cell's effect is asked for on them

    def best(self) -> tuple[int, int, float]:
        """(layer, position, score) of the cell that restores the most."""
        s = np.where(np.isfinite(self.scores), self.scores, -np.inf)
        layer, pos = np.unravel_index(int(np.argmax(s)), s.shape)
        return int(layer), int(pos), float(self.scores[layer, pos])


@dataclass(frozen=True)
class PatchEffect:
    """One cell of a map patched alone: the corrupted prompt run as it is (before) and with that cell's activation
    taken from the clean run (after), compared as the Experiments tab's effect is (natural log)."""

    prompts: tuple[str, str]  # (clean, corrupted), the map's
    kind: str  # the map's kind: 'resid_pre', 'attn_out', 'mlp_out' or 'heads'
    layer: int
    cell: int  # the position patched; for 'heads' the head, patched at every position
    kld: npt.NDArray[np.float64]  # (T,) KLD(before || after) of the next-token distribution at each corrupted position
    token_texts: tuple[str, ...]  # the corrupted prompt's tokens
    top_before: tuple[tuple[str, float], ...]  # the last position's top tokens and probabilities
    top_after: tuple[tuple[str, float], ...]
    elapsed_s: float
    tag: tuple[object, ...] = ()  # what the asker tagged the request with (the model it was for)

    @property
    def where(self) -> tuple[tuple[str, str], str, int, int]:
        """What the effect is of: (prompts, kind, layer, cell)."""
        return self.prompts, self.kind, self.layer, self.cell

    @property
    def next_kld(self) -> float:
        """KLD(before || after) of the corrupted prompt's next token."""
        return float(self.kld[-1])
