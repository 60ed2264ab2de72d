"""The qwen3 architecture (Qwen 3 dense): per-head RMSNorm on q and k before RoPE, NEOX RoPE, no biases.

As llama.cpp's llama_model_qwen3 (src/models/qwen3.cpp): attn_q_norm / attn_k_norm (key_length wide) normalise
each head of q and k (build_norm, LLM_NORM_RMS), then ggml_rope_ext rotates halves; `attention.key_length`
may differ from embedding_length / head_count (Qwen 3 heads are 128 wide at every size), so q is
head_count * key_length wide and attn_output maps that back to embedding_length. The graph is
engine.models.transformer's.
"""
from __future__ import annotations

from engine.models.weights import Weights
from engine.models.registry import register
from engine.models.transformer import Transformer, TransformerArgs


@register("qwen3")
class Qwen3(Transformer):
    """Qwen 3 as llama.cpp's qwen3 graph runs it."""

    rope_mode = "neox"
    qk_norm = True
    default_rope_base = 10000.0

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> None:
        return None  # qwen3.cpp passes no freq_factors to ggml_rope_ext
