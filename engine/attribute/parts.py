"""What each part of one block adds to the residual stream at one position, as float64 vectors (dim,).

The parts of a block's attention (or recurrent mixer) are its heads: the output product is linear over the
concatenated heads, so head h adds W_O[:, h's columns] z_h, with z_h the head's output as the run computed it
(`attn.hook_z`), times sigmoid(its gate) where the layer gates its heads (Qwen3.5's attention). A DeltaNet layer's
value head h adds W_out[:, h's columns] (rmsnorm(o_h) * silu(z_h)): its gated norm works head by head, so its
`ssm_out` splits exactly per value head as well. gpt-oss's `attn_output.bias` is a part of its own.

An FFN's parts: a dense FFN is one part (its recorded output, exact); a Mixture-of-Experts FFN's are the experts the
token was routed to (each its weight times its down product, recomputed on the token's row from the recorded
routing) and the shared expert (times its gate); Gemma 4's seam adds its dense FFN and its experts, each branch
normed on its own.

Norms after a block's parts (Gemma's post-norms, Gemma 4's branch norms) are linearised with the scale the run had:
rmsnorm(sum_p v_p) = sum_p g * v_p / rms(sum_p v_p), exact for the sum and each part's share of it. The products are
recomputed here in float64 on the dequantized weights; the run's own products (8-bit activations with ggml numerics,
float32 sums) differ from that by rounding, which engine.attribute.direct books as the layer's remainder.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.kernels.dispatch import Activation

F64 = npt.NDArray[np.float64]
F32 = npt.NDArray[np.float32]


@dataclass
class Part:
    """One contribution to the residual stream: kind ('head', 'ffn', 'expert', 'shared_expert', 'bias', ...), the
    layer (None: the embedding), the head or expert index (None: a whole block part), the vector (dim,) float64."""

    kind: str
    layer: int | None
    index: int | None
    vec: F64


def rms_linear(vecs: list[F64], weight: F32, eps: float) -> list[F64]:
    """The parts of rmsnorm(sum of vecs) * weight with the norm's scale taken from their sum: each g * v / rms."""
    total = np.sum(vecs, axis=0) if vecs else None
    if total is None:
        return []
    scale = np.asarray(weight, np.float64) / np.sqrt(np.mean(total * total) + eps)
    return [v * scale for v in vecs]


