"""routing_changes: which token-layer pairs choose another set of experts in run B than in run A."""
from __future__ import annotations

import numpy as np

from engine.observe.routing import LayerRouting, routing_changes


def _layer(layer: int, experts: np.ndarray) -> LayerRouting:
    n, k = experts.shape
    weights = np.full((n, k), 1.0 / k, np.float32)
    probs = np.full((n, 8), 1.0 / 8, np.float32)
    return LayerRouting(layer, experts.astype(np.int32), weights, probs)


def test_the_order_within_a_set_is_not_a_change_and_each_swap_counts() -> None:
    rng = np.random.default_rng(0)
    a = np.stack([rng.permutation(8)[:3] for _ in range(10)])
    reordered = a[:, ::-1].copy()  # the same experts, another order (other weights): the same set
    swapped = a.copy()
    for pos in range(0, 10, 2):  # one expert of every other position replaced by one it did not choose
        swapped[pos, 1] = next(e for e in range(8) if e not in a[pos])
    changes = routing_changes([_layer(0, a), _layer(3, a)], [_layer(0, reordered), _layer(3, swapped)], 10)
    assert [c.layer for c in changes] == [0, 3]
    assert changes[0].changed_pct == 0 and changes[0].swapped_mean == 0
    assert changes[1].changed_pct == 50 and changes[1].swapped_mean == 0.5
    assert routing_changes([_layer(0, a)], [_layer(0, swapped)], 1)[0].changed_pct == 100  # the first position only
    assert routing_changes([_layer(0, a)], [], 10) == () and routing_changes([_layer(0, a)], [_layer(0, a)], 0) == ()
