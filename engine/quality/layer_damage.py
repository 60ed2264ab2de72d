"""Each layer's own contribution to the divergence of two models: B's layer run on A's input to it.

The accumulated per-layer divergence (compare.layer_divergence) mixes what a layer does with what
every earlier layer passed on. Here layer i of B gets exactly the residual stream that entered
layer i in A's run, and its output is compared with A's output of that layer: what layer i alone
changes. (The other way to split the curve, the difference between consecutive layers of the
accumulated divergence, lets later layers amplify or cancel earlier damage; this one does not.)
"""
from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.errors import LensError

if TYPE_CHECKING:
    from engine.model import Model

F32 = npt.NDArray[np.float32]
METHOD = "B's layer run on A's input to it, against A's output"


def own_layer_divergence(
    a: Model, b: Model, ids: Sequence[int], hidden_a: Mapping[int, np.ndarray], *,
    cache_type: str | None = None, cancel: threading.Event | None = None,
) -> tuple[F32, F32]:
    """(rel L2, mean cosine) per layer of B's layer i on A's input against A's output of layer i."""
    n = len(ids)
    net = b.net
    n_layers = int(net.args.n_layers)
    cache = net.new_cache(max(n, 16), cache_type)
    cache.reserve(n)
    net.begin(cache)
    x_in = a.net.embed(np.asarray(ids, np.int64))
    rel, cos = np.zeros(n_layers, np.float32), np.zeros(n_layers, np.float32)
    for i in range(n_layers):
        if cancel is not None and cancel.is_set():
            raise LensError("comparison cancelled")
        ref = np.asarray(hidden_a[i][:n], np.float64)
        y = np.asarray(net.run_layers(np.array(x_in, np.float32), 0, cache, None, range(i, i + 1)), np.float64)
        rel[i] = np.linalg.norm(y - ref) / max(float(np.linalg.norm(ref)), 1e-30)
        c = np.sum(y * ref, -1) / np.maximum(np.linalg.norm(y, axis=-1) * np.linalg.norm(ref, axis=-1), 1e-30)
        cos[i] = float(c.mean())
        x_in = hidden_a[i][:n]
    return rel, cos