def _columns(w: F32, n: int) -> F64:
    """A (dim, n * d) output matrix as (n, dim, d): head h's columns."""
    dim, width = w.shape
    return np.asarray(w, np.float64).reshape(dim, n, width // n).transpose(1, 0, 2)


def head_vectors(w_out: Any, heads: np.ndarray) -> F64:
    """What each head adds through the output product w_out (a Linear over the concatenated heads), (n, dim): head
    h's columns of the dequantized matrix times its output (d,), in float64."""
    cols = _columns(w_out.weight.dequantize(), heads.shape[0])  # (n, dim, d)
    return np.einsum("ndk,nk->nd", cols, np.asarray(heads, np.float64))


def attention_parts(net: Any, i: int, z: F32, resid_pre: F32) -> list[Part]:
    """Layer i's heads (and output bias) at one position, before any post-norm: z is the heads' output (heads, d)
    as hooked, resid_pre the residual row entering the block (the gate's and the mixer's input)."""
    layer = net.layers[i]
    mixer = getattr(layer, "mixer", None)
    h = net.norm(resid_pre[None], layer.attn_norm)  # (1, dim): the block's normed input, bit for bit the run's
    ops = net.ops
    if mixer is not None:  # DeltaNet: rmsnorm of each value head by ssm_norm, times silu of its z
        d = mixer.dims
        _, zg, _, _ = mixer.projections(h)
        y = ops.norm(z[None], mixer.norm, mixer.eps) * ops.silu(zg.reshape(1, d.v_heads, d.state))
        heads, w_out = y[0], mixer.w_out
    else:
        heads, w_out = z, layer.wo
        if getattr(layer, "gated", False):  # qwen35.cpp: each head's output times sigmoid(its gate)
            q = layer.split_qkv(layer.qkv(h))[0]
            if layer.biases is not None:
                q = q + layer.biases[0]
            n, dh = heads.shape
            gate = np.ascontiguousarray(q.reshape(1, n, 2, dh)[:, :, 1]).reshape(1, n * dh)  # as the graph's view
            heads = heads * ops.sigmoid(gate).reshape(n, dh)
    vecs = head_vectors(w_out, heads)
    parts = [Part("head", i, hh, vecs[hh]) for hh in range(vecs.shape[0])]
    bias = getattr(layer, "wo_bias", None)
    if bias is not None:  # gpt-oss: attn_output.bias, added after the product
        parts.append(Part("bias", i, None, np.asarray(bias, np.float64)))
    return parts


def moe_parts(ffn: Any, i: int, h: F32, ops: Any, experts: np.ndarray, weights: np.ndarray) -> list[Part]:
    """A MoEFFN's parts for one token's normed row h (1, dim): each routed expert (its weight times its output),
    then the shared expert times its gate."""
    k = len(experts)
    down = ffn._experts(h, np.asarray(experts, np.int64), np.zeros(k, np.int64), ops)  # (k, dim)
    parts = [Part("expert", i, int(e), np.asarray(down[s], np.float64) * float(weights[s]))
             for s, e in enumerate(experts)]
    if ffn.shared is not None and ffn.shared_gate is not None:
        z = ffn.shared_gate(h)
        if ffn.shared_sigmoid == "sigmoid":
            gate = ops.sigmoid(z)
        else:
            with np.errstate(invalid="ignore", divide="ignore"):
                gate = ops.silu(z) / z  # qwen2moe.cpp's ggml_div(ggml_silu(x), x)
        parts.append(Part("shared_expert", i, None, np.asarray(ffn.shared(h, ops)[0] * gate[0], np.float64)))
    return parts


def gemma4_expert_rows(moe: Any, x: F32, ops: Any, eps: float, experts: np.ndarray, weights: np.ndarray) -> F64:
    """Gemma 4's experts branch before its post-norm, per routed expert (k, dim): weight * scale * down(geglu)."""
    k = len(experts)
    ids, src = np.asarray(experts, np.int64), np.zeros(k, np.int64)
    act = Activation(ops.norm(x, moe.pre_norm, eps))
    if moe.gate_up is not None:
        gu = moe.gate_up(act, ids, src)
        width = gu.shape[-1] // 2
        gate, up = gu[:, :width], gu[:, width:]
    else:
        up, gate = moe.up(act, ids, src), moe.gate(act, ids, src)
    down = np.asarray(moe.down(ops.glu("geglu", gate, up), ids), np.float64)
    if moe.down_scale is not None:
        down = down * np.asarray(moe.down_scale, np.float64)[ids][:, None]
    return down * np.asarray(weights, np.float64)[:, None]


def ffn_parts(net: Any, i: int, x_mid: F32, recorded: F32, routing: tuple[np.ndarray, np.ndarray] | None) -> list[Part]:
    """Layer i's FFN parts at one position, its post-norm applied (linearised): x_mid the residual row after
    attention, `recorded` what the run added (hook_mlp_out), `routing` the token's (experts (k,), weights (k,))."""
    layer, ops, eps = net.layers[i], net.ops, net.args.norm_eps
    ffn = layer.ffn
    if routing is None:  # a dense FFN: exactly what the run added
        return [Part("ffn", i, None, np.asarray(recorded, np.float64))]
    experts, weights = routing
    row = x_mid[None]
    moe = getattr(ffn, "moe", None)
    if moe is not None:  # Gemma 4: post_ffw_norm_1(dense) + post_ffw_norm_2(experts), each branch normed on its own
        dense = np.asarray(ffn.dense(ops.norm(row, ffn.norm, eps), ops)[0], np.float64)
        (dense,) = rms_linear([dense], ffn.post_norm_1, eps)
        rows = gemma4_expert_rows(moe, row, ops, eps, experts, weights)
        normed = rms_linear(list(rows), moe.post_norm, eps)
        parts = [Part("ffn", i, None, dense)] + [Part("expert", i, int(e), v) for e, v in zip(experts, normed)]
    else:
        h = net.norm(row, layer.ffn_norm)
        parts = moe_parts(ffn, i, h, ops, experts, weights)
    if layer.post_ffn_norm is not None:
        for p, v in zip(parts, rms_linear([p.vec for p in parts], layer.post_ffn_norm, eps)):
            p.vec = v
    return parts
