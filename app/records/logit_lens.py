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

    def covers(self, position: int) -> bool:
        """Whether `position` is one of the decoded positions."""
        return bool(np.any(self.lens.positions == int(position)))

    def on_top(self, column: int) -> str:
        """Where the produced token at `column` is the layers' top token, in words (see `on_top_text`)."""
        return on_top_text(self.lens, column)


def layer_runs(layers: Sequence[int]) -> str:
    """'3, 12–16, 20' for layers 3, 12, 13, 14, 15, 16, 20."""
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def on_top_text(lens: LogitLens, column: int) -> str:
    """Where the produced token is the top token (rank 1 in the table), from the same ranks the table shows.

    'the top token from layer 12 on', 'the top token at layers 12–16 only, not after the last layer (29)', or
    'not the top token at any layer': never 'never' while the table ranks it first somewhere.
    """
    layers = [int(v) for v in lens.layers]
    top = [layers[i] for i in range(len(layers)) if int(lens.rank[i, column]) == 0]
    decided = int(lens.decided_at()[column])
    if decided >= 0:
        before = [layer for layer in top if layer < decided]
        return f"the top token from layer {decided} on" + (f" (and at layer{'s' if len(before) > 1 else ''} "
                                                         f"{layer_runs(before)} before)" if before else "")
    if top:
        return (f"the top token at layer{'s' if len(top) > 1 else ''} {layer_runs(top)} only, "
                f"not after the last layer ({layers[-1]})")
    return "not the top token at any layer"


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
