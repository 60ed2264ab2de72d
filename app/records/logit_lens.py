"""Logit-lens records: every layer's residual stream decoded by the model's own head, around one position.

The chat's recorder keeps post-RoPE queries only (hidden states would cost layers x dim floats per token on
every reply), so the lens re-runs the context once on a fresh cache with a Recorder that captures the residual
stream after each layer, then decodes those streams (engine.observe.logit_lens). The chat's cache is not touched.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.observe.logit_lens import LogitLens, logit_lens, window_positions

LENS_WIDTH = 32  # positions of the heatmap: a window ending at the selected position


@dataclass(frozen=True)
class LogitLensRecord:
    """The logit lens of `positions`, with the text of every token id it names."""

    lens: LogitLens
    selected: int  # the position whose top-k table is shown
    token_texts: tuple[str, ...]  # the context's tokens
    id_texts: dict[int, str]  # token id -> text, for every id in top_ids and targets
    label: str  # what ran: the model (and in Compare, which side)
    model_path: str
    n_tokens: int
    elapsed_s: float

    def text(self, token_id: int) -> str:
        return self.id_texts.get(int(token_id), f"#{int(token_id)}")

    def column(self, position: int) -> int:
        """Index of `position` among the decoded positions (the nearest one when it is outside)."""
        pos = self.lens.positions
        return int(np.clip(np.searchsorted(pos, position), 0, len(pos) - 1)) if len(pos) else 0


def residual_streams(model: Any, ids: Sequence[int]) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Every layer's residual stream (N, dim) over ids, and the last position's logits, on a fresh cache."""
    from engine.errors import LensError
    from engine.generate import prefill
    from engine.observe.recorder import Recorder

    rec = Recorder(capture_q=False, capture_hidden=True)
    logits = prefill(model, list(ids), model.new_cache(max(len(ids), 16)), recorder=rec)
    if logits is None:
        raise LensError("the logit lens run was cancelled")
    n = len(ids)
    return {layer: h[:n] for layer, h in rec.hidden.items()}, np.asarray(logits)


def make_logit_lens_record(model: Any, ids: Sequence[int], selected: int | None, *, width: int = LENS_WIDTH,
                           label: str = "", memo: dict[str, Any] | None = None) -> LogitLensRecord | None:
    """The logit lens of the `width` positions ending at `selected` (default: the last); None for no tokens.

    `memo` (a dict the caller keeps) holds the last run's streams, so picking another position of the same
    context decodes again without re-running the model.
    """
    t0 = time.perf_counter()
    ids = [int(t) for t in ids]
    if not ids:
        return None
    key = (id(model), str(model.path), tuple(ids))
    if memo is not None and memo.get("key") == key:
        hidden, last = memo["streams"]
    else:
        hidden, last = residual_streams(model, ids)
        if memo is not None:
            memo.clear()
            memo.update(key=key, streams=(hidden, last))
    sel = len(ids) - 1 if selected is None else int(np.clip(selected, 0, len(ids) - 1))
    positions = window_positions(len(ids), sel, width)
    lens = logit_lens(lambda x: model.net.head(x, True), hidden, ids, positions, final_logits=last)
    tok = model.tokenizer
    wanted = set(np.unique(lens.top_ids).tolist()) | set(lens.targets.tolist())
    return LogitLensRecord(
        lens=lens, selected=sel, token_texts=tuple(tok.token_text(t) for t in ids),
        id_texts={int(t): tok.token_text(int(t)) for t in wanted}, label=label or str(model.name),
        model_path=str(model.path), n_tokens=len(ids), elapsed_s=time.perf_counter() - t0,
    )


@dataclass(frozen=True)
class LogitLensPair:
    """The logit lens of A and B of the last comparison on the same tokens."""

    a: LogitLensRecord
    b: LogitLensRecord
