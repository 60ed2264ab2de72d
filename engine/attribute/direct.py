"""Direct logit attribution, exact: a logit (or a logit difference) split into what each part of the model wrote to
the residual stream, the parts summing to the model's own number.

The final residual stream at a position is a sum: x_L = embedding + sum over blocks of (attention + FFN) (+ a control
vector; Gemma 4 adds a per-layer input and scales each block's output, which scales everything before it: carried
along). The head computes logit_t = W_U[t] . (g * x_L / rms(x_L)); with rms(x_L) taken as the run computed it, that
is linear in x_L, so with u = (W_U[t] - W_U[c]) * g / rms(x_L) each part's value is u . part, and the values sum to
u . x_L. Soft-capped logits (Gemma 2, Gemma 4) are attributed before the cap: `logit_diff` is then the pre-cap
difference, which the cap maps monotonically to the output.

Exactness, and where it is booked. The decomposition is computed in float64 from the run's own activations:

- each block's total update is the run's (the recorded residual stream after the block minus before it), so the
  per-layer sums are exact whatever the numerics;
- inside a block the parts are recomputed (engine.attribute.parts: heads through the dequantized output matrix,
  routed experts on the token's row, post-norms linearised with their scale). With float32 numerics that matches the
  run to float32 rounding; with ggml numerics (llama.cpp's: 8-bit activations before every product) the products
  differ by that quantization. What the parts do not explain of the block's recorded update is one labelled part per
  layer, kind 'remainder', so every layer still sums to its recorded update and the list to the logit (a LoRA
  adapter's additions to a block's products land there too: the parts use the file's weights);
- the head: the run's logit (8-bit activations into the output product with ggml numerics) minus u . x_L is one last
  'remainder' part with layer None.

So the components always sum to the engine's own logit (difference) to float64 rounding; the remainders say how
linear the run was. Measured: SmolLM2-135M (Q4_1), " cat" - " dog" after "Alice has a cat. Bob has a dog. Alice's pet
is a" (1.97 / 1.89): float32 numerics, all remainders together 5e-6; ggml numerics 0.078, of which 0.076 the head's
(its 8-bit activations) and at most 0.007 any layer's. The random-weight test models of every architecture: below
6e-6 with F32 weights in either numerics; Q4_K_M weights with ggml numerics 0.2-3% of the largest part.

Post-norms (Gemma 2, 3, 4: a block adds post_norm(out), not linear in the heads): the block's update is the run's,
exact; its split over heads (experts) is the norm linearised with the scale of the run's sum, and what that leaves is
in the layer's remainder. DeltaNet layers (Qwen3.5, Qwen3-Next) are split per value head, exactly (their `ssm_out`
splits by head). Kinds: 'embed', 'head' (an attention head, or a DeltaNet layer's value head), 'ffn', 'expert',
'shared_expert', 'bias' (gpt-oss's attn_output.bias), 'control' (a control vector), 'per_layer_input' (Gemma 4),
'remainder'. Encoder-decoder models (T5) have their own split (engine.attribute.seq2seq: self- and cross-attention
heads, FFNs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.attribute.capture import Capture
from engine.attribute.parts import Part, attention_parts, ffn_parts, rms_linear

if TYPE_CHECKING:
    from engine.model import Model

F64 = npt.NDArray[np.float64]


@dataclass
class Decomposition:
    """The parts of one position's final residual stream and their values along one logit direction."""

    parts: list[Part]  # every part, vectors in the final residual stream's space (scales after them applied)
    values: F64  # (n_parts,) u . part
    layer_updates: F64  # (n_layers,) u . (what block i wrote, carried to the end): each layer's recorded update
    direction: F64  # u (dim,)
    linear: float  # u . x_L
    logit_diff: float  # the run's (pre-cap) logit of the target minus the contrast's


