"""ImatrixRecord: the importance matrix the Quantization lens uses, as the views draw it (no Qt)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class ImatrixRecord:
    """Where an importance matrix came from and, per tensor, the mean squared activation of each input column."""

    source: str  # the file it was read from, or "computed on <text>"
    chunk_count: int
    chunk_size: int
    datasets: tuple[str, ...]
    importance: dict[str, npt.NDArray[np.float32]]  # tensor name -> (n_cols,) mean x^2 per input column
    matched: int  # tensors of the loaded model the matrix covers

    def summary(self) -> str:
        what = f"{len(self.importance)} tensors" + (f", {self.matched} of them in this model" if self.matched != len(self.importance) else "")
        chunks = f", {self.chunk_count} chunks of {self.chunk_size} tokens" if self.chunk_count else ""
        return f"{self.source}: {what}{chunks}"


def make_record(im, source: str, model_tensors: set[str]) -> ImatrixRecord:
    """An ImatrixRecord from an engine ImportanceMatrix (columns averaged over its matrices)."""
    importance = {n: v for n in im.names() if (v := im.column_importance(n)) is not None}
    return ImatrixRecord(source, int(im.chunk_count), int(im.chunk_size), tuple(im.datasets), importance,
                         sum(1 for n in importance if n in model_tensors))
