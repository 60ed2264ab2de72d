"""Head roles: every attention head scored by the pattern it follows, and the keys where attention sinks.

The scores are means over query rows of one head's attention row w (keys 0..r of query r):

| role | score of one row r | rows counted |
| --- | --- | --- |
| previous | w[r, r-1] | r >= 1 |
| sink | w[r, 0]: the first token, where unused attention parks (Xiao et al. 2023, attention sinks) | r >= 1 |
| self | w[r, r] | r >= 1 |
| induction | sum of w[r, j+1] over earlier j with token[j] == token[r] (and j+1 < r): "the token that followed the last time this token appeared" (Olsson et al. 2022) | rows with such a j |
| broad | entropy of the row / log(keys visible): 1 for uniform attention | rows with >= 2 visible keys |
| local | sum of w over the LOCAL_WIDTH keys ending at r, key 0 left out | r >= LOCAL_WIDTH |

Sinks: a key is a sink in a head when the mean weight the rows after it give it is at least SINK_MIN and
SINK_RATIO times what uniform attention would give it (the mean of 1 / keys visible over those rows).

`probe_ids` makes the induction probe: a random token sequence repeated twice, where a head that copies
"what came next last time" scores high on the second copy and nothing else can.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.observe.attention_maps import ROW_CHUNK, attention_rows, sample_rows

if TYPE_CHECKING:
    from engine.cache import KVCache
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
ROLES = ("previous", "sink", "self", "induction", "broad", "local")
ROLE_TEXT = {
    "previous": "attends to the token just before the query",
    "sink": "parks attention on the first token (an attention sink)",
    "self": "attends to the query's own token",
    "induction": "attends to the token that followed the query's token last time (repeated text)",
    "broad": "spreads attention evenly (row entropy / log of keys visible; 1 = uniform)",
    "local": "keeps attention within the last few tokens (key 0 left out)",
}
LOCAL_WIDTH = 8  # keys ending at the query that count as "local"
SINK_MIN = 0.3  # a sink takes at least this mean weight...
SINK_RATIO = 5.0  # ...and this many times the uniform share
SINK_MIN_ROWS = 8  # rows that must see a key before it can be called a sink (the last keys are seen by few)


@dataclass(frozen=True)
class Sink:
    """A key where attention sinks: in how many heads, and the strongest one."""

    key: int
    n_heads: int  # heads in which it is a sink
    weight: float  # the largest mean weight it receives in one head
    layer: int  # that head
    head: int
    ratio: float  # weight / the uniform share in that head


@dataclass(frozen=True)
class HeadRoles:
    """Role scores of every (layer, head), (L, H) each (NaN where no row qualifies), and the sinks found."""

    layers: tuple[int, ...]
    scores: dict[str, F32]  # role -> (L, H)
    received: F32  # (L, H, N) mean weight each key receives from the rows after it
    uniform: F32  # (L, N) the same under uniform attention
    sinks: tuple[Sink, ...]
    rows: I64  # query rows scored
    n_tokens: int

    def top(self, role: str, k: int = 5) -> list[tuple[int, int, float]]:
        """The k heads with the highest score for `role`: (layer, head, score), best first."""
        s = self.scores[role]
        flat = np.where(np.isfinite(s), s, -np.inf).ravel()
        order = np.argsort(-flat, kind="stable")[:k]
        h = s.shape[1]
        return [(self.layers[i // h], i % h, float(flat[i])) for i in order if np.isfinite(flat[i])]


def induction_targets(tokens: Sequence[int], rows: I64) -> list[I64]:
    """For each query row r: the keys j+1 (j+1 < r) right after earlier occurrences j of token[r]."""
    toks = np.asarray(tokens, dtype=np.int64)
    out = []
    for r in rows:
        r = int(r)
        j = np.flatnonzero(toks[: max(0, r - 1)] == toks[r]) if r < toks.size else np.zeros(0, np.int64)
        out.append((j + 1).astype(np.int64))
    return out


def row_scores(w: F32, rows: I64, visible_from: I64, targets: list[I64]) -> dict[str, tuple[F32, F32]]:
    """Per-head sums and counts of each role's score over a block of rows; w is (H, R, N) with masked keys 0.

    visible_from[i] is the first key row i may see (0, or past a sliding window).
    """
    h, r_n, _ = w.shape
    idx = np.arange(r_n)
    r = rows
    has_prev = r >= 1
    out: dict[str, tuple[F32, F32]] = {}
    prev = np.where(has_prev, w[:, idx, np.maximum(r - 1, 0)], 0.0)
    out["previous"] = (prev.sum(1), np.full(h, has_prev.sum(), np.float64))
    sink = np.where(has_prev & (visible_from == 0), w[:, :, 0], 0.0)
    out["sink"] = (sink.sum(1), np.full(h, (has_prev & (visible_from == 0)).sum(), np.float64))
    self_ = np.where(has_prev, w[:, idx, r], 0.0)
    out["self"] = (self_.sum(1), np.full(h, has_prev.sum(), np.float64))
    ind = np.zeros(h, np.float64)
    n_ind = 0
    for i, t in enumerate(targets):
        t = t[t >= visible_from[i]]
        if t.size:
            ind += w[:, i, t].sum(axis=1)
            n_ind += 1
    out["induction"] = (ind, np.full(h, n_ind, np.float64))
    n_vis = (r - visible_from + 1).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(w > 0, w * np.log(w), 0.0).sum(axis=2)  # (H, R)
        broad = np.where(n_vis >= 2, ent / np.log(np.maximum(n_vis, 2)), 0.0)
    out["broad"] = (broad.sum(1), np.full(h, (n_vis >= 2).sum(), np.float64))
    ok = r >= LOCAL_WIDTH
    cum = np.cumsum(w, axis=2)  # (H, R, N)
    lo = np.maximum(r - LOCAL_WIDTH, 0)
    local = cum[:, idx, r] - cum[:, idx, lo]  # keys (r - LOCAL_WIDTH, r]
    out["local"] = (np.where(ok, local, 0.0).sum(1), np.full(h, ok.sum(), np.float64))
    return out


def head_roles(
    recorder: Recorder,
    cache: KVCache,
    tokens: Sequence[int],
    *,
    layers: Sequence[int] | None = None,
    max_rows: int | None = 512,
    chunk: int = ROW_CHUNK,
) -> HeadRoles:
    """Score every head of `layers` (default all recorded) on the recorded attention; rows sampled past max_rows."""
    n = min(recorder.length, cache.length, len(tokens))
    layers = tuple(sorted(recorder.specs) if layers is None else (int(x) for x in layers))
    windows = {layer: recorder.specs[layer].window for layer in layers}
    return score_heads(lambda layer, rows: attention_rows(recorder, cache, layer, rows), layers, windows,
                       tokens[:n], max_rows=max_rows, chunk=chunk)


Attend = Callable[[int, I64], F32]  # (layer, query rows) -> (H, R, N) softmax rows, masked keys exactly 0


def score_heads(
    attend: Attend,
    layers: Sequence[int],
    windows: dict[int, int | None],
    tokens: Sequence[int],
    *,
    max_rows: int | None = 512,
    chunk: int = ROW_CHUNK,
) -> HeadRoles:
    """Score the heads of `layers` on the attention `attend` returns over the N = len(tokens) positions."""
    n = len(tokens)
    layers = tuple(int(x) for x in layers)
    rows = sample_rows(n, max_rows, 32)
    targets = induction_targets(tokens, rows)
    hq = attend(layers[0], rows[:1]).shape[0] if layers and n else 0
    scores = {role: np.full((len(layers), hq), np.nan, np.float32) for role in ROLES}
    received = np.zeros((len(layers), hq, n), np.float32)
    uniform = np.zeros((len(layers), n), np.float32)
    keys = np.arange(n)
    for li, layer in enumerate(layers):
        window = windows.get(layer)
        sums = {role: np.zeros(hq, np.float64) for role in ROLES}
        counts = {role: np.zeros(hq, np.float64) for role in ROLES}
        col_sum = np.zeros((hq, n), np.float64)
        col_uniform = np.zeros(n, np.float64)
        col_rows = np.zeros(n, np.float64)
        for s in range(0, len(rows), chunk):
            rr = rows[s : s + chunk]
            w = attend(layer, rr)  # (H, r, N)
            first = np.zeros_like(rr) if window is None else np.maximum(0, rr - window + 1)
            for role, (v, c) in row_scores(w, rr, first, targets[s : s + chunk]).items():
                sums[role] += v
                counts[role] += c
            # what each key receives from the rows strictly after it (a query's own key is the "self" score)
            later = (keys[None, :] < rr[:, None]) & (keys[None, :] >= first[:, None])  # (r, N)
            col_sum += np.where(later[None], w, 0.0).sum(axis=1)
            col_uniform += np.where(later, 1.0 / (rr - first + 1)[:, None], 0.0).sum(axis=0)
            col_rows += later.sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            for role in ROLES:
                scores[role][li] = np.where(counts[role] > 0, sums[role] / np.maximum(counts[role], 1), np.nan)
            received[li] = np.where(col_rows > 0, col_sum / np.maximum(col_rows, 1), 0.0)
            uniform[li] = np.where(col_rows > 0, col_uniform / np.maximum(col_rows, 1), 0.0)
        uniform[li, col_rows < SINK_MIN_ROWS] = np.inf  # too few rows see it to call it a sink
    return HeadRoles(layers, scores, received, uniform, find_sinks(received, uniform, layers), rows, n)


def find_sinks(received: F32, uniform: F32, layers: Sequence[int]) -> tuple[Sink, ...]:
    """Keys whose mean received weight is >= SINK_MIN and >= SINK_RATIO x uniform in some head, strongest first."""
    if received.size == 0:
        return ()
    u = uniform[:, None, :]  # (L, 1, N)
    is_sink = (received >= SINK_MIN) & (received >= SINK_RATIO * u) & np.isfinite(u)
    out = []
    for key in np.flatnonzero(is_sink.any(axis=(0, 1))):
        col = np.where(is_sink[:, :, key], received[:, :, key], -1.0)
        li, h = np.unravel_index(int(np.argmax(col)), col.shape)
        wt = float(received[li, h, key])
        out.append(Sink(int(key), int(is_sink[:, :, key].sum()), wt, int(layers[li]), int(h),
                        wt / max(float(uniform[li, key]), 1e-12)))
    out.sort(key=lambda s: (-s.n_heads, -s.weight))
    return tuple(out)


def probe_ids(tokenizer: object, length: int = 40, seed: int = 0) -> list[int]:
    """BOS (when the model adds one), then `length` random ordinary tokens, then the same tokens again."""
    n_vocab = int(tokenizer.n_vocab)
    rng = np.random.default_rng(seed)
    special = tokenizer.is_special
    pool: list[int] = []
    while len(pool) < length:
        for t in rng.integers(0, n_vocab, size=4 * length):
            t = int(t)
            if not special(t) and t not in pool and len(pool) < length:
                pool.append(t)
    bos = getattr(tokenizer, "bos_id", None)
    head = [int(bos)] if bos is not None and getattr(tokenizer, "add_bos", False) else []
    return head + pool + pool
