"""HybridCache: what a hybrid model (attention layers and recurrent DeltaNet layers) keeps between passes.

Attention layers keep post-RoPE K/V rows as in engine.cache.KVCache (only those layers hold rows). A recurrent layer
keeps a constant-size state instead: the last K - 1 inputs of its causal convolution (conv_kernel - 1 rows of its
q|k|v channels) and the delta rule's matrix per value head. Its size does not grow with the conversation.

A KV cache is cut back by forgetting rows; a recurrent state cannot be cut back, because each token folded itself
into it. So the cache keeps snapshots: after a batch of several tokens (a prompt) the state after its last token and
after the one before (regenerating a reply reruns the prompt's last token from there), after a single token the
state before it (one step back, at no cost: the previous arrays are kept, not copied). `truncate(n)` restores the
latest snapshot at or before n; the positions between it and n are dropped and run again by the caller (prefill
reruns whatever the cache no longer holds), so `common_prefix` reports only prefixes the cache can resume from.
`restored_from` says what the last truncate did (for the chat's statistics and the tests).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cache import KVCache

MAX_SNAPSHOTS = 6  # prompt positions kept besides the current state and the one before it (oldest dropped first)


@dataclass
class RecurrentState:
    """One recurrent layer's state: conv (K - 1, channels) and the delta rule's (H, S, S) (row j: column j of S)."""

    conv: np.ndarray
    ssm: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.conv.nbytes + self.ssm.nbytes)


@dataclass(frozen=True)
class RecurrentShape:
    """The state's shape of every recurrent layer of a model."""

    conv_rows: int  # conv_kernel - 1
    channels: int  # q|k|v channels of the convolution
    heads: int  # value heads
    size: int  # head dim (keys and values alike)

    @property
    def nbytes(self) -> int:
        """One layer's state in bytes (float32), the same at every context length."""
        return 4 * (self.conv_rows * self.channels + self.heads * self.size * self.size)

    def zeros(self) -> RecurrentState:
        return RecurrentState(np.zeros((self.conv_rows, self.channels), np.float32),
                              np.zeros((self.heads, self.size, self.size), np.float32))


class HybridCache(KVCache):
    """KV rows for the attention layers, a recurrent state for each of `recurrent` layers (see the module doc)."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, n_ctx: int, cache_type: str,
                 recurrent: frozenset[int], shape: RecurrentShape):
        super().__init__(n_layers, n_kv_heads, head_dim, n_ctx, cache_type,
                         kv_layers=frozenset(set(range(n_layers)) - set(recurrent)))
        self.recurrent = recurrent
        self.shape = shape
        self.states: dict[int, RecurrentState] = {i: shape.zeros() for i in recurrent}  # after the committed tokens
        self.pending: dict[int, tuple[RecurrentState, RecurrentState | None]] = {}  # the last forward's (final, pre-last)
        self.snapshots: dict[int, dict[int, RecurrentState]] = {}  # position -> layer -> state
        self.marks: set[int] = set()  # positions kept for later (prompt ends), besides the rolling one step back
        self.restored_from: int | None = None  # the position the last truncate resumed from (None: nothing cut)

    # ---- what a recurrent layer reads and writes

    def state(self, layer: int) -> RecurrentState:
        """The layer's state after the committed tokens (not to be changed in place)."""
        return self.states[layer]

    def put_state(self, layer: int, final: RecurrentState, before_last: RecurrentState | None) -> None:
        """The state a forward reached for this layer after its last token (and after the one before)."""
        self.pending[layer] = (final, before_last)

    # ---- commit and cut back

    def commit(self, tokens: list[int]) -> None:
        n0, t = self.length, len(tokens)
        super().commit(tokens)
        if not self.pending:
            return
        if t > 1:  # a prompt: the state after its last token and after the one before are kept
            before = {i: p[1] for i, p in self.pending.items() if p[1] is not None}
            if len(before) == len(self.recurrent):
                self.snapshots[n0 + t - 1] = before
                self.marks.add(n0 + t - 1)
            self.marks.add(self.length)
        self.states = {i: p[0] for i, p in self.pending.items()}
        self.snapshots[self.length] = dict(self.states)
        self.pending = {}
        marks = sorted(self.marks)[-MAX_SNAPSHOTS:]  # the latest prompts' positions, and one step back from now
        self.marks = set(marks)
        keep = self.marks | {self.length, self.length - 1}
        self.snapshots = {p: s for p, s in self.snapshots.items() if p in keep}

    def resumable(self, n: int) -> int:
        """The longest prefix of length <= n the cache can resume from: n itself or a snapshot's position (0 always)."""
        n = max(0, min(n, self.length))
        if n == self.length:
            return n
        return max((p for p in self.snapshots if p <= n), default=0)

    def truncate(self, n: int) -> None:
        self.pending = {}
        n = max(0, n)
        if n >= self.length:
            self.restored_from = None
            return
        at = self.resumable(n)
        states = self.snapshots.get(at)
        self.states = dict(states) if states is not None and at > 0 else {i: self.shape.zeros() for i in self.recurrent}
        self.snapshots = {p: s for p, s in self.snapshots.items() if p <= at}
        self.marks = {p for p in self.marks if p <= at}
        self.restored_from = at
        super().truncate(at)

    def common_prefix(self, tokens: list[int]) -> int:
        """How many leading tokens of `tokens` the cache holds and can resume after (see the module doc)."""
        return self.resumable(super().common_prefix(tokens))

    # ---- size

    @property
    def state_bytes(self) -> int:
        """Bytes of the recurrent layers' current state (constant in the context length)."""
        return sum(s.nbytes for s in self.states.values())

    @property
    def nbytes(self) -> int:
        return self.bytes_for(self.length) + self.state_bytes

    @property
    def snapshot_bytes(self) -> int:
        """Bytes held by the snapshots that are not the current state's arrays."""
        current = {id(s.ssm) for s in self.states.values()}
        seen: set[int] = set()
        total = 0
        for layers in self.snapshots.values():
            for s in layers.values():
                if id(s.ssm) not in current and id(s.ssm) not in seen:
                    seen.add(id(s.ssm))
                    total += s.nbytes
        return total
