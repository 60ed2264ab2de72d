"""What the GPU runner needs to know about an architecture, read off the NumPy model that holds the weights.

One function per architecture, in a table: adding one to the GPU path is a new entry here when its layer
is made of the pieces runner.py knows (RMSNorm, optional q/k norms and post-norms, RoPE, gated FFN).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import numpy.typing as npt

from engine.errors import SettingError
from engine.models.decoder import DecoderModel
from engine.models.ffn import DenseFFN
from engine.models.args import LayerAttentionSpec
from engine.tensor import Linear, QTensor

F32 = npt.NDArray[np.float32]
ACT_SILU, ACT_GELU_TANH = 1, 2  # as gl_act in gemv.cu / ops_act in ops.cu


@dataclass
class LayerPlan:
    """One transformer block as the device runs it."""

    attn_norm: F32
    qkv: list[Linear]
    wo: Linear
    ffn_norm: F32
    gate_up: list[Linear]
    down: Linear
    freqs: npt.NDArray[np.float64]  # RoPE angular frequencies of this layer
    window: int | None  # sliding window, None = full attention
    spec: LayerAttentionSpec  # for the Recorder (its scale is the attention scale)
    q_norm: F32 | None = None
    k_norm: F32 | None = None
    post_attn_norm: F32 | None = None
    post_ffn_norm: F32 | None = None


@dataclass
class ArchPlan:
    """The whole decoder: embedding, blocks, head."""

    layers: list[LayerPlan]
    tok_embd: QTensor
    embed_scale: float | None  # Gemma multiplies the embeddings by sqrt(dim)
    out_norm: F32
    output: Linear
    eps: float
    neox: bool  # RoPE pairs (i, i + n/2) instead of (2i, 2i + 1)
    act: int


def _llama(net: DecoderModel) -> ArchPlan:
    a = net.args
    layers = [
        LayerPlan(L.attn_norm, list(L.qkv_parts), L.wo, L.ffn_norm, list(L.ffn.parts), L.ffn.w_down, net.freqs, None, net.spec)
        for L in net.layers
    ]
    return ArchPlan(layers, net.tok_embd, None, net.out_norm, net.output, a.norm_eps, net.rope_mode == "neox", ACT_SILU)


def _gemma3(net: DecoderModel) -> ArchPlan:
    a = net.args
    layers = []
    for i, L in enumerate(net.layers):
        spec = net.specs[i]
        layers.append(LayerPlan(
            L.attn_norm, list(L.qkv_parts), L.wo, L.ffn_norm, list(L.ffn.parts), L.ffn.w_down,
            net.freqs_by_base[spec.rope_base], spec.window, spec,
            q_norm=L.q_norm, k_norm=L.k_norm, post_attn_norm=L.post_attn_norm, post_ffn_norm=L.post_ffn_norm,
        ))
    return ArchPlan(layers, net.tok_embd, math.sqrt(a.dim), net.out_norm, net.output, a.norm_eps,
                    net.rope_mode == "neox", ACT_GELU_TANH)


PLANS: dict[str, Callable[[DecoderModel], ArchPlan]] = {"llama": _llama, "gemma3": _gemma3}
MAX_HEAD_DIM = 256  # ATT_MAX_PER_LANE * 32 in attention.cu


def arch_plan(net: DecoderModel) -> ArchPlan:
    """The plan for a loaded NumPy model; SettingError when the GPU path does not run its architecture."""
    make = PLANS.get(net.arch_name)
    if make is None:
        raise SettingError(f"the GPU path does not run the {net.arch_name} architecture yet")
    missing = _unsupported(net)
    if missing is not None:
        raise SettingError(f"the GPU path does not run {missing} yet ({net.arch_name})")
    if net.args.head_dim > MAX_HEAD_DIM:
        raise SettingError(f"the GPU attention kernel takes heads of up to {MAX_HEAD_DIM} dims, this model has {net.args.head_dim}")
    return make(net)


def _unsupported(net: DecoderModel) -> str | None:
    """What a llama-family file may have that runner.py does not compute (it would give wrong numbers, not an error)."""
    scaling = getattr(net, "rope_scaling", None)
    if scaling is not None and scaling.mscale() != 1.0:
        return "RoPE magnitude scaling (YaRN, rope.scaling.attn_factor)"
    for layer in net.layers:
        if layer.biases is not None:
            return "q/k/v biases"
        if len(layer.qkv_parts) != 3:
            return "a fused attn_qkv matrix"
        if not isinstance(layer.ffn, DenseFFN) or len(layer.ffn.parts) != 2:
            return "this kind of FFN"
    return None
