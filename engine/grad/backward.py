"""Run a model's own graph on traced values and take the gradient of a logit (difference).

`traced(model, dtype)` hands the model, for the duration of a pass, the float32 reference numerics with its ops on
traced values (`TapeNumerics`: attention over a `TapeCache` that keeps the traced K/V, no compiled step) and makes its
products use the dequantized weights (`Linear.numerics = 'float32'`); everything is put back afterwards, and the
float32 copies the pass made are dropped. `gradient(...)` runs the prompt from its input embeddings (the run's own,
as the loaded numerics look them up) through every block and the final norm and head, and returns d(logit[target] -
logit[contrast]) at the last position (before any final soft-cap, as engine.attribute's logit_diff) with respect to the
embeddings and to any hook point. MoE routing, masks and RoPE angles are constants of the pass (the forward's own).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.errors import LensError, SettingError
from engine.grad.tape import NoVJP, Tape, Var
from engine.grad.vjps import Dequantized
from engine.grad.experts import TracedMoE
from engine.models.experts import MoEFFN
from engine.models.ffn import DenseFFN
from engine.ops import reference
from engine.runtime.numerics import Float32Numerics
from engine.tensor import Linear

if TYPE_CHECKING:
    from engine.model import Model

log = logging.getLogger(__name__)
F64 = npt.NDArray[np.float64]


def missing_backward(model: Model) -> str | None:
    """What of this model's graph has no backward yet (None: every part has one)."""
    net = model.net
    if getattr(net, "is_encoder_decoder", False):
        return f"{model.arch} is an encoder-decoder (only decoder-only graphs have a backward)"
    if not hasattr(net, "layers") or not hasattr(net, "out_norm") or not hasattr(net, "hooks"):
        return f"the {model.arch} graph is not the shared block graph"
    if getattr(net, "per_layer", None) is not None:
        return "Gemma 4's per-layer inputs"
    for i, layer in enumerate(net.layers):
        if getattr(layer, "mixer", None) is not None:
            return f"the recurrent (DeltaNet) mixer of layer {i}"
        if not isinstance(layer.ffn, DenseFFN | MoEFFN):
            return f"the {type(layer.ffn).__name__} of layer {i} (an architecture's own FFN)"
        if layer.kv_source is not None or layer.v_from_k or layer.gated:
            return f"layer {i}'s shared / gated attention"
    return None


def check_supported(model: Model) -> None:
    """Refuse, naming the missing part, a model whose backward is not built; nothing is changed."""
    if model.backend.is_device:
        raise SettingError("gradients run on the CPU path only: load the model with --backend numpy")
    what = missing_backward(model)
    if what is not None:
        raise LensError(f"gradients through {model.arch} are not built yet: no backward for {what}")


class TapeCache:
    """What the traced attention reads as its KV cache: the traced K/V of the pass, per layer."""

    def __init__(self, n_layers: int, n_ctx: int):
        self.n_ctx = n_ctx
        self.length = 0
        self.qtype = None
        self.k: list[Any] = [None] * n_layers
        self.v: list[Any] = [None] * n_layers

    def reserve(self, n_total: int) -> None:
        """Nothing to allocate: the rows are the pass's own."""

    def put(self, layer: int, start: int, k: Var, v: Var) -> int:
        if start:
            raise AssertionError("a traced pass runs the prompt from position 0")
        self.k[layer], self.v[layer] = k, v
        return start

    def keys(self, layer: int, n: int | None = None) -> Var:
        return self.k[layer]

    def values(self, layer: int, n: int | None = None) -> Var:
        return self.v[layer]

    def rows(self, layer: int) -> None:
        return None

    def stored(self, layer: int, n: int) -> None:
        return None


