"""Comparing two runs of a model on the same tokens: KL divergence, top-token agreement, perplexity, per-layer damage."""
from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import numpy.typing as npt

from engine.errors import LensError, SettingError
from engine.generate import log_softmax, logit_blocks, prefill, run_for_logits
from engine.observe.recorder import Recorder
from engine.observe.routing import RoutingChange, routing_changes, routing_layers

if TYPE_CHECKING:
    from engine.model import Model

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LayerDivergence:
    """How far one layer's output (the residual stream after it) moved between the two models."""

    layer: int
    rel_l2: float  # ||b - a|| / ||a||, over all positions
    cosine: float  # mean over positions of cos(a_t, b_t)


@dataclass(frozen=True)
class Comparison:
    """Statistics of `other` against `base` on the same tokens (llama.cpp's --kl-divergence numbers and more)."""

    n_tokens: int
    kld_mean: float
    kld_median: float
    kld_p90: float
    kld_p99: float
    kld_p999: float
    kld_max: float
    same_top_pct: float
    ppl_base: float
    ppl_other: float
    ppl_ratio: float
    ln_ppl_ratio: float
    delta_p_mean: float  # mean of p_other(correct) - p_base(correct), in percent
    delta_p_rms: float
    per_token_kld: tuple[float, ...]
    per_layer: tuple[LayerDivergence, ...]
    routing: tuple[RoutingChange, ...] = ()  # Mixture-of-Experts layers: where B's routers chose other experts

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["per_token_kld"] = list(self.per_token_kld)
        d["per_layer"] = [asdict(x) for x in self.per_layer]
        d["routing"] = [asdict(x) for x in self.routing]
        return d

    @property
    def routing_changed_pct(self) -> float | None:
        """The share of token-layer pairs (over the MoE layers) whose chosen experts differ; None for dense models."""
        return float(np.mean([r.changed_pct for r in self.routing])) if self.routing else None

    @property
    def routing_most_changed(self) -> RoutingChange | None:
        """The MoE layer whose routing changed most; None for dense models."""
        return max(self.routing, key=lambda r: r.changed_pct) if self.routing else None


def kld_rows(logp_base: F64, logp_other: F64) -> F64:
    """KL(base || other) for each row of two log-probability matrices."""
    p = np.exp(logp_base)
    return np.sum(p * (logp_base - logp_other), axis=-1)


STATS_BLOCK_BYTES = 4 << 20  # rows are compared this many float64 bytes at a time (a few such arrays live at once)


