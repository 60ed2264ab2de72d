"""Make a control vector from pairs of contrasting prompts, as llama.cpp's cvector-generator's mean method does.

For each (positive, negative) pair: both tokenized as common_tokenize(add_special = the vocabulary's add_bos, parse
special tokens), the shorter padded with the last token of " " to the longer's length, each run from an empty cache
in one batch, and every block's output (`l_out`) but the last kept; per block the positive rows minus the negative
rows, keeping the rows with any element above 1e-6 (tools/cvector-generator's filter_nonzero_rows, which looks at
the sign too). Per block the kept rows of every pair, in order, are averaged (a float32 sum row after row, divided
by their count) and scaled to unit length: direction.(i + 1) is block i's. The result is written in llama.cpp's
format (engine.intervene.control_vector.save) and applies with --control-vector like any other.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import SettingError

if TYPE_CHECKING:
    from engine.model import Model

ROW_EPS = np.float32(1e-6)
MAX_PAIR_TOKENS = 4096


def _tokens(model: Model, pos: str, neg: str) -> tuple[list[int], list[int]]:
    tok = model.tokenizer
    a = tok.encode(pos, add_special=bool(tok.add_bos), parse_special=True)
    b = tok.encode(neg, add_special=bool(tok.add_bos), parse_special=True)
    pad = tok.encode(" ", add_special=False)[-1]
    n = max(len(a), len(b))
    return a + [pad] * (n - len(a)), b + [pad] * (n - len(b))


def _block_outputs(model: Model, ids: list[int]) -> dict[int, np.ndarray]:
    from engine.observe.recorder import Recorder  # noqa: PLC0415

    rec = Recorder(capture_q=False, capture_hidden=True)
    cache = model.new_cache(len(ids))
    rec.begin(0, len(ids))
    model.net.forward(ids, cache, rec)
    rec.commit()
    return {i: h[: len(ids)].astype(np.float32) for i, h in rec.hidden.items()}


def mean_directions(model: Model, pairs: Sequence[tuple[str, str]],
                    progress: Callable[[float], None] | None = None) -> dict[int, np.ndarray]:
    """direction.(i + 1) for blocks i = 0 .. n_layer - 2 from the (positive, negative) prompt pairs."""
    if not pairs:
        raise SettingError("a control vector needs at least one pair of positive and negative prompts")
    n_blocks = model.args.n_layers - 1
    if n_blocks < 1:
        raise SettingError("a control vector needs a model of two layers or more")
    rows: dict[int, list[np.ndarray]] = {i: [] for i in range(n_blocks)}
    for k, (pos, neg) in enumerate(pairs):
        a, b = _tokens(model, pos, neg)
        if not a or len(a) > MAX_PAIR_TOKENS:
            raise SettingError(f"prompt pair {k + 1}: {len(a)} tokens (1..{MAX_PAIR_TOKENS})")
        out_a, out_b = _block_outputs(model, a), _block_outputs(model, b)
        for i in range(n_blocks):
            diff = out_a[i] - out_b[i]
            rows[i].append(diff[(diff > ROW_EPS).any(axis=1)])
        if progress is not None:
            progress((k + 1) / len(pairs))
    out: dict[int, np.ndarray] = {}
    for i in range(n_blocks):
        kept = np.concatenate(rows[i]) if rows[i] else np.zeros((0, model.args.dim), np.float32)
        if not len(kept):
            raise SettingError(f"block {i}: the positive and negative prompts give the same outputs")
        mean = np.cumsum(kept, axis=0, dtype=np.float32)[-1] / np.float32(len(kept))  # row after row, in float
        norm = np.float32(math.sqrt(float(np.cumsum(mean * mean, dtype=np.float32)[-1])))
        out[i + 1] = (mean / norm).astype(np.float32)
    return out