class TapeNumerics(Float32Numerics):
    """The float32 reference ops on traced values: NumPy maths only (no compiled call), attention over a TapeCache."""

    name = "float32"

    def begin(self, model: Any, cache: Any) -> None:
        self.rounding = (None, None)

    def decode_attention(self, *args: object) -> None:
        return None

    def sigmoid(self, x: Var) -> Var:
        return 1.0 / (1.0 + np.exp(-x))

    def attend(self, q: Var, cache: TapeCache, layer: int, end: int, pos: np.ndarray, scale: float,
               window: int | None, masks: dict, softcap: float | None, sinks: Any = None) -> Var:
        """reference.attention's maths on traced q, K, V: grouped queries, the soft-cap, the causal / sliding mask,
        the softmax (with sinks), V."""
        k, v = cache.keys(layer, end), cache.values(layer, end)
        hq, t, d = q.shape
        hkv, s = k.shape[0], k.shape[1]
        g = hq // hkv
        scores = (q.reshape(hkv, g * t, d) @ k.transpose(0, 2, 1)).reshape(hq, t, s)  # (Hq, T, S)
        if softcap is not None:
            scores = np.tanh(scores * (1.0 / softcap)) * softcap
        scores = scores * scale
        mask = reference.causal_mask(np.asarray(pos), s, window)  # (T, S)
        scores = np.where(mask[None], scores, -np.inf)
        top = np.max(scores.detach(), axis=-1, keepdims=True)  # a constant shift: the softmax does not see it
        if sinks is not None:
            sink = np.asarray(sinks, np.float64)[:, None, None]
            top = np.maximum(top, sink)
        e = np.exp(scores - top)
        total = np.sum(e, axis=-1, keepdims=True)
        if sinks is not None:
            total = total + np.exp(sink - top)
        w = e / total
        return (w.reshape(hkv, g * t, s) @ v).reshape(hq, t, d)  # (Hq, T, d)

    def warm(self, model: Any, progress: Any) -> None:
        """Nothing: the products dequantize as they go."""


class _Blocks:
    """A weight's QTensor whose dequantize() tags the copy with how to make it again (vjps.Dequantized)."""

    def __init__(self, q: Any):
        self._q = q

    def __getattr__(self, name: str) -> Any:
        return getattr(self._q, name)

    def dequantize(self) -> np.ndarray:
        w = self._q.dequantize().view(Dequantized)
        w.source, w.flip = self._q.dequantize, False
        return w


class _NoCopies:
    """A dense budget that keeps no copy: each product dequantizes its weight and drops it."""

    def take(self, nbytes: int) -> bool:
        return False

    def give_back(self, nbytes: int) -> None:
        """Nothing was taken."""


@contextmanager
def traced(model: Model, copies: bool = False) -> Iterator[None]:
    """The model runs its graph with TapeNumerics and dequantized products inside the block, as it was after.

    A weight the model holds no float32 copy of (ggml numerics) is dequantized by each product that needs it and
    again by that product's VJP, never kept: resident memory stays the file plus the pass's activations (a float32
    model's own copies are used as they are). `copies`: keep float32 copies within the model's dense budget for the
    block instead (many passes over one prompt: integrated gradients' steps), dropped at its end. Re-entrant: an
    inner pass runs inside the outer block's setting."""
    net = model.net
    if isinstance(net.ops, TapeNumerics):
        yield
        return
    linears = _all_linears(net)
    before = [(lin, lin.numerics, lin.weight, lin.budget, lin._dense) for lin in linears]
    stacked = [(f, f._stacked) for layer in net.layers for f in layer.fused()]
    experts = [layer for layer in net.layers if isinstance(layer.ffn, MoEFFN)]
    ops = net.ops
    net.ops = TapeNumerics()
    for layer in experts:  # the experts seam as traced ops, the routing frozen (engine.grad.experts)
        layer.ffn = TracedMoE(layer.ffn)
    for lin in linears:
        lin.numerics = "float32"
        if not copies:
            lin.budget = _NoCopies()
            if lin._dense is None:
                lin.weight = _Blocks(lin.weight)
    try:
        yield
    finally:
        net.ops = ops
        for layer in experts:
            layer.ffn = layer.ffn.ffn
        for lin, numerics, weight, budget, dense in before:
            lin.numerics, lin.weight, lin.budget = numerics, weight, budget
            if copies and dense is None and lin._dense is not None:
                lin.drop_cache()  # gives the copy's bytes back to the model's budget
            lin._dense = dense
        for f, s in stacked:
            f._stacked = s


