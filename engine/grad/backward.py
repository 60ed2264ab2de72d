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
from engine.grad import recurrent as recurrent_ops
from engine.grad import fused
from engine.grad.fused import softmax
from engine.grad.vjps import dequantized
from engine.grad.experts import TracedGemma4Experts, TracedMoE
from engine.grad.seq2seq import decoder_ids, seq2seq_pass
from engine.models.experts import MoEFFN
from engine.models.ffn import DenseFFN
from engine.models.gemma4_ffn import Gemma4FFN
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
        return None  # its encoder and decoder run traced as they are (engine.grad.seq2seq)
    if not hasattr(net, "layers") or not hasattr(net, "out_norm") or not hasattr(net, "hooks"):
        return f"the {model.arch} graph is not the shared block graph"
    for i, layer in enumerate(net.layers):
        if not isinstance(layer.ffn, DenseFFN | MoEFFN | Gemma4FFN):
            return f"the {type(layer.ffn).__name__} of layer {i} (an architecture's own FFN)"
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

    def __init__(self, n_layers: int, n_ctx: int, states: dict[int, Any] | None = None,
                 shared: dict[int, int] | None = None):
        self.n_ctx = n_ctx
        self.length = 0
        self.qtype = None
        self.k: list[Any] = [None] * n_layers
        self.v: list[Any] = [None] * n_layers
        self.states = dict(states or {})  # recurrent layer -> its state before the pass (zeros: from the start)
        self.shared = dict(shared or {})  # layer -> the layer whose K/V it reads (Gemma 4)

    def reserve(self, n_total: int) -> None:
        """Nothing to allocate: the rows are the pass's own."""

    def put(self, layer: int, start: int, k: Var, v: Var) -> int:
        if start:
            raise AssertionError("a traced pass runs the prompt from position 0")
        self.k[layer], self.v[layer] = k, v
        return start

    def keys(self, layer: int, n: int | None = None) -> Var:
        return self.k[self.shared.get(layer, layer)]

    def values(self, layer: int, n: int | None = None) -> Var:
        return self.v[self.shared.get(layer, layer)]

    def rows(self, layer: int) -> None:
        return None

    def stored(self, layer: int, n: int) -> None:
        return None

    def state(self, layer: int) -> Any:
        """A recurrent layer's state before the pass (the prompt runs from position 0: zeros)."""
        return self.states[layer]

    def put_state(self, layer: int, final: Any, before_last: Any) -> None:
        """The traced state a recurrent layer reached: kept for the rest of the pass only."""
        self.states[layer] = final


class TapeNumerics(Float32Numerics):
    """The float32 reference ops on traced values: NumPy maths only (no compiled call), attention over a TapeCache."""

    name = "float32"

    def begin(self, model: Any, cache: Any) -> None:
        self.rounding = (None, None)

    def decode_attention(self, *args: object) -> None:
        return None

    def recurrent(self) -> Any:
        """The DeltaNet ops on traced values (engine.grad.recurrent)."""
        return recurrent_ops

    def sigmoid(self, x: Var) -> Var:
        return 1.0 / (1.0 + np.exp(-x))

    def norm(self, x: Var, weight: np.ndarray, eps: float) -> Var:
        return fused.rms_norm(x, weight, eps)

    def silu(self, x: Var) -> Var:
        return fused.activation("silu", x)

    def glu(self, kind: str, gate: Var, up: Var) -> Var:
        """One op for SwiGLU / GeGLU (engine.grad.fused); gpt-oss's clamped SwiGLU as the reference's ops."""
        got = fused.glu(kind, gate, up)
        return got if got is not None else super().glu(kind, gate, up)

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
        if sinks is None:
            w = softmax(scores)  # one op: its VJP keeps the weights alone
        else:  # gpt-oss: each head's sink logit joins the softmax's denominator
            sink = np.asarray(sinks, np.float64)[:, None, None]
            top = np.maximum(np.max(scores.detach(), axis=-1, keepdims=True), sink)  # a constant shift
            e = np.exp(scores - top)
            w = e / (np.sum(e, axis=-1, keepdims=True) + np.exp(sink - top))
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
        return dequantized(self._q)


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
    layers = getattr(net, "layers", [])  # an encoder-decoder's blocks have no fused products and no experts
    stacked = [(f, f._stacked) for layer in layers for f in layer.fused()]
    experts = [layer for layer in layers if isinstance(layer.ffn, MoEFFN)]
    branches = [layer.ffn for layer in layers if getattr(layer.ffn, "moe", None) is not None]  # Gemma 4's
    ops = net.ops
    net.ops = TapeNumerics()
    for layer in experts:  # the experts seam as traced ops, the routing frozen (engine.grad.experts)
        layer.ffn = TracedMoE(layer.ffn)
    for ffn in branches:
        ffn.moe = TracedGemma4Experts(ffn.moe)
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
        for ffn in branches:
            ffn.moe = ffn.moe.moe
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


