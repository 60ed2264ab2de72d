"""Comparing two runs of a model on the same tokens: KL divergence, top-token agreement, perplexity, per-layer damage."""
from __future__ import annotations

import math
import threading
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import numpy.typing as npt

from engine.errors import LensError, SettingError
from engine.generate import log_softmax, prefill
from engine.observe.recorder import Recorder

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

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["per_token_kld"] = list(self.per_token_kld)
        d["per_layer"] = [asdict(x) for x in self.per_layer]
        return d


def kld_rows(logp_base: F64, logp_other: F64) -> F64:
    """KL(base || other) for each row of two log-probability matrices."""
    p = np.exp(logp_base)
    return np.sum(p * (logp_base - logp_other), axis=-1)


def token_stats(logits_base: np.ndarray, logits_other: np.ndarray, ids: Sequence[int]) -> dict[str, object]:
    """Distribution statistics from two logit matrices (N, n_vocab) for the same N tokens."""
    if logits_base.shape != logits_other.shape:
        raise SettingError(f"logit shapes differ: {logits_base.shape} vs {logits_other.shape}")
    a = log_softmax(logits_base).astype(np.float64)
    b = log_softmax(logits_other).astype(np.float64)
    kld = np.maximum(kld_rows(a, b), 0.0)
    n = len(ids)
    tgt = np.asarray(ids[1:], dtype=np.int64)
    rows = np.arange(n - 1)
    nll_a, nll_b = -a[rows, tgt], -b[rows, tgt]
    ppl_a, ppl_b = math.exp(float(nll_a.mean())), math.exp(float(nll_b.mean()))
    dp = 100.0 * (np.exp(-nll_b) - np.exp(-nll_a))
    q = np.quantile(kld, [0.5, 0.9, 0.99, 0.999])
    return dict(
        n_tokens=n, kld_mean=float(kld.mean()), kld_median=float(q[0]), kld_p90=float(q[1]), kld_p99=float(q[2]),
        kld_p999=float(q[3]), kld_max=float(kld.max()),
        same_top_pct=100.0 * float(np.mean(a.argmax(-1) == b.argmax(-1))),
        ppl_base=ppl_a, ppl_other=ppl_b, ppl_ratio=ppl_b / ppl_a, ln_ppl_ratio=math.log(ppl_b / ppl_a),
        delta_p_mean=float(dp.mean()), delta_p_rms=float(np.sqrt(np.mean(dp**2))),
        per_token_kld=tuple(float(x) for x in kld),
    )


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


def compare_models(base: Model, other: Model, ids: Sequence[int], *, cancel: threading.Event | None = None,
                   progress: Callable[[str, float], None] | None = None) -> Comparison:
    """Run both models on the same tokens and compare them position by position and layer by layer."""
    if len(ids) < 2:
        raise SettingError("a comparison needs at least 2 tokens")
    if base.args.n_vocab != other.args.n_vocab or base.args.n_layers != other.args.n_layers:
        raise SettingError("the two models differ in vocabulary or depth; they cannot be compared token by token")
    say = progress or (lambda what, frac: None)
    la, ra = run_recorded(base, ids, cancel, progress=lambda d, t: say("running A", 0.5 * d / max(t, 1)))
    lb, rb = run_recorded(other, ids, cancel, progress=lambda d, t: say("running B", 0.5 + 0.5 * d / max(t, 1)))
    stats = token_stats(la, lb, ids)
    return Comparison(per_layer=layer_divergence(ra.hidden, rb.hidden, len(ids)), **stats)
