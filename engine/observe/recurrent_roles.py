"""Head roles of a hybrid's recurrent (gated DeltaNet) layers, scored on their read maps, beside the attention heads.

engine.observe.head_roles scores a head on rows of weights over the keys (previous token, first token, self,
induction, broad, local). A recurrent value head has such rows too: the shares of |W[t, s]| (what token t's
output takes from the value of each earlier token s, engine.observe.recurrent_maps), so the same scores apply
to it unchanged, over the positions its reads were decomposed for (at least the last WINDOW ones, the window's
start moving in strides, engine.observe.recurrent_extend: for a longer recording "first token" means the window's
first, and the keys before it are the earlier context, scored as nothing).

`merge_roles` puts the attention layers' and the recurrent layers' scores into one HeadRoles, layers in model
order and as wide as the widest (missing heads NaN). The sinks stay the attention layers' own: a sink is where
softmax parks attention it must spend, and a recurrent head has no softmax to park.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.observe.head_roles import ROLES, HeadRoles, score_heads
from engine.observe.recurrent_maps import LayerReads


def recurrent_head_roles(reads: dict[int, LayerReads], tokens: Sequence[int], n: int,
                         max_rows: int | None = 512) -> HeadRoles | None:
    """Score every value head of the recurrent layers `reads` on its read shares over positions [start, n)."""
    if not reads:
        return None
    layers = sorted(reads)
    start = max(r.start for r in reads.values())
    n = min(n, len(tokens))
    if n - start <= 0:
        return None

    def attend(layer: int, rows: np.ndarray) -> np.ndarray:
        shares, _s, _e = reads[layer].full_rows(np.asarray(rows) + start, n, with_signed=False)  # (H, R, n)
        return np.nan_to_num(shares[:, :, start:]).astype(np.float32)  # keys relative to the window

    roles = score_heads(attend, layers, {i: None for i in layers}, list(tokens[start:n]), max_rows=max_rows)
    if start == 0:
        return roles
    pad = ((0, 0), (0, 0), (start, 0))
    return HeadRoles(roles.layers, roles.scores, np.pad(roles.received, pad),
                     np.pad(roles.uniform, ((0, 0), (start, 0)), constant_values=np.inf),
                     tuple(), roles.rows + start, n)


def merge_roles(attn: HeadRoles | None, rec: HeadRoles | None) -> HeadRoles | None:
    """One HeadRoles of both kinds of layer (either may be None), rows in model-layer order."""
    if attn is None or rec is None:
        return attn if rec is None else rec
    layers = tuple(sorted(attn.layers + rec.layers))
    width = max(_heads(attn), _heads(rec))
    n = max(attn.n_tokens, rec.n_tokens)
    scores = {role: np.full((len(layers), width), np.nan, np.float32) for role in ROLES}
    received = np.zeros((len(layers), width, n), np.float32)
    uniform = np.full((len(layers), n), np.inf, np.float32)
    for part in (attn, rec):
        h, m = _heads(part), part.received.shape[-1]
        for li, layer in enumerate(part.layers):
            row = layers.index(layer)
            for role in ROLES:
                scores[role][row, :h] = part.scores[role][li]
            received[row, :h, :m] = part.received[li]
            uniform[row, :m] = part.uniform[li]
    return HeadRoles(layers, scores, received, uniform, attn.sinks, attn.rows, n)


def _heads(roles: HeadRoles) -> int:
    return int(roles.scores[ROLES[0]].shape[1]) if roles.scores else 0
