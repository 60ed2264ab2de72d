"""Recurrent layers' maps for display: what the lenses draw for a DeltaNet layer where an attention layer has
softmax rows.

From what the recorder kept of each recurrent layer (q, k after their L2 norms, v after the convolution, the log
decay g and beta per value head: `Recorder.recurrent_inputs`), `layer_reads` gives engine.observe.recurrent's
exact decomposition for a window of the last positions of the recorded conversation (at least `window` of them,
up to a stride more: engine.observe.recurrent_extend.window_start, a start that moves once every stride positions):
each output as a sum over the values of the tokens in the window, plus one term for everything before it, carried
by the state the window started from (the recurrence run in float64 up to there; for a conversation shorter than
the window that state is zero and the term too). The window bounds the work (a triangular solve of window^3 / 3
per head) whatever the context length. `LayerReads.rows` normalises rows for a heatmap (|W| over the row's sum,
the earlier-context term as one more column), `state_bytes` is a layer's constant memory, `write_keep` the per-token
write strengths and decays.

For the lenses (the grid beside attention layers, one head large, the text tinted by a token's reads):
`LayerReads.full_rows` puts rows in the recording's coordinates (keys 0..N-1, the keys before the window 0 and
the earlier context as its own share), `reads_grid` pools every value head of some layers to thumbnails exactly
as engine.observe.attention_maps.attention_grid pools softmax rows, and `ReadsMemo` keeps the reads of the
recording as it is now per layer (within a byte budget), so the requests that follow one another for the same
conversation (the grid, then a head, then a clicked token) decompose each layer once; past the window it also keeps
the state each window started from (`layer_reads_carried`), so a conversation that grows runs only its new
positions through the recurrence, and a layer's reads grown by a few positions (a streaming reply) get only their
new rows (engine.observe.recurrent_extend), not a new triangular solve.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.hybrid_cache import RecurrentShape
from engine.observe.attention_maps import bin_starts, pool_rows, sample_rows
from engine.observe.recurrent import RecurrentReads, delta_rule_outputs, delta_rule_reads
from engine.observe.recurrent_extend import extend_reads, window_start

if TYPE_CHECKING:
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]
CARRY_BYTES = 128 << 20  # PrefixStates a ReadsMemo keeps (one float64 state per recurrent layer of a long chat)
PREFIX_CHUNK = 256  # positions of the state before the window run at a time (float64 copies of that many rows)
GRID_SCRATCH = 16 << 20  # bytes of (heads, rows, N) shares reads_grid holds at once
MEMO_BYTES = 192 << 20  # LayerReads a ReadsMemo keeps (weights H x T x T and the initial term H x T x S, float32)
WINDOW = 512  # positions decomposed exactly; earlier ones enter through the state the window starts from


@dataclass(frozen=True)
class LayerReads:
    """One recurrent layer's reads over positions [start, start + T) of the recording."""

    layer: int
    start: int  # the window's first position
    reads: RecurrentReads  # weights (H, T, T), initial (H, T, S): the earlier context's part of each output
    n_key_heads: int
    v_power: np.ndarray  # (H,) mean |v|^2 over the window: the size of a value read, to weigh the earlier term

    def rows(self, rows: npt.ArrayLike | None = None, heads: list[int] | None = None) -> F32:
        """(H, R, 1 + T) shares for a heatmap: column 0 is the earlier context (the initial term's size, in the
        units of the values' weights), then |W[t, s]| per token of the window; each row sums to 1 (0: nothing read)."""
        w = self.reads.weights if heads is None else self.reads.weights[heads]
        init = self.reads.initial if heads is None else self.reads.initial[heads]
        idx = np.arange(w.shape[1]) if rows is None else np.atleast_1d(np.asarray(rows, np.int64)) - self.start
        a = np.abs(w[:, idx]).astype(np.float64)
        # the earlier context as a weight: |initial| relative to the typical size of a value read, per row
        power = self.v_power if heads is None else self.v_power[heads]
        v_scale = np.maximum(np.sqrt(power), 1e-12)[:, None]
        e = np.linalg.norm(init[:, idx], axis=-1) / v_scale
        out = np.concatenate([e[..., None], a], axis=-1)
        total = out.sum(-1, keepdims=True)
        return np.divide(out, total, out=np.zeros_like(out), where=total > 0).astype(np.float32)

    @property
    def n_heads(self) -> int:
        return self.reads.n_heads

    @property
    def stop(self) -> int:
        """One past the window's last position (the recording's length when it was decomposed)."""
        return self.start + self.reads.length

    @property
    def nbytes(self) -> int:
        return int(self.reads.weights.nbytes + self.reads.initial.nbytes + self.v_power.nbytes)

    def key_head(self, head: int) -> int:
        """The key head value head `head` reads (h % key heads, as the layer expands q and k)."""
        return int(head) % max(1, self.n_key_heads)

    def full_rows(self, rows: npt.ArrayLike, n: int | None = None, heads: Sequence[int] | None = None,
                  *, with_signed: bool = True) -> tuple[F32, F32 | None, F32]:
        """Query rows in the recording's coordinates: (shares (H, R, n), signed (H, R, n), earlier (H, R)).

        shares: `rows`' heatmap shares (|W| and the earlier context sum to 1 per row) at keys start..row, 0 at every
        other key; signed: W[t, s] itself (the coefficient of v_s in o_t, negative where the delta rule erases), or
        None without `with_signed`; earlier: the share of the earlier context (everything before the window, read
        through the state). Rows outside the window (before `start`, or past what was decomposed) are NaN
        throughout. The arrays are H x R x n floats: callers with many rows take them a chunk at a time.
        """
        n = self.stop if n is None else int(n)
        pos = np.atleast_1d(np.asarray(rows, np.int64))
        hs = list(range(self.n_heads)) if heads is None else [int(h) for h in heads]
        inside = (pos >= self.start) & (pos < self.stop)
        shares = np.full((len(hs), len(pos), n), np.nan, np.float32)
        signed = np.full((len(hs), len(pos), n), np.nan, np.float32) if with_signed else None
        earlier = np.full((len(hs), len(pos)), np.nan, np.float32)
        if not inside.any():
            return shares, signed, earlier
        got = pos[inside]
        part = self.rows(got, hs)  # (H, R', 1 + T)
        width = min(n, self.stop) - self.start
        keys = slice(self.start, self.start + width)
        earlier[:, inside] = part[:, :, 0]
        if inside.all():  # the usual case: fill in place, no (H, R, n) block besides the result
            shares[:] = 0.0
            shares[:, :, keys] = part[:, :, 1 : 1 + width]
            if signed is not None:
                signed[:] = 0.0
                signed[:, :, keys] = self.reads.weights[hs][:, got - self.start, :width]
            return shares, signed, earlier
        block = np.zeros((len(hs), len(got), n), np.float32)
        block[:, :, keys] = part[:, :, 1 : 1 + width]
        shares[:, inside] = block
        if signed is not None:
            block[:] = 0.0
            block[:, :, keys] = self.reads.weights[hs][:, got - self.start, :width]
            signed[:, inside] = block
        return shares, signed, earlier