def _head(net: Any, x: Var, target: int, contrast: int | None) -> Var:
    """The output head's logits of target (and contrast) for rows x: those rows of the head dequantized, not all of
    them (a 262k-token head is 670 MB in float32); the whole product where adapters sit on the head."""
    ids = [target] if contrast is None else [target, contrast]
    head = net.output
    if head.loras:
        return net.output(x)[:, ids]
    return x @ head.weight.rows(np.asarray(ids, np.int64)).T


def _all_linears(net: Any) -> list[Linear]:
    out = list(net.linears().values())
    for lin in list(out):
        for a, b, _ in lin.loras:
            out += [a, b]
    return out


@dataclass(frozen=True)
class Gradient:
    """A scalar of one pass and its gradient with respect to the input embeddings and the asked hook points."""

    value: float  # logit[target] - logit[contrast] at the last position (before any final soft-cap unless capped)
    embeddings: F64  # (T, dim) the input embeddings the pass started from
    d_embeddings: F64  # (T, dim) d value / d embeddings
    points: dict[str, F64]  # hook point -> its value in the pass
    d_points: dict[str, F64]  # hook point -> d value / d that activation


def gradient(model: Model, ids: Sequence[int], target: int, contrast: int | None = None, *,
             points: Sequence[str] = (), embeddings: np.ndarray | None = None, dtype: Any = np.float32,
             backward: bool = True, capped: bool = False, shift: dict[str, np.ndarray] | None = None) -> Gradient:
    """d(logit[target] - logit[contrast]) at the last of `ids` w.r.t. the input embeddings (default: the ids' own,
    or `embeddings` (T, dim)) and the hook points named (TransformerLens names, e.g. 'blocks.3.attn.hook_z');
    `capped`: the logits after the final soft-cap (the model's output) rather than before it; `shift`: hook point ->
    an array added to the activation there (what finite differences of an intermediate activation perturb);
    `backward=False`: the forward alone (the gradients are NaN); `dtype`: float32, or float64 for checks."""
    check_supported(model)
    net = model.net
    ids = [int(i) for i in ids]
    if not ids:
        raise SettingError("a gradient needs at least one token")
    x0 = net.embed(np.asarray(ids, np.int64)) if embeddings is None else np.asarray(embeddings)
    tape = Tape(dtype)
    seen: dict[str, tuple[np.ndarray, int]] = {}

    def keep(value: Var, name: str) -> None:
        seen[name] = (value.value, value.idx)  # the node, not the Var: an in-place write later makes a new node
        if shift and name in shift:
            value[...] = value + shift[name]  # in place: the graph goes on with the shifted activation

    hooks_before = net.hooks
    net.hooks = {name: keep for name in [*points, *(shift or {})]}
    try:
        with traced(model):
            cache = TapeCache(net.args.n_layers, max(1, len(ids)))
            net.begin(cache)
            x = tape.leaf(x0)
            h = net.run_layers(x, 0, cache, None, range(net.args.n_layers))
            logits = _head(net, net.norm(h[len(ids) - 1 :], net.out_norm), target, contrast)  # (1, 1 or 2)
            cap = getattr(net.args, "final_softcap", None)
            if capped and cap is not None:  # gemma2.cpp: scale by 1/cap, tanh, scale by cap
                logits = np.tanh(logits * (1.0 / cap)) * cap
            out = logits[0, 0] if contrast is None else logits[0, 0] - logits[0, 1]
    except NoVJP as e:
        raise LensError(f"gradients through {model.arch}: {e}") from e
    finally:
        net.hooks = hooks_before
    missing = [p for p in [*points, *(shift or {})] if p not in seen]
    if missing:
        raise SettingError(f"hook points not reached by the pass: {', '.join(missing)}")
    wanted = [x.idx, *(i for _, i in seen.values())]
    grads = tape.backward(out, wanted) if backward else {i: np.full(tape.shapes[i], np.nan) for i in wanted}
    return Gradient(float(out.value), x.value.astype(np.float64), grads[x.idx].astype(np.float64),
                    {p: seen[p][0].astype(np.float64) for p in points},
                    {p: grads[seen[p][1]].astype(np.float64) for p in points})
