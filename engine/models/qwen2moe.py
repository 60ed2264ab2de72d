"""The qwen2moe architecture (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen 2's attention, routed experts and a shared expert.

As llama.cpp's llama_model_qwen2moe (src/models/qwen2moe.cpp): q/k/v biases and NEOX RoPE as qwen2; the FFN is
build_moe_ffn with a softmax router and the top `expert_used_count` experts weighted by their probabilities as
they are (no renormalisation), plus a shared SwiGLU expert (`expert_shared_feed_forward_length` wide, else
feed_forward_length) scaled by sigmoid(ffn_gate_inp_shexp x h), which ggml computes as silu(x) / x.
"""
from __future__ import annotations

from engine.models.qwen2 import Qwen2
from engine.models.registry import register


@register("qwen2moe")
class Qwen2MoE(Qwen2):
    """Qwen 2 MoE as llama.cpp's qwen2moe graph runs it."""

    moe = "required"
    moe_normalize = False
    shared_expert = True
