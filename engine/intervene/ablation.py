"""Ablation: switch parts of the model off (heads, a layer's attention or FFN, an expert) and see what changes.

- A head, zeroed: its output rows o[:, h*d:(h+1)*d] set to zero before `attn_output` mixes the heads. That is, product
  for product, a file whose `attn_output` columns h*d..(h+1)*d are zero: every term they meet is 0 either way (in ggml
  numerics the activation's 8-bit blocks of those columns quantize to zero blocks, as zero weight blocks would be).
- A head, mean-ablated: its output replaced at every position by its mean over a context (the chat, the prompt), the
  same vector at each position; the means are taken on the model without the ablation (`head_means`).
- A layer's attention or FFN: what the block adds to the residual stream left out (the attention's keys and values
  still enter the cache). Equal to a file whose `attn_output` (and its bias) or `ffn_down` is zero.
- A head of a recurrent (DeltaNet) layer, zeroed: its output zeroed before the gated norm, so nothing it read from its
  state reaches `ssm_out` (the state itself still runs): equal to a file whose `ssm_out` columns of that head are
  zero. Mean ablation is for attention heads only (a recurrent head has no hook_z).
- An expert of a Mixture-of-Experts layer: never chosen (its router logit set to -inf before the top-k), as if the
  file had no such expert; the token's other experts take its place. Equal to a file whose router bias for it is -inf.

tests/engine/intervene holds each to such a file, bit for bit. The compiled decode step computes whole blocks inside
its calls, so an ablated model runs its steps op by op (engine.runtime.numerics checks `ablated_heads` and
`ablated_blocks`).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import SettingError

if TYPE_CHECKING:
    from engine.model import Model

_PAIR = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")
_ONE = re.compile(r"^\s*(\d+)\s*$")


@dataclass(frozen=True)
class Ablation:
    """What is switched off: heads as (layer, head) pairs, layers' attention or FFN, experts as (layer, expert)."""

    heads: tuple[tuple[int, int], ...] = ()
    attn_layers: tuple[int, ...] = ()
    ffn_layers: tuple[int, ...] = ()
    experts: tuple[tuple[int, int], ...] = ()
    mean_over: int = 0  # > 0: the heads are mean-ablated, over that many tokens of context; 0: zeroed
    means: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)  # layer -> (n_heads, d)

    @property
    def empty(self) -> bool:
        return not (self.heads or self.attn_layers or self.ffn_layers or self.experts)

    def describe(self) -> str:
        """'ablated L3h4, L5h1 (mean over 40 tokens), attention L2, FFN L7, expert L1e5' for a reply's signature; ''
        when nothing is ablated."""
        words = []
        if self.heads:
            heads = ", ".join(f"L{layer}h{head}" for layer, head in self.heads)
            words.append(heads + (f" (mean over {self.mean_over} tokens)" if self.mean_over else ""))
        words += [f"attention L{i}" for i in self.attn_layers] + [f"FFN L{i}" for i in self.ffn_layers]
        words += [f"expert L{layer}e{e}" for layer, e in self.experts]
        return "ablated " + ", ".join(words) if words else ""


def _pairs(texts: Iterable[str], flag: str, example: str, limits: tuple[int, int], what: str) -> tuple[tuple[int, int], ...]:
    out = set()
    for text in texts:
        m = _PAIR.match(text)
        if m is None:
            raise SettingError(f"{flag} {text!r}: expected LAYER:{what.upper()}, e.g. {example}")
        layer, j = int(m.group(1)), int(m.group(2))
        if layer >= limits[0]:
            raise SettingError(f"{flag} {text}: layer {layer} out of range (the model has {limits[0]} layers)")
        if j >= limits[1]:
            raise SettingError(f"{flag} {text}: {what} {j} out of range (the model has {limits[1]} {what}s)")
        out.add((layer, j))
    return tuple(sorted(out))


def _layers(texts: Iterable[str], flag: str, n_layers: int) -> tuple[int, ...]:
    out = set()
    for text in texts:
        m = _ONE.match(text)
        if m is None:
            raise SettingError(f"{flag} {text!r}: expected a layer number, e.g. 3")
        if int(m.group(1)) >= n_layers:
            raise SettingError(f"{flag} {text}: layer {m.group(1)} out of range (the model has {n_layers} layers)")
        out.add(int(m.group(1)))
    return tuple(sorted(out))


def parse_heads(texts: Iterable[str], n_layers: int, n_heads: int) -> Ablation:
    """'LAYER:HEAD' strings (the CLI's --ablate-head) checked against the model's shape; SettingError naming the
    first bad one."""
    return Ablation(_pairs(texts, "--ablate-head", "3:4", (n_layers, n_heads), "head"))


def parse(model: Model, heads: Sequence[str] = (), attn: Sequence[str] = (), ffn: Sequence[str] = (),
          experts: Sequence[str] = ()) -> Ablation:
    """Every kind at once (the CLI's --ablate-head, --ablate-attn, --ablate-ffn, --ablate-expert), checked against the
    model's shape; SettingError naming the first bad value (an expert on a dense model included)."""
    a = model.args
    n_expert = getattr(a, "n_expert", 0) or 0
    if experts and not n_expert:
        raise SettingError(f"--ablate-expert {experts[0]}: the model has no experts (it is not a Mixture-of-Experts model)")
    return Ablation(parse_heads(heads, a.n_layers, max(heads_in(model.net, i) for i in range(a.n_layers))).heads,
                    _layers(attn, "--ablate-attn", a.n_layers),
                    _layers(ffn, "--ablate-ffn", a.n_layers),
                    _pairs(experts, "--ablate-expert", "3:12", (a.n_layers, max(n_expert, 1)), "expert"))


