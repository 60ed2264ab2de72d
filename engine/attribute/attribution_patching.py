"""Attribution patching: the gradient estimate of every head's and position's activation-patching effect at once.

For a clean and a corrupted prompt of the same length, activation patching (engine.intervene.patching) reruns the
corrupted prompt once per cell with one activation taken from the clean run and measures how much of the clean logit
difference (answer - wrong, at the last position) comes back. Attribution patching (Nanda 2023; Syed et al. 2023)
linearises that: one forward and one backward pass of the corrupted prompt give d metric / d activation, and the
effect of patching a cell is estimated as that gradient times (clean activation - corrupted activation), summed over
the cell's channels, divided by (clean - corrupted) difference as patching's map is. Cells: each head at each position
(`attn.hook_z`) and the residual stream entering each block at each position (`hook_resid_pre`).

The estimate is checked against real patching on the same pair (`validate`): per head (every position at once, the
sum of the head's per-position estimates) and per block and position for the residual stream, with the Spearman rank
correlation and the overlap of the ten largest cells by |effect| reported.

The check is one patched run per head (or per block and position): `cancel()` is asked before the gradient and before
each of those runs (True: AttributionCancelled, nothing returned), and `progress(done, total)` counts the gradient as
one pass and each run as one more, so a caller can show how far it is and stop it within one run.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.attribute.inputs import AttributionCancelled, Cancel, Progress, stop_if
from engine.errors import SettingError
from engine.grad.backward import gradient
from engine.intervene.ablation import heads_in
from engine.intervene.hooks import run_with_cache
from engine.intervene.patching import PatchingCancelled, patch

if TYPE_CHECKING:
    from engine.model import Model

F64 = npt.NDArray[np.float64]
TOP = 10  # the overlap of the largest cells reported
CHECKS = ("heads", "resid_pre")  # the real patching maps an estimate can be validated against


@dataclass(frozen=True)
class Agreement:
    """How an estimated map ranks its cells against real patching's."""

    real: F64  # the real patching map (share of the clean difference restored)
    spearman: float  # rank correlation of estimate and real over every cell
    top_overlap: float  # |top-10 by |estimate|  &  top-10 by |real|| / 10 (of the cells there are, if fewer)

    def to_json(self) -> dict[str, Any]:
        return {"spearman": self.spearman, "top10_overlap": self.top_overlap,
                "real": np.round(self.real, 6).tolist()}


@dataclass(frozen=True)
class PatchingEstimate:
    """Attribution patching's maps for one clean / corrupted pair, and their agreement with real patching."""

    answer: int
    wrong: int
    clean_diff: float  # the metric on the clean prompt (the model's numerics)
    corrupt_diff: float  # and on the corrupted one
    heads: F64  # (n_layers, n_heads, T) each head's estimated effect at each position
    resid: F64  # (n_layers, T) the residual stream entering each block, at each position
    checks: dict[str, Agreement]  # 'heads' (per head, all positions) and/or 'resid_pre' against real patching

    def per_head(self) -> F64:
        """(n_layers, n_heads): every position of a head patched at once, as patching's `heads` map."""
        return self.heads.sum(axis=-1)

    def to_json(self) -> dict[str, Any]:
        """The `patching` object of `gguf-lens attribute --method patching --json`."""
        return {
            "answer": self.answer, "wrong": self.wrong, "clean_diff": self.clean_diff,
            "corrupt_diff": self.corrupt_diff,
            "heads": np.round(self.heads, 6).tolist(),  # [layer][head][position]
            "resid_pre": np.round(self.resid, 6).tolist(),  # [layer][position]
            "validation": {name: a.to_json() for name, a in self.checks.items()},
        }


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation of two maps over the cells both have (ties ranked by their average)."""
    a, b = np.ravel(a), np.ravel(b)
    ok = np.isfinite(a) & np.isfinite(b)
    ra, rb = _ranks(a[ok]), _ranks(b[ok])
    if ra.size < 2 or np.std(ra) == 0 or np.std(rb) == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(x: np.ndarray) -> np.ndarray:
    """Each value's rank from 0, tied values sharing their average rank."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts
    return (first + (counts - 1) / 2.0)[inverse]


