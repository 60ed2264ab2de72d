"""What the Why lens draws (no Qt): one reply token's logit (or its difference to a contrast token's) split into the
parts of the model that wrote it (engine.attribute), and what a real ablation of one part did to it.

`make_attribution_record` turns engine.attribute.api.Attribution into an AttributionRecord: the components as
aligned arrays (kind, layer, index, value; they sum to `logit_diff`), every head's share as a layers x heads matrix
(NaN where a layer has no such head), the conversation's token texts and where the last reply starts (the picker), and
the per-token input attributions when the engine gave them (`inputs`: input x gradient, integrated gradients).

`make_patching_record` turns engine.attribute.attribution_patching.PatchingEstimate into a PatchingRecord: each head's
estimated patching effect (every position at once) and real activation patching's, as layers x heads maps, with their
Spearman rank correlation and top-10 overlap.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]
NO_INDEX = -1  # engine.attribute.api.NO_INDEX: the embedding's layer, a whole block's index
REMAINDER = "remainder"
ABLATABLE = ("head", "ffn", "expert")  # what "Confirm by ablation" can switch off (engine.intervene.ablation)
TOP_HEADS = 10  # the top heads compared by attribution patching's check (engine.attribute.attribution_patching.TOP)


def component_label(kind: str, layer: int, index: int) -> str:
    """'head L23.3', 'ffn L27', 'expert L5.12', 'embed', 'remainder L4', 'remainder (head)'."""
    if kind == "embed":
        return "embed"
    if layer == NO_INDEX:
        return f"{kind} (output)" if kind == REMAINDER else kind
    return f"{kind} L{layer}" + (f".{index}" if index != NO_INDEX else "")


REPLY_TOKEN = 1 << 30  # a token index at or past this asks for token (index - REPLY_TOKEN) of the last reply (a token
# clicked in the chat: the lens maps it to the conversation when it reads it)


@dataclass(frozen=True)
class AttributionRecord:
    """One position's logit (difference) split into parts, for the Why lens (arrays aligned, one entry per part)."""

    token_texts: tuple[str, ...]  # the conversation's tokens as the model read it
    reply_start: int  # index of the last reply's first token (len(token_texts): no reply)
    token_index: int  # the token explained: token_texts[token_index] was generated after position token_index - 1
    position: int  # token_index - 1: whose next-token logits are split
    target_id: int
    target_text: str
    contrast_id: int | None
    contrast_text: str | None
    logit_diff: float  # the model's logit of the target minus the contrast's (or the target's alone), before any cap
    kinds: npt.NDArray[np.str_]
    layers: npt.NDArray[np.int32]
    indices: npt.NDArray[np.int32]
    values: F64  # they sum to logit_diff
    heads: F64  # (n_layers, max heads) each head's value, NaN where there is no such head
    numerics: str
    elapsed_s: float
    inputs: F64 | None = None  # (position + 1,) each input token's attribution, when the engine computed them
    inputs_method: str = ""
    token_ids: tuple[int, ...] = ()  # the conversation's ids (what A and B of Compare are run on)

    @property
    def n_parts(self) -> int:
        return int(self.values.size)

    def label(self, i: int) -> str:
        """The name of part i as the lens and the CLI write it."""
        return component_label(str(self.kinds[i]), int(self.layers[i]), int(self.indices[i]))

    def top(self, n: int = 15) -> list[int]:
        """Indices of the n parts with the largest |value| (remainders left out), largest first."""
        keep = np.flatnonzero(self.kinds != REMAINDER)
        return [int(i) for i in keep[np.argsort(-np.abs(self.values[keep]), kind="stable")][:n]]

    def waterfall(self, n: int = 15) -> list[tuple[str, float, int | None]]:
        """The bars of the waterfall: the top n parts in the model's order (embedding, layer by layer; a head before
        its layer's FFN), then 'other parts' (the rest, remainders included) when not zero; (label, value, part index
        or None). Their sum is logit_diff."""
        chosen = sorted(self.top(n), key=self._order)
        bars: list[tuple[str, float, int | None]] = [(self.label(i), float(self.values[i]), i) for i in chosen]
        rest = float(self.values.sum() - sum(v for _, v, _ in bars))
        n_rest = self.n_parts - len(chosen)
        if n_rest:
            bars.append((f"other {n_rest} parts", rest, None))
        return bars

    def _order(self, i: int) -> tuple[int, int, int]:
        kind_rank = {"embed": 0, "head": 1, "bias": 2, "ffn": 3, "shared_expert": 4, "expert": 5}
        layer = int(self.layers[i])
        return (-1 if str(self.kinds[i]) == "embed" else layer if layer != NO_INDEX else 1 << 30,
                kind_rank.get(str(self.kinds[i]), 9), int(self.indices[i]))

    def find(self, kind: str, layer: int, index: int = NO_INDEX) -> int | None:
        """The index of a part, None if there is none."""
        hit = np.flatnonzero((self.kinds == kind) & (self.layers == layer) & (self.indices == index))
        return int(hit[0]) if hit.size else None

    def describe_target(self) -> str:
        """"' cat'" or "' cat' rather than ' dog'"."""
        if self.contrast_text is None:
            return repr(self.target_text)
        return f"{self.target_text!r} rather than {self.contrast_text!r}"


