"""Activation patching: which layer and position carry what makes a clean prompt's answer differ from a corrupted one's.

The standard figure (TransformerLens's): the two prompts have the same length; the answer is the clean run's top next
token, the wrong answer the corrupted run's (or tokens given); the metric is the last position's logit difference
answer - wrong. For every layer L and position p the corrupted prompt runs with the residual stream entering block L
at position p taken from the clean run (`resid_pre`), and the cell holds how much of the clean difference that
restores: (patched - corrupted) / (clean - corrupted), 1 = all of it. Each patched run reuses the corrupted run's
cache below L (those blocks do not see the patch) and runs blocks L.. only. `kind="attn_out"` / `"mlp_out"` patch
what a block's attention or FFN adds instead; `kind="heads"` patches one head's output (hook_z) at every position,
and the map is layers x heads.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import SettingError
from engine.intervene.ablation import heads_in
from engine.intervene.hooks import hooked, run_with_cache

if TYPE_CHECKING:
    from engine.model import Model

KINDS = {"resid_pre": "hook_resid_pre", "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out", "heads": "attn.hook_z"}


class PatchingCancelled(SettingError):
    """The caller's cancel() said stop; the cells done so far are in `partial`."""

    def __init__(self, partial: PatchResult):
        super().__init__("activation patching cancelled")
        self.partial = partial


@dataclass(frozen=True)
class PatchResult:
    scores: np.ndarray  # (n_layers, T or n_heads): the share of the clean logit difference restored; NaN: not run
    clean_diff: float
    corrupt_diff: float
    answer: int
    wrong: int
    kind: str
    clean_ids: tuple[int, ...]
    corrupt_ids: tuple[int, ...]


def _diff(logits: np.ndarray, answer: int, wrong: int) -> float:
    row = logits[-1].astype(np.float64)
    return float(row[answer] - row[wrong])


def patch(model: Model, clean_ids: Sequence[int], corrupt_ids: Sequence[int], *, kind: str = "resid_pre",
          answer: int | None = None, wrong: int | None = None, progress: Callable[[float], None] | None = None,
          cancel: Callable[[], bool] | None = None) -> PatchResult:
    """The (layers x positions) patching map of the module docstring."""
    if kind not in KINDS:
        raise SettingError(f"patching kind {kind!r} is not one of {', '.join(KINDS)}")
    clean, corrupt = list(clean_ids), list(corrupt_ids)
    if len(clean) != len(corrupt):
        raise SettingError(f"the clean prompt is {len(clean)} tokens, the corrupted one {len(corrupt)}: patching "
                           "needs prompts of the same length")
    if not clean:
        raise SettingError("patching needs prompts of at least one token")
    n_layers, point = model.args.n_layers, KINDS[kind]
    names = [f"blocks.{i}.{point}" for i in range(n_layers)]
    logits_clean, acts_clean = run_with_cache(model, clean, names)
    cache = model.new_cache(len(corrupt))
    logits_corrupt = model.net.forward(corrupt, cache, all_logits=True)  # the cache below each L is reused
    answer = int(np.argmax(logits_clean[-1])) if answer is None else int(answer)
    wrong = int(np.argmax(logits_corrupt[-1])) if wrong is None else int(wrong)
    if answer == wrong:
        raise SettingError(f"both prompts predict token {answer}: there is no difference to restore (give the "
                           "answer and wrong tokens)")
    d_clean, d_corrupt = _diff(logits_clean, answer, wrong), _diff(logits_corrupt, answer, wrong)
    span = d_clean - d_corrupt
    if abs(span) < 1e-6:
        raise SettingError("the clean and corrupted logit differences are equal: nothing to restore")
    heads = kind == "heads"
    per_layer = [heads_in(model.net, i) for i in range(n_layers)]  # a recurrent layer's value heads
    scores = np.full((n_layers, max(per_layer) if heads else len(clean)), np.nan)
    x0 = model.net.embed(np.asarray(corrupt, np.int64))
    net = model.net
    for layer in range(n_layers):
        for p in range(per_layer[layer] if heads else scores.shape[1]):  # NaN past a layer's own heads
            if cancel is not None and cancel():
                raise PatchingCancelled(PatchResult(scores, d_clean, d_corrupt, answer, wrong, kind, tuple(clean),
                                                    tuple(corrupt)))
            cell = (slice(None), p) if heads else (p,)  # a head at every position, or every channel at a position
            source = acts_clean[names[layer]][cell]

            def put(value: np.ndarray, name: str, cell: tuple = cell, source: np.ndarray = source) -> np.ndarray:
                value = value.copy()
                value[cell] = source
                return value

            with hooked(model, [(names[layer], put)]):
                if layer == 0:
                    logits = net.forward(corrupt, model.new_cache(len(corrupt)), all_logits=True)
                else:  # blocks below `layer` are the corrupted run's: start from its residual entering `layer`
                    x = _resid_entering(net, x0, cache, layer)
                    net.begin(cache)
                    logits = net.head(net.run_layers(x, 0, cache, None, range(layer, n_layers)), False)
            scores[layer, p] = (_diff(logits, answer, wrong) - d_corrupt) / span
        if progress is not None:
            progress((layer + 1) / n_layers)
    return PatchResult(scores, d_clean, d_corrupt, answer, wrong, kind, tuple(clean), tuple(corrupt))


def _resid_entering(net, x0: np.ndarray, cache, layer: int) -> np.ndarray:  # noqa: ANN001
    """The corrupted run's residual stream entering `layer` (memoised on the cache object per layer)."""
    memo = getattr(cache, "_patch_resid", None)
    if memo is None:
        memo = {}
        with hooked_capture(net, memo):
            net.begin(cache)
            net.run_layers(x0, 0, cache, None, range(net.args.n_layers))
        cache._patch_resid = memo
    return memo[layer]


class hooked_capture:  # noqa: N801 - a context manager named as the verb it performs
    """Keep a copy of every block's resid_pre in `memo` (layer -> (T, dim)) during one run."""

    def __init__(self, net, memo: dict[int, np.ndarray]):  # noqa: ANN001
        self.net, self.memo = net, memo

    def __enter__(self) -> None:
        self.before = self.net.hooks

        def keep(layer: int) -> Callable[[np.ndarray, str], None]:
            return lambda value, name: self.memo.__setitem__(layer, value.copy())

        self.net.hooks = {f"blocks.{i}.hook_resid_pre": keep(i) for i in range(self.net.args.n_layers)}

    def __exit__(self, *exc: object) -> None:
        self.net.hooks = self.before