def direction(model: Model, x_last: F64, target: int, contrast: int | None) -> F64:
    """u: W_U[target] - W_U[contrast] (or W_U[target]) times the final norm's weight over rms(x_L)."""
    net = model.net
    ids = [target] if contrast is None else [target, contrast]
    rows = np.asarray(net.output.weight.rows(ids), np.float64)
    w = rows[0] - rows[1] if contrast is not None else rows[0]
    rms = np.sqrt(np.mean(x_last * x_last) + net.args.norm_eps)
    return w * np.asarray(net.out_norm, np.float64) / rms


def residual_parts(model: Model, cap: Capture) -> tuple[list[Part], list[F64]]:
    """Every part of the last position's residual stream and, per block, the update it recorded (carried to the end)."""
    net = model.net
    n = net.args.n_layers
    eps = net.args.norm_eps
    parts: list[Part] = [Part("embed", None, None, np.asarray(cap.at(0, "hook_resid_pre"), np.float64))]
    updates: list[F64] = []
    scales = getattr(net, "out_scales", None) or [None] * n
    per_layer = getattr(net, "per_layer", None)
    for i in range(n):
        layer = net.layers[i]
        off = net.ablated_blocks.get(i, ())
        pre32, attn32, mlp32 = (cap.at(i, k) for k in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out"))
        pre, post = np.asarray(pre32, np.float64), np.asarray(cap.at(i, "hook_resid_post"), np.float64)
        new: list[Part] = []
        if "attn" not in off:
            heads = attention_parts(net, i, cap.at(i, "attn.hook_z"), pre32)
            if layer.post_attn_norm is not None:
                for part, v in zip(heads, rms_linear([h.vec for h in heads], layer.post_attn_norm, eps)):
                    part.vec = v
            new += heads
        x_mid = pre32 + attn32  # the run's float32 residual after attention, bit for bit
        if "ffn" not in off:
            new += ffn_parts(net, i, x_mid, mlp32, cap.routing.get(i))
        if per_layer is not None:  # Gemma 4: the per-layer input, recomputed on the whole batch as the run had it
            x_ffn = cap.acts[i]["hook_resid_pre"] + cap.acts[i]["hook_attn_out"] + cap.acts[i]["hook_mlp_out"]
            ple = per_layer.apply(i, x_ffn, net.ops) - x_ffn
            new.append(Part("per_layer_input", i, None, np.asarray(ple[-1], np.float64)))
        scale = scales[i]
        s = 1.0 if scale is None else float(scale)
        if scale is not None:  # the block's output scale multiplies everything the stream holds
            for part in parts + new:
                part.vec = part.vec * s
        direction_i = net.control.get(i)
        if direction_i is not None:
            new.append(Part("control", i, None, np.asarray(direction_i, np.float64).reshape(-1)))
        parts += new
        update = post - s * pre
        explained = np.sum([q.vec for q in new], axis=0) if new else np.zeros_like(update)
        parts.append(Part("remainder", i, None, update - explained))
        updates = [u * s for u in updates]
        updates.append(update)
    return parts, updates


def decompose(model: Model, cap: Capture, target: int, contrast: int | None) -> Decomposition:
    """The last position's logit of `target` (minus `contrast`'s) split into the parts of the module docstring."""
    parts, updates = residual_parts(model, cap)
    n = model.net.args.n_layers
    x_last = np.asarray(cap.at(n - 1, "hook_resid_post"), np.float64)
    u = direction(model, x_last, target, contrast)
    row = cap.pre_cap.astype(np.float64)
    diff = float(row[target] - (row[contrast] if contrast is not None else 0.0))
    values = np.array([float(part.vec @ u) for part in parts], np.float64)
    linear = float(x_last @ u)
    parts.append(Part("remainder", None, None, np.zeros_like(u)))  # the head's: the run's logit minus u . x_L
    values = np.append(values, diff - float(np.sum(values)))
    return Decomposition(parts, values, np.array([float(v @ u) for v in updates]), u, linear, diff)