@dataclass(frozen=True)
class AblationCheck:
    """A real ablation of one part, run on the same tokens: the logit (difference) with and without it."""

    kind: str
    layer: int
    index: int
    token_index: int
    base: float  # the logit (difference) of the model as it is (pre soft-cap)
    ablated: float  # the same with the part switched off
    estimate: float  # the part's direct attribution
    elapsed_s: float

    @property
    def effect(self) -> float:
        """What the part added in the real run (base - ablated): its direct share plus what it moved downstream."""
        return self.base - self.ablated

    @property
    def label(self) -> str:
        return component_label(self.kind, self.layer, self.index)


@dataclass(frozen=True)
class AttributionPair:
    """The same attribution in A and B of the Compare tab (the file, and the B of its last comparison)."""

    a: AttributionRecord
    b: AttributionRecord
    a_label: str
    b_label: str
    elapsed_s: float

    def moved(self, n: int = 8) -> list[tuple[str, float, float]]:
        """The n parts whose value changed most from A to B, (label, value in A, value in B), largest change first;
        a part only one side has (an expert routed in one) counts 0 on the other."""
        sides = []
        for rec in (self.a, self.b):
            sides.append({(str(k), int(layer), int(i)): float(v) for k, layer, i, v
                          in zip(rec.kinds, rec.layers, rec.indices, rec.values)})
        keys = [k for k in dict.fromkeys([*sides[0], *sides[1]]) if k[0] != REMAINDER]
        rows = [(component_label(*k), sides[0].get(k, 0.0), sides[1].get(k, 0.0)) for k in keys]
        rows.sort(key=lambda r: -abs(r[2] - r[1]))
        return rows[:n]


def head_matrix(kinds: np.ndarray, layers: np.ndarray, indices: np.ndarray, values: np.ndarray,
                n_layers: int, heads_per_layer: list[int]) -> F64:
    """(n_layers, max heads): each head part's value at (layer, head), NaN where the layer has no such head, 0 for a
    head the attribution did not list."""
    width = max(heads_per_layer, default=0)
    out = np.full((n_layers, width), np.nan)
    for layer, n in enumerate(heads_per_layer):
        out[layer, :n] = 0.0
    sel = np.flatnonzero(kinds == "head")
    for i in sel:
        layer, head = int(layers[i]), int(indices[i])
        if 0 <= layer < n_layers and 0 <= head < heads_per_layer[layer]:
            out[layer, head] = float(values[i])
    return out