def _zero_states(net: Any) -> dict[int, Any]:
    """Each recurrent layer's state at position 0 (its mixer's shape, zeros)."""
    return {i: layer.mixer.dims.recurrent_shape().zeros() for i, layer in enumerate(net.layers)
            if getattr(layer, "mixer", None) is not None}


def _shared_kv(net: Any) -> dict[int, int]:
    """Layers that attend to another layer's K/V (Gemma 4's KV sharing) -> that layer."""
    return {i: int(src) for i, layer in enumerate(net.layers) if (src := getattr(layer, "kv_source", None)) is not None}


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
             backward: bool = True, capped: bool = False, shift: dict[str, np.ndarray] | None = None,
             decoder: Sequence[int] | None = None) -> Gradient:
    """d(logit[target] - logit[contrast]) at the last of `ids` w.r.t. the input embeddings (default: the ids' own,
    or `embeddings` (T, dim)) and the hook points named (TransformerLens names, e.g. 'blocks.3.attn.hook_z');
    `capped`: the logits after the final soft-cap (the model's output) rather than before it; `shift`: hook point ->
    an array added to the activation there (what finite differences of an intermediate activation perturb);
    `backward=False`: the forward alone (the gradients are NaN); `dtype`: float32, or float64 for checks.
    An encoder-decoder model (T5): `ids` is the encoder's input and `decoder` the decoder's tokens (default: its start
    token), the logits are the decoder's last position's, and the embeddings are the encoder's rows then the
    decoder's (T = len(ids) + len(decoder)); hook points are not available there."""
    check_supported(model)
    net = model.net
    ids = [int(i) for i in ids]
    if not ids:
        raise SettingError("a gradient needs at least one token")
    seq2seq = getattr(net, "is_encoder_decoder", False)
    if seq2seq and (points or shift):
        raise SettingError(f"hook points are not available for {model.arch} (encoder-decoder) models: their gradient "
                           "is taken with respect to the input embeddings")
    if not seq2seq and decoder is not None:
        raise SettingError(f"decoder tokens are for encoder-decoder models; {model.arch} reads one sequence")
    dec = decoder_ids(net, decoder) if seq2seq else []
    x0 = net.embed(np.asarray(ids + dec, np.int64)) if embeddings is None else np.asarray(embeddings)
    if x0.shape[0] != len(ids) + len(dec):
        raise SettingError(f"{x0.shape[0]} embedding rows for {len(ids) + len(dec)} tokens")
    tape = Tape(dtype)
    seen: dict[str, tuple[np.ndarray, int]] = {}

    def keep(value: Var, name: str) -> None:
        seen[name] = (value.value, value.idx)  # the node, not the Var: an in-place write later makes a new node
        if shift and name in shift:
            value[...] = value + shift[name]  # in place: the graph goes on with the shifted activation

    hooks_before = getattr(net, "hooks", None)
    if not seq2seq:
        net.hooks = {name: keep for name in [*points, *(shift or {})]}
    try:
        with traced(model):
            x = tape.leaf(x0)
            if seq2seq:
                last = seq2seq_pass(net, ids, dec, x[: len(ids)], x[len(ids) :])
            else:
                last = _decoder_pass(net, ids, x)
            logits = _head(net, net.norm(last, net.out_norm), target, contrast)  # (1, 1 or 2)
            cap = getattr(net.args, "final_softcap", None)
            if capped and cap is not None:  # gemma2.cpp: scale by 1/cap, tanh, scale by cap
                logits = np.tanh(logits * (1.0 / cap)) * cap
            out = logits[0, 0] if contrast is None else logits[0, 0] - logits[0, 1]
    except NoVJP as e:
        raise LensError(f"gradients through {model.arch}: {e}") from e
    finally:
        if not seq2seq:
            net.hooks = hooks_before
    missing = [p for p in [*points, *(shift or {})] if p not in seen]
    if missing:
        raise SettingError(f"hook points not reached by the pass: {', '.join(missing)}")
    wanted = [x.idx, *(i for _, i in seen.values())]
    grads = tape.backward(out, wanted) if backward else {i: np.full(tape.shapes[i], np.nan) for i in wanted}
    return Gradient(float(out.value), x.value.astype(np.float64), grads[x.idx].astype(np.float64),
                    {p: seen[p][0].astype(np.float64) for p in points},
                    {p: grads[seen[p][1]].astype(np.float64) for p in points})


def _decoder_pass(net: Any, ids: list[int], x: Var) -> Var:
    """A decoder-only model's last residual row (1, dim) for the traced input embeddings x (T, dim)."""
    cache = TapeCache(net.args.n_layers, max(1, len(ids)), _zero_states(net), _shared_kv(net))
    net.begin(cache)
    if getattr(net, "per_layer", None) is not None:  # Gemma 4: every block's input from these embeddings
        net.per_layer.prepare(net, np.asarray(ids, np.int64), x)
    h = net.run_layers(x, 0, cache, None, range(net.args.n_layers))
    return h[len(ids) - 1 :]
