"""Gemma 4's FFN seam: the dense GELU FFN, and in a Mixture-of-Experts layer the experts beside it, each branch with
its own norms, as llama.cpp's gemma4.cpp runs them.

The block graph (engine.models.transformer) hands this seam the residual stream x itself (the layer's `ffn_norm` is
None), because the router reads x without the FFN's norm. Op for op, in gemma4.cpp's order:

- a dense layer: ffn_norm, then gelu(ffn_gate h) * ffn_up h (ggml_geglu), ffn_down;
- an experts layer: mlp = post_ffw_norm_1(the dense FFN above); the experts' input pre_ffw_norm_2(x); the router's
  logits ffn_gate_inp (rms_norm(x) * 1/sqrtf(n_embd) * ffn_gate_inp.scale); build_moe_ffn on them: softmax over all
  experts, the top k (ties to the lower index), their probabilities divided by their sum; each chosen expert's gate
  and up from one ffn_gate_up_exps product (gate first) or from ffn_gate_exps and ffn_up_exps, GELU-gated, through
  ffn_down_exps, times the expert's ffn_down_exps.scale (where the file has it) and its weight, the slots summed in
  order; moe = post_ffw_norm_2(that); the seam's output is mlp + moe.

The graph then applies post_ffw_norm and adds the residual. The experts' products are engine.models.experts'
(`ExpertLinear`: MUL_MAT_ID as ggml-cpu computes it, the activations quantized once for gate and up) and its
routing (`route`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError
from engine.kernels.dispatch import Activation
from engine.models.experts import ExpertLinear, route
from engine.models.ffn import DenseFFN
from engine.models.per_layer_inputs import inv_sqrtf
from engine.models.weights import Weights
from engine.tensor import FusedLinear, Linear

if TYPE_CHECKING:
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]


@dataclass
class Gemma4Experts:
    """The experts branch of a Gemma 4 layer (see the module docstring)."""

    router: Linear  # ffn_gate_inp: n_embd -> n_expert
    router_scale: F32  # ffn_gate_inp.scale (n_embd,)
    pre_norm: F32  # pre_ffw_norm_2
    post_norm: F32  # post_ffw_norm_2
    down: ExpertLinear  # ffn_down_exps: width -> n_embd
    n_used: int
    layer: int
    gate_up: ExpertLinear | None = None  # ffn_gate_up_exps: n_embd -> 2 x width, gate then up
    gate: ExpertLinear | None = None  # or ffn_gate_exps and ffn_up_exps
    up: ExpertLinear | None = None
    down_scale: F32 | None = None  # ffn_down_exps.scale (n_expert,): each expert's output times its own scale
    ablated_experts: npt.NDArray[np.int64] | None = None  # never chosen: their logits -inf (engine.intervene)

    def __call__(self, x: F32, ops: Any, eps: float, recorder: Recorder | None = None) -> F32:
        """The branch's output (T, dim), post_ffw_norm_2 applied, for the residual stream x (T, dim)."""
        t, k = x.shape[0], self.n_used
        h = ops.norm(x, self.pre_norm, eps)
        unit = np.ones(x.shape[-1], np.float32)  # ggml_rms_norm without a weight: x * 1 is x
        r_in = ops.norm(x, unit, eps) * inv_sqrtf(x.shape[-1]) * self.router_scale
        if recorder is not None:
            recorder.record_input((self.router.weight.name,), r_in)
        logits = self.router(r_in)
        if self.ablated_experts is not None:  # as a router bias of -inf would: never among the top k
            logits = logits.copy()
            logits[:, self.ablated_experts] = -np.inf
        r = route(logits, k, ops, True, "softmax", display=recorder is not None)
        if recorder is not None:
            recorder.record_routing(self.layer, r.experts, r.weights, r.probs)
        ids = r.experts.reshape(-1).astype(np.int64)  # slot-major per token: (token, slot) rows
        src = np.repeat(np.arange(t), k)
        act = Activation(h)  # quantized once for every expert's gate and up
        if self.gate_up is not None:
            gu = self.gate_up(act, ids, src)
            width = gu.shape[-1] // 2
            gate, up = gu[:, :width], gu[:, width:]
        else:
            assert self.gate is not None and self.up is not None
            up = self.up(act, ids, src)
            gate = self.gate(act, ids, src)
        down = self.down(ops.glu("geglu", gate, up), ids)
        if self.down_scale is not None:  # build_lora_mm_id's ggml_mul by the expert's scale
            down = down * self.down_scale[ids][:, None]
        y = down.reshape(t, k, -1) * r.weights[:, :, None]  # ggml_mul by the weights
        out = y[:, 0].copy()
        for s in range(1, k):  # ggml_add of the slots' views, one after another
            out = out + y[:, s]
        return ops.norm(out, self.post_norm, eps)

    def experts(self) -> list[ExpertLinear]:
        parts = [self.gate_up] if self.gate_up is not None else [self.up, self.gate]
        return [p for p in (*parts, self.down) if p is not None]


