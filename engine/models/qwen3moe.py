"""The qwen3moe architecture (Qwen3-30B-A3B and its kin): Qwen 3's attention with a Mixture-of-Experts FFN.

As llama.cpp's llama_model_qwen3moe (src/models/qwen3moe.cpp): per-head q/k RMSNorm before NEOX RoPE as qwen3,
and in every block build_moe_ffn with a softmax router over all `expert_count` experts, the top
`expert_used_count` renormalised (norm_w), SwiGLU experts `expert_feed_forward_length` wide (else
feed_forward_length / expert_used_count). No shared expert. The FFN is engine.models.experts'.
"""
from __future__ import annotations

from engine.models.qwen3 import Qwen3
from engine.models.registry import register


@register("qwen3moe")
class Qwen3MoE(Qwen3):
    """Qwen 3 MoE as llama.cpp's qwen3moe graph runs it."""

    moe = "required"
    moe_normalize = True
