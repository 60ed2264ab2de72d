"""The activation patching map as the Patching view draws it: layers x positions, the tokens, the answer pair."""
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

    def best(self) -> tuple[int, int, float]:
        """(layer, position, score) of the cell that restores the most."""
        s = np.where(np.isfinite(self.scores), self.scores, -np.inf)
        layer, pos = np.unravel_index(int(np.argmax(s)), s.shape)
        return int(layer), int(pos), float(self.scores[layer, pos])