def log_softmax_rows(logits: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """engine.generate.log_softmax of each row of (N, n_vocab) logits, a block of rows at a time (its float64
    temporaries stay small); `out` may be `logits` itself (in place). The numbers equal log_softmax(logits)."""
    out = np.empty(logits.shape, np.float32) if out is None else out
    step = max(1, STATS_BLOCK_BYTES // max(1, 8 * logits.shape[-1]))
    for r0 in range(0, logits.shape[0], step):
        out[r0 : r0 + step] = log_softmax(logits[r0 : r0 + step])
    return out


class TokenStats:
    """token_stats over rows that arrive in pieces: add(base rows, other rows) in order, then result().

    Each row's numbers (KL divergence, both log-likelihoods of the next token, top-token agreement) are
    computed a block of rows at a time and only those numbers are kept, so comparing N positions of a
    262k-token vocabulary never holds more than a block's float64 copies (the whole (N, n_vocab) float64
    matrices took gigabytes). The results equal the row-at-once formulas exactly: every row is reduced alone.

    `base_logp` / `other_logp` say what add() gets for each side: log-probabilities (log_softmax of the logits,
    float32, as log_softmax_rows makes them) or raw logits.
    """

    def __init__(self, ids: Sequence[int], *, base_logp: bool = False, other_logp: bool = False):
        self.ids = np.asarray(ids, dtype=np.int64)
        n = len(self.ids)
        self.logp = (base_logp, other_logp)
        self.kld = np.zeros(n, np.float64)
        self.nll_a = np.zeros(max(0, n - 1), np.float64)
        self.nll_b = np.zeros(max(0, n - 1), np.float64)
        self.same = np.zeros(n, bool)
        self.done = 0

    def add(self, base: np.ndarray, other: np.ndarray) -> None:
        """The next rows of both runs, (r, n_vocab) each."""
        if base.shape != other.shape or base.ndim != 2:
            raise SettingError(f"logit shapes differ: {base.shape} vs {other.shape}")
        r = base.shape[0]
        if self.done + r > len(self.ids):
            raise SettingError(f"{self.done + r} rows for {len(self.ids)} tokens")
        step = max(1, STATS_BLOCK_BYTES // max(1, 8 * base.shape[1]))
        for i in range(0, r, step):
            self._block(base[i : i + step], other[i : i + step])

    def _block(self, base: np.ndarray, other: np.ndarray) -> None:
        r0, r1 = self.done, self.done + base.shape[0]
        a = (base if self.logp[0] else log_softmax(base)).astype(np.float64)
        b = (other if self.logp[1] else log_softmax(other)).astype(np.float64)
        self.kld[r0:r1] = np.maximum(kld_rows(a, b), 0.0)
        self.same[r0:r1] = a.argmax(-1) == b.argmax(-1)
        m = min(r1, len(self.ids) - 1) - r0  # rows that have a next token
        if m > 0:
            rows, tgt = np.arange(m), self.ids[r0 + 1 : r0 + 1 + m]
            self.nll_a[r0 : r0 + m] = -a[rows, tgt]
            self.nll_b[r0 : r0 + m] = -b[rows, tgt]
        self.done = r1

    def result(self) -> dict[str, object]:
        """token_stats's dictionary, once every row was added."""
        n = len(self.ids)
        if self.done != n:
            raise SettingError(f"{self.done} of {n} rows were compared")
        kld, nll_a, nll_b = self.kld, self.nll_a, self.nll_b
        ppl_a, ppl_b = math.exp(float(nll_a.mean())), math.exp(float(nll_b.mean()))
        dp = 100.0 * (np.exp(-nll_b) - np.exp(-nll_a))
        q = np.quantile(kld, [0.5, 0.9, 0.99, 0.999])
        return dict(
            n_tokens=n, kld_mean=float(kld.mean()), kld_median=float(q[0]), kld_p90=float(q[1]), kld_p99=float(q[2]),
            kld_p999=float(q[3]), kld_max=float(kld.max()),
            same_top_pct=100.0 * float(np.mean(self.same)),
            ppl_base=ppl_a, ppl_other=ppl_b, ppl_ratio=ppl_b / ppl_a, ln_ppl_ratio=math.log(ppl_b / ppl_a),
            delta_p_mean=float(dp.mean()), delta_p_rms=float(np.sqrt(np.mean(dp**2))),
            per_token_kld=tuple(float(x) for x in kld),
        )


def token_stats(logits_base: np.ndarray, logits_other: np.ndarray, ids: Sequence[int], *,
                logp: bool = False) -> dict[str, object]:
    """Distribution statistics from two logit matrices (N, n_vocab) for the same N tokens (log-probabilities
    with logp=True), computed a block of rows at a time (TokenStats)."""
    if logits_base.shape != logits_other.shape:
        raise SettingError(f"logit shapes differ: {logits_base.shape} vs {logits_other.shape}")
    acc = TokenStats(ids, base_logp=logp, other_logp=logp)
    acc.add(np.asarray(logits_base), np.asarray(logits_other))
    return acc.result()


def layer_divergence(hidden_a: dict[int, np.ndarray], hidden_b: dict[int, np.ndarray], n: int) -> tuple[LayerDivergence, ...]:
    """Relative L2 distance and mean cosine of each layer's residual stream between two runs."""
    out = []
    for layer in sorted(hidden_a):
        x, y = hidden_a[layer][:n].astype(np.float64), hidden_b[layer][:n].astype(np.float64)
        rel = float(np.linalg.norm(y - x) / max(np.linalg.norm(x), 1e-30))
        cos = np.sum(x * y, -1) / np.maximum(np.linalg.norm(x, axis=-1) * np.linalg.norm(y, axis=-1), 1e-30)
        out.append(LayerDivergence(layer, rel, float(cos.mean())))
    return tuple(out)


def run_recorded(model: Model, ids: Sequence[int], cancel: threading.Event | None = None,
                 chunk: int = 256, progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, Recorder]:
    """All logits of `ids` and a recorder holding every layer's residual stream."""
    rec = Recorder(capture_q=False, capture_hidden=True)
    logits = prefill(model, ids, model.new_cache(max(len(ids), 1)), all_logits=True, chunk_size=chunk,
                     recorder=rec, cancel=cancel, progress=progress)
    if logits is None:
        raise LensError("comparison cancelled")
    return logits, rec


LOGIT_ROWS_BYTES = 48 << 20  # the float32 logit rows each side holds at once while both runs go in step
HEAD_ROWS = 16  # compare_models takes a chunk's logits from its residual stream this many rows at a time (head_blocks)


def lockstep_chunk(n_vocab: int) -> int:
    """The prompt chunk compare_models runs both models in: LOGIT_ROWS_BYTES of logit rows, 16 to 256 rows."""
    return int(max(16, min(256, LOGIT_ROWS_BYTES // (4 * max(1, n_vocab)))))


def compare_models(base: Model, other: Model, ids: Sequence[int], *, cancel: threading.Event | None = None,
                   progress: Callable[[str, float], None] | None = None) -> Comparison:
    """Run both models on the same tokens and compare them position by position and layer by layer.

    The two runs go in step, a prompt chunk of positions at a time (`lockstep_chunk`: as many rows as
    LOGIT_ROWS_BYTES of logits hold, at most 256), each pass stopping before the output head; the logits are then
    taken about HEAD_ROWS rows at a time (engine.generate.head_blocks: the whole chunk's bits) into the statistics
    (TokenStats) and dropped: neither run's logits are held whole (at 1,024 positions of a 262,144-token vocabulary
    that was 1 GiB a side). The numbers are those of two whole runs prefilled in chunks of that size (run_recorded with that chunk),
    each statistic reduced row by row."""
    if len(ids) < 2:
        raise SettingError("a comparison needs at least 2 tokens")
    if base.args.n_vocab != other.args.n_vocab or base.args.n_layers != other.args.n_layers:
        raise SettingError("the two models differ in vocabulary or depth; they cannot be compared token by token")
    say = progress or (lambda what, frac: None)
    n = len(ids)
    chunk = lockstep_chunk(int(base.args.n_vocab))
    recs = (Recorder(capture_q=False, capture_hidden=True), Recorder(capture_q=False, capture_hidden=True))
    caches = (base.new_cache(max(n, 1)), other.new_cache(max(n, 1)))
    acc = TokenStats(ids)
    for i0 in range(0, n, chunk):
        i1 = min(n, i0 + chunk)
        outs, hidden = [], []
        for side, (model, cache, rec) in enumerate(zip((base, other), caches, recs)):
            say(f"running {'AB'[side]} on tokens {i0}-{i1}", (i0 + side * (i1 - i0) / 2) / n)
            if cancel is not None and cancel.is_set():
                raise LensError("comparison cancelled")
            out, h = run_for_logits(model, list(ids[i0:i1]), cache, rec)  # the pass stops before the head
            outs.append(out)
            hidden.append(h)
        for rows in logit_blocks((base, other), outs, hidden, HEAD_ROWS):
            acc.add(rows[0], rows[1])  # the rows' numbers kept, the rows dropped
            del rows
    return Comparison(per_layer=layer_divergence(recs[0].hidden, recs[1].hidden, n),
                      routing=compare_routing(recs[0], recs[1], base.args.n_layers, n), **acc.result())


def compare_routing(ra: Recorder, rb: Recorder, n_layers: int, n: int) -> tuple[RoutingChange, ...]:
    """Where the two runs' routers chose other experts (empty unless both models are Mixture-of-Experts)."""
    return routing_changes(routing_layers(ra, n_layers), routing_layers(rb, n_layers), n)