@dataclass(frozen=True)
class ReadsGrid:
    """Pooled read maps of every value head of some recurrent layers: (L, H, T, T) each, and (L, H) summaries.

    The same pooling as engine.observe.attention_maps.AttentionGrid, on the heatmap shares: bins a query row
    cannot read (later keys, keys before the decomposed window, rows before it) are NaN.
    """

    max_pooled: F32
    mean_pooled: F32
    nosink_pooled: F32  # max-pooled without the hidden keys
    nosink_mean: F32
    rows: I64  # the query rows sampled (attention_grid's rows for the same n and max_rows)
    sink: F32  # (L, H) mean share read from key 0 (0 when key 0 is before the window)
    prev: F32  # (L, H) mean share read from the previous token
    self_: F32  # (L, H) mean share read from the query's own token
    earlier: F32  # (L, H) mean share of the earlier context (0 when the window starts at 0)
    start: int  # the first position decomposed (the windows of all these layers start there)


def reads_grid(
    reads: Sequence[LayerReads],
    n: int,
    *,
    thumb: int = 32,
    max_rows: int | None = None,
    hidden: Sequence[int] = (0,),
) -> ReadsGrid:
    """Max- and mean-pool every value head's read shares of `reads` (one per layer) to at most thumb x thumb bins,
    over positions 0..n-1, sampling query rows as attention_grid does."""
    t = max(1, min(n, thumb))
    rows = sample_rows(n, max_rows, t)
    starts = bin_starts(n, t)
    row_bins = np.searchsorted(starts, rows, side="right") - 1
    hv = max((r.n_heads for r in reads), default=0)
    shape = (len(reads), hv, t, t)
    mx, mean, nosink, nosink_mean = (np.full(shape, np.nan, np.float32) for _ in range(4))
    sink, prev, self_, earlier = (np.zeros(shape[:2], np.float32) for _ in range(4))
    start = max((r.start for r in reads), default=0)
    if n == 0 or not reads:
        return ReadsGrid(mx, mean, nosink, nosink_mean, rows, sink, prev, self_, earlier, start)
    drop = np.array(sorted({int(k) for k in hidden if 0 <= int(k) < n}), np.int64)
    kept = np.ones(n, np.int64)
    kept[drop] = 0
    all_hidden = np.add.reduceat(kept, starts) == 0
    ends = np.append(starts[1:], n)
    for li, lr in enumerate(reads):
        h = lr.n_heads
        ok = (rows >= lr.start) & (rows < lr.stop)  # (R,) rows decomposed; the others are masked
        lo = np.where(ok, lr.start, 0)
        hi = np.where(ok, rows + 1, 0)
        counts = np.maximum(0, np.minimum(hi[:, None], ends[None]) - np.maximum(lo[:, None], starts[None]))  # (R, T)
        bin_allowed = pool_rows(counts.astype(np.float64)[None], row_bins, t, "sum")[0]
        masked = bin_allowed == 0
        cmax, csum, ns_max, ns_sum = (np.zeros((h, len(rows), t), np.float32) for _ in range(4))
        sums = np.zeros((4, h), np.float64)  # first token, self, previous, earlier context
        chunk = max(1, GRID_SCRATCH // max(1, 4 * h * n))  # rows per step: (H, chunk, n) floats at most
        decomposed = np.flatnonzero(ok)
        for c0 in range(0, len(decomposed), chunk):
            sl = decomposed[c0 : c0 + chunk]
            rr = rows[sl]
            w, _signed, early = lr.full_rows(rr, n, with_signed=False)  # (H, r, n)
            idx = np.arange(len(rr))
            sums[0] += w[:, :, 0].sum(axis=1)
            sums[1] += w[:, idx, rr].sum(axis=1)
            has_prev = rr >= 1
            sums[2] += w[:, idx[has_prev], rr[has_prev] - 1].sum(axis=1)
            sums[3] += early.sum(axis=1)
            cmax[:, sl] = np.maximum.reduceat(w, starts, axis=2)
            csum[:, sl] = np.add.reduceat(w, starts, axis=2)
            w[:, :, drop] = 0.0
            ns_max[:, sl] = np.maximum.reduceat(w, starts, axis=2)
            ns_sum[:, sl] = np.add.reduceat(w, starts, axis=2)
        m = pool_rows(cmax, row_bins, t, "max")
        m[:, masked] = np.nan
        mx[li, :h] = m
        mean[li, :h] = np.where(masked, np.nan, pool_rows(csum, row_bins, t, "sum") / np.maximum(bin_allowed, 1))
        gone = masked | all_hidden[None, :]
        ns = pool_rows(ns_max, row_bins, t, "max")
        ns[:, gone] = np.nan
        nosink[li, :h] = ns
        nosink_mean[li, :h] = np.where(gone, np.nan, pool_rows(ns_sum, row_bins, t, "sum") / np.maximum(bin_allowed, 1))
        k = max(1, int(ok.sum()))
        sink[li, :h] = sums[0] / k
        self_[li, :h] = sums[1] / k
        prev[li, :h] = sums[2] / max(1, int((ok & (rows >= 1)).sum()))
        earlier[li, :h] = sums[3] / k
    return ReadsGrid(mx, mean, nosink, nosink_mean, rows, sink, prev, self_, earlier, start)


class ReadsMemo:
    """The LayerReads of a recording as it is now, per layer, the newest kept within `budget` bytes.

    An entry is found again only for the same recorder, length, window and recorded gates (g and beta of every
    position: a regenerated reply of the same length has other ones). Past the window, the state each layer's
    window started from is kept too (within `carry_budget`), so a longer recording runs only its new positions
    through the recurrence. A recording that continues a kept one (the same gates over the positions it had: a reply
    that streamed on) is extended rather than decomposed again: its new rows only, the kept rows as they were
    (`extended` counts those, `computed` the layers decomposed whole). A layer whose reads or starting state did
    not stay within the budgets is decomposed whole. Not thread-safe: one worker uses it.
    """

    def __init__(self, budget: int = MEMO_BYTES, window: int = WINDOW, carry_budget: int = CARRY_BYTES):
        self.budget = int(budget)
        self.carry_budget = int(carry_budget)
        self.window = int(window)  # positions decomposed exactly when a caller does not say
        self._items: OrderedDict[tuple[object, ...], LayerReads] = OrderedDict()
        self._carry: dict[tuple[int, int, int], PrefixState] = {}  # per layer: the last window's starting state
        self.computed = 0  # layers decomposed whole (tests: what was not found again)
        self.extended = 0  # layers grown from their kept reads by the new positions' rows

    def get(self, recorder: Recorder, layer: int, window: int | None = None) -> LayerReads | None:
        """layer_reads(recorder, layer, window (default: the memo's)), from the memo when the recording has not
        changed; when it has grown, the state before the window is run on from where the last one was, and when it
        continues the kept one (a reply that streamed on) only the new positions' rows are computed (`_extend`)."""
        window = self.window if window is None else int(window)
        got = recorder.recurrent_inputs(layer)
        if got is None:
            return None
        digest = hashlib.blake2b(digest_size=16)
        for name in ("g", "beta"):
            digest.update(np.ascontiguousarray(got[name]).tobytes())
        key = (id(recorder), int(layer), int(recorder.length), int(window), digest.digest())
        hit = self._items.get(key)
        if hit is not None:
            self._items.move_to_end(key)
            return hit
        where = (id(recorder), int(layer), int(window))
        reads, carry = self._extend(got, where, int(got["q"].shape[0]))
        if reads is not None:
            self.extended += 1
        else:
            reads, carry = layer_reads_carried(recorder, layer, window, self._carry.get(where))
            self.computed += 1
        if carry is not None:  # kept within its budget: a layer that does not fit starts from zero next time
            self._carry.pop(where, None)
            if sum(c.state.nbytes for c in self._carry.values()) + carry.state.nbytes <= self.carry_budget:
                self._carry[where] = carry
        if reads is None:
            return None
        for old in [k for k in self._items if k[:2] == key[:2]]:  # this layer's older recording
            del self._items[old]
        self._items[key] = reads
        while len(self._items) > 1 and sum(r.nbytes for r in self._items.values()) > self.budget:
            self._items.popitem(last=False)
        return reads

    def _extend(self, got: dict[str, np.ndarray], where: tuple[int, int, int],
                n: int) -> tuple[LayerReads | None, PrefixState | None]:
        """The reads of `got` (n positions) grown from this layer's kept reads of a shorter recording it continues
        (the same gates over the positions those had), or (None, None): nothing kept, another recording, or a window
        that moved past the kept one. The window's starting state is the carried one, run on over the positions it
        moved."""
        olds = [k for k, r in self._items.items() if k[:2] == where[:2] and k[3] == where[2] and r.stop < n]
        if not olds:
            return None, None
        old_key = max(olds, key=lambda k: self._items[k].stop)
        old = self._items[old_key]
        start = window_start(n, where[2])
        if not old.start <= start < old.stop or 2 * (n - old.stop) > n - start:  # most of it new: a solve is as cheap
            return None, None
        if _gates_digest(got, old.stop) != old_key[4]:
            return None, None
        n_v, n_k = got["v"].shape[1], got["q"].shape[1]
        heads = np.arange(n_v) % n_k
        state0, carried = _state_at(got, heads, start, self._carry.get(where))
        q, k, v, g, beta = (got[name][start:].astype(np.float64) for name in ("q", "k", "v", "g", "beta"))
        reads = extend_reads(old.reads, start - old.start, q[:, heads], k[:, heads], v, g, beta, state0)
        return LayerReads(where[1], start, reads, n_k, np.mean(v ** 2, axis=(0, 2)) * v.shape[2]), carried

    def clear(self) -> None:
        self._items.clear()
        self._carry.clear()


def recurrent_layers(recorder: Recorder) -> list[int]:
    """The recorded recurrent layers, in order."""
    return sorted(recorder.recurrent)


def layer_reads(recorder: Recorder, layer: int, window: int = WINDOW) -> LayerReads | None:
    """The exact reads of a recurrent layer's last recorded positions (None: not recorded): at least `window` of
    them, from engine.observe.recurrent_extend.window_start (a start that moves in strides)."""
    return layer_reads_carried(recorder, layer, window)[0]


@dataclass(frozen=True)
class PrefixState:
    """The delta rule's state (float64) after a layer's first `pos` recorded positions, with a digest of their gates:
    the state a later window starts from is then run on from here (the new positions only) for the same prefix."""

    pos: int
    state: np.ndarray  # (value heads, S_k, S_v) float64
    digest: bytes


def layer_reads_carried(recorder: Recorder, layer: int, window: int = WINDOW,
                        carry: PrefixState | None = None) -> tuple[LayerReads | None, PrefixState | None]:
    """layer_reads, and the state the window started from (to carry to the next call as the recording grows).

    The state before the window is the recurrence run in float64 (engine.observe.recurrent.delta_rule_outputs), a
    chunk of PREFIX_CHUNK positions at a time from `carry` when it holds a prefix of this recording (else from
    zero): the same operations in the same order as one run over the whole prefix, at the cost of the new
    positions only, and never the whole recording converted to float64 at once.
    """
    got = recorder.recurrent_inputs(layer)
    if got is None or not got["q"].shape[0]:
        return None, None
    n_v, n_k = got["v"].shape[1], got["q"].shape[1]
    heads = np.arange(n_v) % n_k  # value head h reads key head h % n_k
    start = window_start(got["q"].shape[0], window)
    state0, carried = _state_at(got, heads, start, carry)
    q, k, v, g, beta = (got[name][start:].astype(np.float64) for name in ("q", "k", "v", "g", "beta"))
    reads = delta_rule_reads(q[:, heads], k[:, heads], v, g, beta, state0)
    return LayerReads(layer, start, reads, n_k, np.mean(v ** 2, axis=(0, 2)) * v.shape[2]), carried


def _gates_digest(got: dict[str, np.ndarray], pos: int) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for name in ("g", "beta"):
        digest.update(np.ascontiguousarray(got[name][:pos]).tobytes())
    return digest.digest()


def _state_at(got: dict[str, np.ndarray], heads: np.ndarray, start: int,
              carry: PrefixState | None) -> tuple[np.ndarray | None, PrefixState | None]:
    """The delta rule's state after positions [0, start) (None at 0), from `carry` when it is a prefix of `got`."""
    if start == 0:
        return None, None
    pos, state = 0, None
    if carry is not None and 0 < carry.pos <= start and carry.digest == _gates_digest(got, carry.pos):
        pos, state = carry.pos, carry.state
    for c0 in range(pos, start, PREFIX_CHUNK):
        c1 = min(c0 + PREFIX_CHUNK, start)
        q, k, v, g, beta = (got[name][c0:c1].astype(np.float64) for name in ("q", "k", "v", "g", "beta"))
        _, state = delta_rule_outputs(q[:, heads], k[:, heads], v, g, beta, state)  # a fresh array each time
    assert state is not None
    return state, PrefixState(start, state, _gates_digest(got, start))


def write_keep(recorder: Recorder, layer: int) -> tuple[F32, F32] | None:
    """(beta, exp(g)), each (N, value heads): how much each token wrote into the state and how much it kept."""
    got = recorder.recurrent_inputs(layer)
    if got is None:
        return None
    return got["beta"].astype(np.float32), np.exp(got["g"].astype(np.float64)).astype(np.float32)


def state_bytes(n_heads: int, size: int, conv_rows: int, channels: int) -> int:
    """Bytes of one recurrent layer's state (float32), the same at every context length (the cache's own count)."""
    return RecurrentShape(conv_rows, channels, n_heads, size).nbytes
