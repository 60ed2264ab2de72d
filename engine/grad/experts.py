"""The Mixture-of-Experts FFN seam on traced values: the routing frozen as the forward chose it, the rest recorded.

engine.models.experts.MoEFFN multiplies each expert's rows in compiled kernels or into preallocated arrays, which a
tape cannot follow. `TracedMoE` stands in for it during a traced pass (engine.grad.backward.traced swaps it into the
layer's FFN seam and back) and computes the same maths with NumPy ops on Vars: the router product and bias, the
experts chosen on the plain router logits of the traced (float32 reference) pass by MoEFFN's own `route` (top k, ties
to the lower index: piecewise constant, so no gradient flows through the choice), the chosen experts' weights as a traced function of the logits (softmax
then gather, or gather then softmax for gpt-oss, renormalised when the layer does), each routed row through its
expert's dequantized up / gate / down with their biases and the layer's GLU, the weighted sum of the slots and the
shared expert with its gate. Checked against the model's own float32 forward and against finite differences.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from engine.grad.vjps import dequantized
from engine.models.experts import WEIGHT_SUM_MIN, ExpertLinear, MoEFFN, route
from engine.runtime.numerics import Float32Numerics

_PLAIN = Float32Numerics()  # the routing's choice on plain values


class TracedMoE:
    """A MoEFFN's maths on traced values (see the module docstring)."""

    def __init__(self, ffn: MoEFFN):
        self.ffn = ffn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ffn, name)

    def __call__(self, h: Any, ops: Any, recorder: Any = None) -> Any:
        f = self.ffn
        t, k = h.shape[0], f.n_used
        logits = f.router(h)  # (T, n_expert)
        if f.router_bias is not None:
            logits = logits + f.router_bias
        if f.ablated_experts is not None:
            logits = logits.copy()
            logits[:, f.ablated_experts] = -np.inf
        plain = np.asarray(logits.value, np.float32)
        experts = route(plain, k, _PLAIN, f.normalize, f.gating, display=False).experts.astype(np.int64)  # (T, k)
        rows = np.arange(t)[:, None]
        if f.gating == "softmax_weight":  # gpt-oss: a softmax over the k chosen logits
            weights = ops.softmax(logits[rows, experts])
        else:
            weights = ops.softmax(logits)[rows, experts]  # (T, k)
        if f.normalize:  # build_moe_ffn's norm_w: divided by their sum, clamped below
            weights = weights / np.maximum(np.sum(weights, axis=-1, keepdims=True), WEIGHT_SUM_MIN)
        ids = experts.reshape(-1)  # slot-major per token, as MoEFFN's rows
        src = np.repeat(np.arange(t), k)
        down = self._experts(h, ids, src, ops)  # (T * k, dim)
        y = down.reshape(t, k, -1) * weights[:, :, None]
        out = y[:, 0]
        for s in range(1, k):
            out = out + y[:, s]
        if f.shared is not None and f.shared_gate is not None:
            z = f.shared_gate(h)  # (T, 1)
            gate = ops.sigmoid(z) if f.shared_sigmoid == "sigmoid" else ops.silu(z) / z
            out = out + f.shared(h, ops, None) * gate
        return out

    def _experts(self, h: Any, ids: np.ndarray, src: np.ndarray, ops: Any) -> Any:
        f = self.ffn
        if f.fused_gate_up:
            gu = _rows(f.up, h, ids, src)
            width = gu.shape[-1] // 2
            return _rows(f.down, ops.glu(f.glu, gu[:, :width], gu[:, width:]), ids, None)
        up = _biased(_rows(f.up, h, ids, src), f.up_bias, ids)
        if f.gate is not None:
            g = ops.glu(f.glu, _biased(_rows(f.gate, h, ids, src), f.gate_bias, ids), up)
        else:
            g = ops.silu(up)
        return _biased(_rows(f.down, g, ids, None), f.down_bias, ids)


class TracedGemma4Experts:
    """A Gemma 4 experts branch (engine.models.gemma4_ffn.Gemma4Experts) on traced values: its router input (the
    unweighted RMS norm, scaled), the routing frozen as above (softmax, top k, the chosen weights renormalised), each
    routed row through its expert's gate and up (fused or not), GeGLU, down and the expert's output scale, the slots
    summed and post_ffw_norm_2."""

    def __init__(self, moe: Any):
        self.moe = moe

    def __getattr__(self, name: str) -> Any:
        return getattr(self.moe, name)

    def __call__(self, x: Any, ops: Any, eps: float, recorder: Any = None) -> Any:
        m = self.moe
        t, k = x.shape[0], m.n_used
        h = ops.norm(x, m.pre_norm, eps)
        unit = np.ones(x.shape[-1], np.float32)
        logits = m.router(ops.norm(x, unit, eps) * (1.0 / np.sqrt(float(x.shape[-1]))) * m.router_scale)
        if m.ablated_experts is not None:
            logits = logits.copy()
            logits[:, m.ablated_experts] = -np.inf
        plain = np.asarray(logits.value, np.float32)
        experts = route(plain, k, _PLAIN, True, "softmax", display=False).experts.astype(np.int64)  # (T, k)
        weights = ops.softmax(logits)[np.arange(t)[:, None], experts]
        weights = weights / np.maximum(np.sum(weights, axis=-1, keepdims=True), WEIGHT_SUM_MIN)
        ids, src = experts.reshape(-1), np.repeat(np.arange(t), k)
        if m.gate_up is not None:
            gu = _rows(m.gate_up, h, ids, src)
            width = gu.shape[-1] // 2
            gate, up = gu[:, :width], gu[:, width:]
        else:
            gate, up = _rows(m.gate, h, ids, src), _rows(m.up, h, ids, src)
        down = _rows(m.down, ops.glu("geglu", gate, up), ids, None)
        if m.down_scale is not None:
            down = down * m.down_scale[ids][:, None]
        y = down.reshape(t, k, -1) * weights[:, :, None]
        out = y[:, 0]
        for s in range(1, k):
            out = out + y[:, s]
        return ops.norm(out, m.post_norm, eps)


def _rows(w: ExpertLinear, x: Any, ids: np.ndarray, src: np.ndarray | None) -> Any:
    """Row r: x[src[r]] (x[r] without src) times expert ids[r]'s dequantized weight, rows grouped by expert."""
    order = np.argsort(ids, kind="stable")
    starts = np.flatnonzero(np.diff(ids[order], prepend=-1))
    groups = np.split(order, starts[1:])
    parts = []
    for sel in groups:
        picked = sel if src is None else src[sel]
        q = w.expert(int(ids[sel[0]]))
        weight = dequantized(q)  # its VJP dequantizes it again rather than keep it
        parts.append(x[picked] @ weight.T)
    stacked = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)  # rows in `order`
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return stacked[inverse]


def _biased(rows: Any, bias: np.ndarray | None, ids: np.ndarray) -> Any:
    return rows if bias is None else rows + bias[ids]
