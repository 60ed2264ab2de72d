"""RoutingRecord: a Mixture-of-Experts model's routing over the chat, for the Experts lens (made on the worker).

Read from the session's Recorder (engine.observe.routing): per MoE layer the experts each token chose with their
weights and the router's probabilities, plus the tokens' texts. Plain arrays; the lens only draws them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.observe.routing import LayerRouting, routing_layers

if TYPE_CHECKING:
    from engine.cache import KVCache
    from engine.model import Model
    from engine.observe.recorder import Recorder


@dataclass(frozen=True)
class RoutingRecord:
    """The routing of the first n_tokens positions of the chat, one LayerRouting per MoE layer (in layer order)."""

    n_tokens: int
    token_texts: tuple[str, ...]
    layers: tuple[LayerRouting, ...]
    n_expert: int
    k: int
    elapsed_s: float = 0.0

    def layer(self, index: int) -> LayerRouting | None:
        return next((lr for lr in self.layers if lr.layer == index), None)


def make_routing_record(model: Model, recorder: Recorder, cache: KVCache | None, texts: list[str]) -> RoutingRecord | None:
    """The routing the recorder holds for the positions in the cache; None for a dense model or an empty chat."""
    t0 = time.perf_counter()
    args = model.args
    if not getattr(args, "n_expert", 0) or recorder is None:
        return None
    n = min(recorder.length, cache.length if cache is not None else recorder.length, len(texts))
    if n == 0:
        return None
    layers = []
    for lr in routing_layers(recorder, args.n_layers):
        m = min(n, lr.experts.shape[0])
        layers.append(LayerRouting(lr.layer, lr.experts[:m], lr.weights[:m], lr.probs[:m]))
    if not layers:
        return None
    n = min(lr.experts.shape[0] for lr in layers)
    return RoutingRecord(n, tuple(texts[:n]), tuple(layers), int(args.n_expert), int(args.n_expert_used),
                         time.perf_counter() - t0)
