"""Observation of a forward pass: post-RoPE queries per layer, attention recomputed on demand, hidden states.

Nothing here costs anything unless a Recorder is passed to the forward pass. Attention weights are never
stored as layers x heads x N x N: they are recomputed for the rows a view asks for from the recorded
queries and the keys in the KV cache.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.models.args import LayerAttentionSpec
from engine.ops.reference import causal_mask, soft_cap, softmax, softmax_with_sinks


@dataclass
class Recorder:
    """Collects what the views need while the model runs; passed down like the cache."""

    capture_q: bool = True
    capture_hidden: bool = False
    q: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (Hq, N, d) post-RoPE queries
    hidden: dict[int, np.ndarray] = field(default_factory=dict)  # layer -> (N, dim) residual stream after the layer
    specs: dict[int, LayerAttentionSpec] = field(default_factory=dict)
    length: int = 0  # positions recorded (committed)
    # called with (weight tensor names, input rows (T, n_in)) before each matrix product of a layer, when set:
    # what llama-imatrix's eval callback sees (engine.quality.imatrix_collect accumulates it)
    on_input: Callable[[tuple[str, ...], np.ndarray], None] | None = None
    # Mixture-of-Experts layers: layer -> the chosen experts (N, k) in descending order, their weights (N, k) and
    # the router's probabilities over all experts (N, n_expert, kept as float16)
    routing: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    # recurrent (DeltaNet) layers: layer -> {'q', 'k' (N, key heads, S), 'v' (N, value heads, S), 'g', 'beta' (N, value
    # heads)}: what engine.observe.recurrent needs to say how much each earlier token contributes to an output
    recurrent: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    _pending: int = 0

    def begin(self, start: int, n_tokens: int) -> None:
        """A forward of n_tokens positions starting at `start` is about to run."""
        self.truncate(start)
        self._pending = n_tokens

    def record_q(self, layer: int, start: int, q: np.ndarray, spec: LayerAttentionSpec) -> None:
        if not self.capture_q:
            return
        self.specs[layer] = spec
        self.q[layer] = _put(self.q.get(layer), start, q, axis=1)

    def record_recurrent(self, layer: int, start: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray,
                         beta: np.ndarray) -> None:
        """A DeltaNet layer's per-token inputs of the delta rule (q, k L2-normalised, v after the convolution)."""
        if not self.capture_q:
            return
        old = self.recurrent.get(layer, {})
        self.recurrent[layer] = {name: _put(old.get(name), start, np.asarray(x, np.float32), axis=0)
                                 for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))}

    def recurrent_inputs(self, layer: int) -> dict[str, np.ndarray] | None:
        """A recurrent layer's recorded inputs at the committed positions, or None (an attention layer)."""
        got = self.recurrent.get(layer)
        return None if got is None else {name: a[: self.length] for name, a in got.items()}

    def record_hidden(self, layer: int, start: int, h: np.ndarray) -> None:
        if self.capture_hidden:
            self.hidden[layer] = _put(self.hidden.get(layer), start, h, axis=0)

    def record_routing(self, layer: int, experts: np.ndarray, weights: np.ndarray, probs: np.ndarray) -> None:
        """A MoE layer's routing of the positions being run (they start where the committed ones end)."""
        old = self.routing.get(layer, (None, None, None))
        new = (experts.astype(np.int32), weights.astype(np.float32), probs.astype(np.float16))
        self.routing[layer] = tuple(_put(o, self.length, n, axis=0) for o, n in zip(old, new))  # type: ignore[assignment]

    def routing_of(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Layer's routing at the recorded positions (experts, weights, probabilities), or None (a dense layer)."""
        got = self.routing.get(layer)
        return None if got is None else tuple(a[: self.length] for a in got)  # type: ignore[return-value]

    def record_input(self, names: tuple[str, ...], x: np.ndarray) -> None:
        """The float32 input rows (T, n_in) that the matrices `names` are about to multiply."""
        if self.on_input is not None:
            self.on_input(names, x)

    def commit(self) -> None:
        self.length += self._pending
        self._pending = 0

    def truncate(self, n: int) -> None:
        """Forget positions >= n."""
        self.length = min(self.length, max(0, n))

    def attention(
        self, cache: KVCache, layer: int, head: int, rows: slice | npt.ArrayLike | None = None
    ) -> npt.NDArray[np.float32]:
        """Attention weights of one head: (len(rows), N) for query rows (default all), keys 0..N-1."""
        n = min(self.length, cache.length)
        spec = self.specs[layer]
        q_all = self.q[layer]
        pos = np.arange(n)[rows] if rows is not None else np.arange(n)
        pos = np.atleast_1d(pos)
        q = q_all[head, pos]  # (R, d)
        k = cache.keys(layer, n)[head // spec.group]  # (N, d)
        raw = q @ k.T
        scores = (raw if spec.softcap is None else soft_cap(raw, spec.softcap)) * np.float32(spec.scale)  # Gemma 2 caps
        mask = causal_mask(pos.astype(np.int64), n, spec.window)
        masked = np.where(mask, scores, np.float32(-np.inf))
        if spec.sinks is not None:  # gpt-oss: the head's sink takes its share; the row sums to less than 1
            return softmax_with_sinks(masked, np.float32(spec.sinks[head])).astype(np.float32)
        return softmax(masked).astype(np.float32)

    def queries(self, layer: int, head: int) -> np.ndarray:
        """Post-RoPE queries of one head, (N, d)."""
        return self.q[layer][head, : self.length]


def _put(buf: np.ndarray | None, start: int, x: np.ndarray, axis: int) -> np.ndarray:
    """Write x at [start, start + len) along `axis`, growing the buffer geometrically."""
    end = start + x.shape[axis]
    if buf is None or buf.shape[axis] < end:
        shape = list(x.shape)
        shape[axis] = max(end, 2 * (0 if buf is None else buf.shape[axis]), 64)
        new = np.zeros(shape, x.dtype)
        if buf is not None:
            idx = [slice(None)] * x.ndim
            idx[axis] = slice(0, min(start, buf.shape[axis]))
            new[tuple(idx)] = buf[tuple(idx)]
        buf = new
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, end)
    buf[tuple(idx)] = x
    return buf
