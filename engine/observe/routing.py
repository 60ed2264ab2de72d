"""What a Mixture-of-Experts model's routers did: per token and layer the chosen experts and their weights, the
router's entropy; per layer each expert's load; per expert the tokens it was chosen for.

Read from a Recorder after a forward pass (Recorder.routing_of: what engine.models.experts recorded, the experts
in the order llama.cpp's ggml_argsort_top_k gives them). Plain data, ready for JSON (`gguf-lens routing`) and for
the app's lens.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.observe.recorder import Recorder


@dataclass(frozen=True)
class LayerRouting:
    """One MoE layer over the recorded positions."""

    layer: int
    experts: npt.NDArray[np.int32]  # (N, k) chosen experts, highest probability first
    weights: npt.NDArray[np.float32]  # (N, k) the weights their outputs were multiplied by
    probs: npt.NDArray[np.float32]  # (N, n_expert) the router's softmax

    @property
    def n_expert(self) -> int:
        return int(self.probs.shape[1])

    def entropy(self) -> npt.NDArray[np.float64]:
        """The router's entropy per position, in bits (log2 n_expert: no preference at all)."""
        p = self.probs.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, -p * np.log2(p), 0.0)
        return terms.sum(axis=1)

    def load(self) -> npt.NDArray[np.int64]:
        """How many positions chose each expert (n_expert,)."""
        return np.bincount(self.experts.reshape(-1), minlength=self.n_expert).astype(np.int64)

    def weight_share(self) -> npt.NDArray[np.float64]:
        """Each expert's summed weight over the positions, as a share of all weight (n_expert,)."""
        total = np.zeros(self.n_expert, np.float64)
        np.add.at(total, self.experts.reshape(-1), self.weights.reshape(-1).astype(np.float64))
        s = total.sum()
        return total / s if s > 0 else total

    def part(self, start: int, stop: int) -> LayerRouting:
        """The positions [start, stop) alone (a reply's reasoning or its answer)."""
        sl = slice(max(0, start), max(0, stop))
        return LayerRouting(self.layer, self.experts[sl], self.weights[sl], self.probs[sl])

    def positions_of(self, expert: int) -> list[int]:
        """The positions that chose `expert`."""
        return np.nonzero((self.experts == expert).any(axis=1))[0].tolist()


def routing_layers(recorder: Recorder, n_layers: int) -> list[LayerRouting]:
    """Every MoE layer the recorder saw, in layer order (empty for a dense model)."""
    out = []
    for i in range(n_layers):
        got = recorder.routing_of(i)
        if got is not None:
            experts, weights, probs = got
            out.append(LayerRouting(i, experts, weights, probs.astype(np.float32)))
    return out


def routing_report(layers: list[LayerRouting], token_texts: list[str]) -> dict:
    """The JSON report: per position and layer the experts, weights and entropy; per layer the load and weight
    share of each expert and the tokens each expert was chosen for."""
    n = min([len(token_texts)] + [int(lr.experts.shape[0]) for lr in layers]) if layers else 0
    tokens = []
    for pos in range(n):
        tokens.append({"position": pos, "text": token_texts[pos], "layers": [
            {"layer": lr.layer, "experts": lr.experts[pos].tolist(),
             "weights": [round(float(w), 6) for w in lr.weights[pos]], "entropy_bits": round(float(lr.entropy()[pos]), 4)}
            for lr in layers]})
    per_layer = []
    for lr in layers:
        share = lr.weight_share()
        per_layer.append({"layer": lr.layer, "n_expert": lr.n_expert, "k": int(lr.experts.shape[1]),
                          "mean_entropy_bits": round(float(lr.entropy()[:n].mean()) if n else 0.0, 4),
                          "load": lr.load().tolist(), "weight_share": [round(float(x), 6) for x in share],
                          "tokens_of_expert": {str(e): [token_texts[p] for p in lr.positions_of(e) if p < n]
                                               for e in range(lr.n_expert)}})
    return {"n_positions": n, "moe_layers": [lr.layer for lr in layers], "tokens": tokens, "layers": per_layer}


@dataclass(frozen=True)
class RoutingChange:
    """One MoE layer of two runs on the same tokens (A, B): where B's router chose other experts than A's."""

    layer: int
    changed_pct: float  # share of positions whose chosen set of experts differs, in percent
    swapped_mean: float  # experts per position in B's set and not in A's (0..k), averaged over positions


def routing_changes(a: list[LayerRouting], b: list[LayerRouting], n: int) -> tuple[RoutingChange, ...]:
    """Per MoE layer of both runs, over the first n positions: how many token-layer pairs choose another set of
    experts (the order within the set is ignored: the same experts with other weights are the same set). A
    quantization's damage to routing, which the KLD of the output alone does not show."""
    by_layer = {lr.layer: lr for lr in b}
    out = []
    for la in a:
        lb = by_layer.get(la.layer)
        if lb is None or lb.experts.shape[1] != la.experts.shape[1]:
            continue
        m = min(n, la.experts.shape[0], lb.experts.shape[0])
        if m == 0:
            continue
        ea, eb = np.sort(la.experts[:m], axis=1), np.sort(lb.experts[:m], axis=1)
        differs = (ea != eb).any(axis=1)
        k = ea.shape[1]
        same = np.array([len(np.intersect1d(x, y, assume_unique=True)) for x, y in zip(ea, eb)], np.int64)
        out.append(RoutingChange(la.layer, float(100.0 * differs.mean()), float((k - same).mean())))
    return tuple(out)