def make_attribution_record(result: Any, token_texts: list[str], reply_start: int, heads_per_layer: list[int],
                            elapsed_s: float, token_ids: tuple[int, ...] = ()) -> AttributionRecord:
    """The record of engine.attribute.api.Attribution `result` over a conversation of `token_texts`."""
    kinds = np.asarray(result.kinds).astype(str)
    layers = np.asarray(result.layers, np.int32)
    indices = np.asarray(result.indices, np.int32)
    values = np.asarray(result.values, np.float64)
    inputs, method = _inputs(getattr(result, "inputs", None))
    con = result.contrast
    return AttributionRecord(
        token_texts=tuple(token_texts), reply_start=int(reply_start), token_index=int(result.position) + 1,
        position=int(result.position), target_id=int(result.target.id), target_text=str(result.target.text),
        contrast_id=None if con is None else int(con.id), contrast_text=None if con is None else str(con.text),
        logit_diff=float(result.logit_diff), kinds=kinds, layers=layers, indices=indices, values=values,
        heads=head_matrix(kinds, layers, indices, values, len(heads_per_layer), heads_per_layer),
        numerics=str(result.numerics), elapsed_s=float(elapsed_s), inputs=inputs, inputs_method=method,
        token_ids=tuple(int(t) for t in token_ids))


def _inputs(got: Any) -> tuple[F64 | None, str]:
    """Per-token input attributions from whatever the engine returned (an object with `values`, or an array)."""
    if got is None:
        return None, ""
    if isinstance(got, (list, tuple)) and got and not np.isscalar(got[0]):
        got = got[0]  # several methods: the first
    values = getattr(got, "values", got)
    try:
        arr = np.asarray(values, np.float64).reshape(-1)
    except (TypeError, ValueError):
        return None, ""
    return (arr if arr.size else None), str(getattr(got, "method", ""))


@dataclass(frozen=True)
class PatchingRecord:
    """Attribution patching of one token for a clean / corrupted pair, checked against real patching of each head."""

    token_index: int  # the token explained: the clean prompt is the conversation's tokens before it
    n_tokens: int  # the clean prompt's tokens (the corrupted one has as many)
    target_text: str  # the answer: the token the reply wrote
    wrong_text: str  # the contrast token, else the corrupted run's top token
    corrupt_text: str
    clean_diff: float  # logit(answer) - logit(wrong) on the clean prompt
    corrupt_diff: float  # and on the corrupted one
    estimate: F64  # (n_layers, max heads) each head's estimated share of the difference restored; NaN: no such head
    real: F64  # (n_layers, max heads) real activation patching's share
    spearman: float  # rank correlation of estimate and real over every head
    top_overlap: float  # share of the top-10 heads by |estimate| among the top-10 by |real|
    elapsed_s: float

    @property
    def n_heads(self) -> int:
        """The heads compared (the cells both maps have)."""
        return int(np.count_nonzero(np.isfinite(self.estimate) & np.isfinite(self.real)))

    def agreement_text(self) -> str:
        """'estimate vs real patching of 8 heads: Spearman 0.55, top-10 overlap 8/8'."""
        top = min(TOP_HEADS, self.n_heads)
        return (f"estimate vs real patching of {self.n_heads} heads: Spearman {self.spearman:.2f}, top-{TOP_HEADS} "
                f"overlap {round(self.top_overlap * top)}/{top}")

    def diff_text(self) -> str:
        """The logit difference the maps restore, on both prompts."""
        return (f"logit({self.target_text!r}) − logit({self.wrong_text!r}) at token {self.token_index}: clean "
                f"{self.clean_diff:+.4f}, corrupted {self.corrupt_diff:+.4f} ({self.n_tokens} tokens each)")


def make_patching_record(est: Any, token_index: int, n_tokens: int, target_text: str, wrong_text: str,
                         corrupt_text: str, elapsed_s: float) -> PatchingRecord:
    """The record of engine.attribute.attribution_patching.PatchingEstimate `est` (its 'heads' check)."""
    check = est.checks["heads"]
    real = np.asarray(check.real, np.float64)
    estimate = np.asarray(est.per_head(), np.float64).copy()
    estimate[~np.isfinite(real)] = np.nan  # past a layer's own heads (a recurrent layer's value heads)
    return PatchingRecord(int(token_index), int(n_tokens), str(target_text), str(wrong_text), str(corrupt_text),
                          float(est.clean_diff), float(est.corrupt_diff), estimate, real, float(check.spearman),
                          float(check.top_overlap), float(elapsed_s))
