"""Input attributions: how much each prompt token's embedding moves a reply token's logit (difference).

Inseq's two gradient methods, on the engine's own graph through engine.grad:
- input x gradient (`ixg`): per token, sum over the embedding of x * d f / d x at the prompt's own embeddings;
- integrated gradients (`ig`): per token, sum over the embedding of x * the average of d f / d x along the straight
  path from a zero-embedding baseline to x (Sundararajan et al. 2017), the average by Gauss-Legendre quadrature on
  `steps` points (`rule='uniform'`: Captum's and Inseq's default). Its attributions sum to f(x) - f(0) when the path
  integral is exact: `completeness_error` = |sum - (f(x) - f(0))| says how far the quadrature is from that.

RMSNorm makes f steep next to the zero baseline: a norm's input alpha * x is scaled up to unit RMS once alpha * |x|
passes sqrt(eps), so most of f(x) - f(0) is made at alpha below 1e-3, between the uniform rule's first nodes, and its
completeness error is of the size of f itself. `rule='log'` puts the same Gauss-Legendre points on PANELS panels
spaced by powers of ten ([0, 1e-7], [1e-7, 1e-6], ..., [0.1, 1]): with 128 points it brings the error under 5% on the
tiny test models (tests/engine/attribute/test_methods.py), but with 64 on SmolLM2 it is larger than the uniform rule's
(54.7 against 2.48 for f(x) - f(0) = 1.97): from a zero baseline the path integral is ill-conditioned on RMSNorm models,
which is why the error is always reported.

f is the logit of the target (minus the contrast's) at the attributed position, before any final soft-cap (the same
number engine.attribute.direct splits); the gradient is the float32 reference's, with weights as they dequantize.

Integrated gradients runs `steps` backward passes: `cancel()` is asked before each (True: AttributionCancelled is
raised, nothing is returned) and `progress(done, steps)` told after each, so a caller can stop it within one pass.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.errors import LensError, SettingError
from engine.grad.backward import gradient, traced

if TYPE_CHECKING:
    from engine.model import Model

F64 = npt.NDArray[np.float64]
IG_STEPS = 32  # Inseq's default n_steps
MAX_STEPS = 1024
RULES = ("uniform", "log")
PANELS = 8  # the log rule's panels: [0, 1e-7], then one per power of ten up to 1
Cancel = Callable[[], bool]  # True: stop before the next pass
Progress = Callable[[int, int], None]  # (passes done, passes in all)


class AttributionCancelled(LensError):
    """The caller's cancel() said stop between two passes of a gradient attribution."""

    def __init__(self) -> None:
        super().__init__("attribution was stopped")


def stop_if(cancel: Cancel | None) -> None:
    """Raise AttributionCancelled when `cancel()` says stop."""
    if cancel is not None and cancel():
        raise AttributionCancelled


@dataclass(frozen=True)
class InputAttribution:
    """One value per prompt token (up to the attributed position) for one method."""

    method: str  # 'ixg' or 'ig'
    tokens: tuple[int, ...]
    values: F64  # (T,) each token's attribution
    value: float  # f(x): the logit (difference) the gradients are of (float32 reference numerics)
    baseline_value: float | None  # ig: f(zero embeddings)
    steps: int  # ig: quadrature points (0 for ixg)
    completeness_error: float | None  # ig: |sum(values) - (f(x) - f(baseline))|

    def to_json(self, texts: Sequence[str]) -> dict[str, Any]:
        """The `inputs` object of `gguf-lens attribute --method ig|ixg --json`."""
        return {
            "method": self.method,
            "f": self.value,
            "f_baseline": self.baseline_value,
            "steps": self.steps or None,
            "sum": float(np.sum(self.values)),
            "completeness_error": self.completeness_error,
            "tokens": [{"position": p, "id": t, "text": s, "value": float(v)}
                       for p, (t, s, v) in enumerate(zip(self.tokens, texts, self.values))],
        }


def input_x_gradient(model: Model, ids: Sequence[int], target: int, contrast: int | None = None,
                     dtype: Any = np.float32, decoder: Sequence[int] | None = None) -> InputAttribution:
    """Per token: sum over the embedding of x * d f / d x (at the last of `ids`; an encoder-decoder: at the last of
    `decoder`, the tokens being the encoder's then the decoder's)."""
    g = gradient(model, ids, target, contrast, dtype=dtype, decoder=decoder)
    values = np.sum(g.embeddings * g.d_embeddings, axis=-1)
    return InputAttribution("ixg", _tokens(ids, decoder), values, g.value, None, 0, None)


def _tokens(ids: Sequence[int], decoder: Sequence[int] | None) -> tuple[int, ...]:
    return tuple(int(i) for i in [*ids, *(decoder or ())])


def integrated_gradients(model: Model, ids: Sequence[int], target: int, contrast: int | None = None,
                         steps: int = IG_STEPS, rule: str = "uniform", dtype: Any = np.float32,
                         cancel: Cancel | None = None, progress: Progress | None = None,
                         decoder: Sequence[int] | None = None) -> InputAttribution:
    """Per token: sum over the embedding of x * the path average of d f / d x from zero embeddings to x; `cancel` is
    asked before each of the `steps` backward passes, `progress(done, steps)` told after each."""
    alphas, weights = quadrature(steps, rule)
    stop_if(cancel)
    with traced(model, copies=True):  # float32 weight copies (within the dense budget) shared by every step
        full = gradient(model, ids, target, contrast, dtype=dtype, backward=False, decoder=decoder)
        x = full.embeddings
        total = np.zeros_like(x)
        for done, (a, w) in enumerate(zip(alphas, weights), 1):
            stop_if(cancel)
            total += w * gradient(model, ids, target, contrast, embeddings=a * x, dtype=dtype,
                                  decoder=decoder).d_embeddings
            if progress is not None:
                progress(done, steps)
        base = gradient(model, ids, target, contrast, embeddings=np.zeros_like(x), dtype=dtype, backward=False,
                        decoder=decoder).value
    values = np.sum(x * total, axis=-1)
    error = abs(float(np.sum(values)) - (full.value - base))
    return InputAttribution("ig", _tokens(ids, decoder), values, full.value, base, steps, error)


def quadrature(steps: int, rule: str = "uniform") -> tuple[F64, F64]:
    """Points alpha in (0, 1) and weights summing to 1 for the path integral: Gauss-Legendre on [0, 1] ('uniform'), or
    on PANELS log-spaced panels ('log', steps a multiple of PANELS)."""
    if rule not in RULES:
        raise SettingError(f"integrated gradients: rule {rule!r} is not one of {', '.join(RULES)}")
    if not 1 <= steps <= MAX_STEPS or (rule == "log" and steps % PANELS):
        need = f" and a multiple of {PANELS} for the log rule" if rule == "log" else ""
        raise SettingError(f"integrated gradients: --steps {steps} must be in 1..{MAX_STEPS}{need}")
    edges = np.array([0.0, 1.0]) if rule == "uniform" else np.concatenate([[0.0], np.logspace(1 - PANELS, 0, PANELS)])
    nodes, w = np.polynomial.legendre.leggauss(steps // (len(edges) - 1))  # on [-1, 1]
    lo, hi = edges[:-1, None], edges[1:, None]
    return (lo + (hi - lo) * (nodes + 1.0) / 2.0).ravel(), ((hi - lo) * w / 2.0).ravel()