def top_overlap(a: np.ndarray, b: np.ndarray, n: int = TOP) -> float:
    """The share of the n cells largest by |value| in `a` that are among the n largest in `b`."""
    a, b = np.ravel(a), np.ravel(b)
    ok = np.flatnonzero(np.isfinite(a) & np.isfinite(b))
    n = min(n, ok.size)
    if n == 0:
        return float("nan")
    top_a = set(ok[np.argsort(-np.abs(a[ok]), kind="stable")[:n]].tolist())
    top_b = set(ok[np.argsort(-np.abs(b[ok]), kind="stable")[:n]].tolist())
    return len(top_a & top_b) / n


def attribution_patching(model: Model, clean_ids: Sequence[int], corrupt_ids: Sequence[int], answer: int,
                         wrong: int | None = None, validate: Sequence[str] = ("heads",), cancel: Cancel | None = None,
                         progress: Progress | None = None) -> PatchingEstimate:
    """The estimated patching maps of the module docstring; `wrong`: the corrupted run's top token by default;
    `validate`: the real patching maps to compare with ('heads', 'resid_pre'); `cancel` / `progress`: per pass, as the
    module docstring says."""
    clean, corrupt = [int(i) for i in clean_ids], [int(i) for i in corrupt_ids]
    if len(clean) != len(corrupt):
        raise SettingError(f"the clean prompt is {len(clean)} tokens, the corrupted one {len(corrupt)}: attribution "
                           "patching needs prompts of the same length")
    bad = [c for c in validate if c not in CHECKS]
    if bad:
        raise SettingError(f"patching check {bad[0]!r} is not one of {', '.join(CHECKS)}")
    n = model.args.n_layers
    z_names = [f"blocks.{i}.attn.hook_z" for i in range(n)]
    r_names = [f"blocks.{i}.hook_resid_pre" for i in range(n)]
    logits_clean, acts_clean = run_with_cache(model, clean, z_names + r_names)
    logits_corrupt, acts_corrupt = run_with_cache(model, corrupt, z_names + r_names)
    if wrong is None:
        wrong = int(np.argmax(logits_corrupt[-1]))
    if wrong == answer:
        raise SettingError(f"the answer and the wrong token are both #{answer}: there is no difference to restore")
    d_clean = float(logits_clean[-1, answer].astype(np.float64) - logits_clean[-1, wrong])
    d_corrupt = float(logits_corrupt[-1, answer].astype(np.float64) - logits_corrupt[-1, wrong])
    span = d_clean - d_corrupt
    if abs(span) < 1e-6:
        raise SettingError("the clean and corrupted logit differences are equal: nothing to restore")
    stop_if(cancel)
    g = gradient(model, corrupt, answer, wrong, points=z_names + r_names, capped=True)
    heads = np.stack([np.sum(g.d_points[z] * (acts_clean[z] - acts_corrupt[z]), axis=-1).T for z in z_names]) / span
    resid = np.stack([np.sum(g.d_points[r] * (acts_clean[r] - acts_corrupt[r]), axis=-1) for r in r_names]) / span
    runs = {"heads": sum(heads_in(model.net, i) for i in range(n)), "resid_pre": n * len(clean)}  # as patch runs them
    total, done = 1 + sum(runs[kind] for kind in validate), 1
    if progress is not None:
        progress(done, total)
    checks: dict[str, Agreement] = {}
    for kind in validate:
        try:
            real = patch(model, clean, corrupt, kind=kind, answer=answer, wrong=wrong,
                         cancel=_each_run(cancel, progress, done, total)).scores
        except PatchingCancelled as stop:  # its partial map is of no use to the estimate
            raise AttributionCancelled from stop
        done += runs[kind]
        est = heads.sum(axis=-1) if kind == "heads" else resid
        checks[kind] = Agreement(real, spearman(est, real), top_overlap(est, real))
    if progress is not None:
        progress(total, total)
    return PatchingEstimate(answer, wrong, d_clean, d_corrupt, heads, resid, checks)


def _each_run(cancel: Cancel | None, progress: Progress | None, done: int, total: int) -> Cancel:
    """patch's cancel, asked before each of its runs: reports the runs finished so far (`done` before the first),
    then asks `cancel`."""
    begun = [done]

    def ask() -> bool:
        if progress is not None and begun[0] > done:
            progress(begun[0], total)  # the run before this one is done
        begun[0] += 1
        return cancel is not None and bool(cancel())

    return ask