def heads_in(net: object, layer: int) -> int:
    """Layer `layer`'s heads: a recurrent layer's value heads, else the attention's query heads."""
    mixer = getattr(net.layers[layer], "mixer", None) if 0 <= layer < len(getattr(net, "layers", ())) else None
    return mixer.dims.v_heads if mixer is not None else net.args.n_heads  # type: ignore[attr-defined]


def head_means(model: Model, tokens: Sequence[int], ablation: Ablation) -> Ablation:
    """`ablation` with its heads mean-ablated: each ablated head's output averaged over `tokens`, computed on the
    model as it is now but for any ablation (which is cleared first; set the result with `ablate`)."""
    from engine.intervene.hooks import run_with_cache  # noqa: PLC0415

    if not ablation.heads:
        return ablation
    if not tokens:
        raise SettingError("mean ablation needs a context to average over: the chat (or the prompt) is empty")
    recurrent = sorted({layer for layer, _ in ablation.heads if getattr(model.net.layers[layer], "mixer", None)})
    if recurrent:
        raise SettingError(f"layer {recurrent[0]} is a recurrent (DeltaNet) layer: its heads can be zeroed, not "
                           "mean-ablated (mean ablation replaces an attention head's output)")
    ablate(model, Ablation())
    layers = sorted({layer for layer, _ in ablation.heads})
    _, acts = run_with_cache(model, tokens, [f"blocks.{i}.attn.hook_z" for i in layers])
    means = {i: acts[f"blocks.{i}.attn.hook_z"].astype(np.float64).mean(axis=0).astype(np.float32) for i in layers}
    return Ablation(ablation.heads, ablation.attn_layers, ablation.ffn_layers, ablation.experts, len(tokens), means)


def ablate(model: Model, ablation: Ablation) -> None:
    """Switch off what `ablation` names in `model` from its next forward on (an empty one switches everything back
    on). SettingError where it cannot apply (another architecture family's blocks, the GPU path, every expert of a
    layer but fewer than it uses); nothing is changed then."""
    net = model.net
    if not ablation.empty and model.backend.is_device:
        raise SettingError("ablation runs on the CPU path only; load the model with --backend numpy")
    if not ablation.empty and not hasattr(net, "ablated_heads"):
        raise SettingError(f"ablation is not available for the {net.arch_name} architecture")
    a = net.args
    if ablation.mean_over and set(ablation.means) != {layer for layer, _ in ablation.heads}:
        raise SettingError("mean ablation without the heads' means: take them with head_means first")
    by_layer: dict[int, list[int]] = {}
    for layer, head in ablation.heads:
        n = heads_in(net, layer) if 0 <= layer < a.n_layers else a.n_heads
        if not (0 <= layer < a.n_layers and 0 <= head < n):
            kind = "value heads" if 0 <= layer < a.n_layers and getattr(net.layers[layer], "mixer", None) else "heads"
            raise SettingError(f"head L{layer}h{head} is outside the model ({a.n_layers} layers, {n} {kind} there)")
        by_layer.setdefault(layer, []).append(head)
    blocks: dict[int, set[str]] = {}
    for kind, layers in (("attn", ablation.attn_layers), ("ffn", ablation.ffn_layers)):
        for layer in layers:
            if not 0 <= layer < a.n_layers:
                raise SettingError(f"layer {layer} is outside the model ({a.n_layers} layers)")
            blocks.setdefault(layer, set()).add(kind)
    experts: dict[int, list[int]] = {}
    for layer, e in ablation.experts:
        ffn = net.layers[layer].ffn if 0 <= layer < a.n_layers else None
        if not hasattr(ffn, "ablated_experts"):
            raise SettingError(f"expert L{layer}e{e}: layer {layer} has no experts")
        if not 0 <= e < a.n_expert:
            raise SettingError(f"expert L{layer}e{e} is outside the model ({a.n_expert} experts)")
        experts.setdefault(layer, []).append(e)
    for layer, es in experts.items():
        if a.n_expert - len(es) < net.layers[layer].ffn.n_used:
            raise SettingError(f"layer {layer}: {len(es)} experts ablated leaves fewer than the "
                               f"{net.layers[layer].ffn.n_used} each token uses")
        blocks.setdefault(layer, set()).add("experts")
    mixers = {i: layer.mixer for i, layer in enumerate(net.layers) if getattr(layer, "mixer", None) is not None}
    for i, mixer in mixers.items():  # a recurrent layer's heads are zeroed inside its mixer
        mixer.ablated_heads = np.asarray(sorted(by_layer.pop(i)), np.int64) if i in by_layer else None
    net.ablated_heads = {layer: np.asarray(sorted(heads), np.int64) for layer, heads in by_layer.items()}
    net.head_means = ({layer: ablation.means[layer][net.ablated_heads[layer]][:, None, :] for layer in by_layer}
                      if ablation.mean_over else {})
    net.ablated_blocks = {layer: frozenset(kinds) for layer, kinds in blocks.items()}
    for i, layer in enumerate(net.layers):
        if hasattr(layer.ffn, "ablated_experts"):
            layer.ffn.ablated_experts = np.asarray(sorted(experts[i]), np.int64) if i in experts else None
    net.ablation = ablation


def current(model: Model) -> Ablation:
    """What is ablated in `model` now."""
    return getattr(model.net, "ablation", Ablation())
