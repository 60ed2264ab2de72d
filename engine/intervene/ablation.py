"""Head ablation: a head's attention output set to zero before the output product mixes the heads.

Zeroing head h of layer l's output rows o[:, h*d:(h+1)*d] before `attn_output` is, product for product, a file whose
`attn_output` columns h*d..(h+1)*d are zero: every term they meet is 0 either way (in ggml numerics the activation's
8-bit blocks of those columns quantize to zero blocks, as zero weight blocks would be), so the two give the same
logits; tests/engine/intervene holds them to the bit. The compiled decode step quantizes the attention output
inside its attention call, so an ablated model runs its steps op by op (engine.runtime.numerics checks).
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import SettingError

if TYPE_CHECKING:
    from engine.model import Model

_HEAD = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


@dataclass(frozen=True)
class HeadAblation:
    """The heads switched off, as (layer, head) pairs in order."""

    heads: tuple[tuple[int, int], ...] = ()

    def describe(self) -> str:
        """'ablated L3h4, L5h1' for a reply's signature; '' when nothing is ablated."""
        return "ablated " + ", ".join(f"L{layer}h{head}" for layer, head in self.heads) if self.heads else ""


def parse_heads(texts: Iterable[str], n_layers: int, n_heads: int) -> HeadAblation:
    """'LAYER:HEAD' strings (the CLI's --ablate-head) checked against the model's shape; SettingError naming the
    first bad one."""
    out = set()
    for text in texts:
        m = _HEAD.match(text)
        if m is None:
            raise SettingError(f"--ablate-head {text!r}: expected LAYER:HEAD, e.g. 3:4")
        layer, head = int(m.group(1)), int(m.group(2))
        if layer >= n_layers:
            raise SettingError(f"--ablate-head {text}: layer {layer} out of range (the model has {n_layers} layers)")
        if head >= n_heads:
            raise SettingError(f"--ablate-head {text}: head {head} out of range (the model has {n_heads} heads)")
        out.add((layer, head))
    return HeadAblation(tuple(sorted(out)))


def ablate_heads(model: Model, ablation: HeadAblation) -> None:
    """Switch the heads of `ablation` off in `model` from its next forward on (an empty ablation switches every head
    back on). SettingError where it cannot apply: another architecture family's blocks, or the GPU path."""
    net = model.net
    if ablation.heads and model.backend.is_device:
        raise SettingError("head ablation runs on the CPU path only; load the model with --backend numpy")
    if ablation.heads and not hasattr(net, "ablated_heads"):
        raise SettingError(f"head ablation is not available for the {net.arch_name} architecture")
    a = net.args
    by_layer: dict[int, list[int]] = {}
    for layer, head in ablation.heads:
        if not (0 <= layer < a.n_layers and 0 <= head < a.n_heads):
            raise SettingError(f"head L{layer}h{head} is outside the model ({a.n_layers} layers, {a.n_heads} heads)")
        by_layer.setdefault(layer, []).append(head)
    net.ablated_heads = {layer: np.asarray(sorted(heads), np.int64) for layer, heads in by_layer.items()}
    net.ablation = ablation


def current(model: Model) -> HeadAblation:
    """What is ablated in `model` now."""
    return getattr(model.net, "ablation", HeadAblation())