@dataclass
class Gemma4FFN:
    """A Gemma 4 layer's FFN seam: ffn_norm and the dense FFN, plus the experts branch in an experts layer."""

    norm: F32  # ffn_norm
    dense: DenseFFN
    eps: float
    moe: Gemma4Experts | None = None
    post_norm_1: F32 | None = None  # post_ffw_norm_1 (experts layers): the dense FFN's own output norm
    gate_up: FusedLinear = field(init=False)

    def __post_init__(self) -> None:
        self.gate_up = self.dense.gate_up

    @property
    def n_used(self) -> int:
        """Experts each token uses (0 in a dense layer)."""
        return self.moe.n_used if self.moe is not None else 0

    @property
    def ablated_experts(self) -> npt.NDArray[np.int64] | None:
        return self.moe.ablated_experts if self.moe is not None else None

    @ablated_experts.setter
    def ablated_experts(self, value: npt.NDArray[np.int64] | None) -> None:
        if self.moe is not None:
            self.moe.ablated_experts = value

    def __call__(self, x: F32, ops: Any, recorder: Recorder | None = None) -> F32:
        """The seam's output (T, dim) for the residual stream x (T, dim) after attention."""
        mlp = self.dense(ops.norm(x, self.norm, self.eps), ops, recorder)
        if self.moe is None:
            return mlp
        assert self.post_norm_1 is not None
        return ops.norm(mlp, self.post_norm_1, self.eps) + self.moe(x, ops, self.eps, recorder)

    def input_names(self) -> tuple[tuple[str, ...], ...]:
        """The matrices each recorded input feeds: the dense FFN's gate/up and down (the router's is recorded apart)."""
        return self.dense.input_names()

    def linears(self) -> list[Linear]:
        """The dense matrices: the dense FFN's, then the router's; the experts are in `experts()`."""
        return [*self.dense.linears(), *([self.moe.router] if self.moe is not None else [])]

    def experts(self) -> list[ExpertLinear]:
        return self.moe.experts() if self.moe is not None else []


def load_gemma4_ffn(w: Weights, i: int, a: Any, glu: str) -> Gemma4FFN:
    """Block i's FFN seam in load_arch_tensors's order: ffn_norm and the dense FFN (a.hidden[i] wide), and, where
    the block has ffn_gate_inp, the experts beside it (a.n_expert of a.expert_hidden, a.n_expert_used per token)."""
    b, n_ff, dim = f"blk.{i}.", a.hidden[i], a.dim
    norm = w.vector(b + "ffn_norm.weight", dim)
    parts = [w.linear(b + "ffn_gate.weight", dim, n_ff), w.linear(b + "ffn_up.weight", dim, n_ff)]
    dense = DenseFFN(parts, w.linear(b + "ffn_down.weight", n_ff, dim), glu)
    if not w.has(b + "ffn_gate_inp.weight"):
        return Gemma4FFN(norm, dense, a.norm_eps)
    if not a.n_expert:
        raise ModelFormatError(f"{a.arch}.expert_count", f"required metadata key is missing ({b}ffn_gate_inp.weight is in "
                               "the file)")
    n, width = a.n_expert, a.expert_hidden
    router = w.linear(b + "ffn_gate_inp.weight", dim, n)
    router_scale = w.vector(b + "ffn_gate_inp.scale", dim)
    pre_norm = w.vector(b + "pre_ffw_norm_2.weight", dim)
    post_1 = w.vector(b + "post_ffw_norm_1.weight", dim)
    post_2 = w.vector(b + "post_ffw_norm_2.weight", dim)
    mats: dict[str, ExpertLinear] = {}
    if w.has(b + "ffn_gate_up_exps.weight"):
        mats["gate_up"] = w.experts(b + "ffn_gate_up_exps.weight", dim, 2 * width, n)
    else:
        mats["gate"] = w.experts(b + "ffn_gate_exps.weight", dim, width, n)
        mats["up"] = w.experts(b + "ffn_up_exps.weight", dim, width, n)
    down = w.experts(b + "ffn_down_exps.weight", width, dim, n)
    down_scale = w.vector(b + "ffn_down_exps.scale", n) if w.has(b + "ffn_down_exps.scale") else None
    moe = Gemma4Experts(router, router_scale, pre_norm, post_2, down, a.n_expert_used, i, down_scale=down_scale, **mats)
    return Gemma4FFN(norm, dense, a.norm_eps, moe, post_1)
