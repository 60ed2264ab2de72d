"""The qwen2 architecture (Qwen 2 / 2.5): llama's block with biases on q, k and v, and NEOX RoPE.

As llama.cpp's llama_model_qwen2 (src/models/qwen2.cpp): build_qkv adds attn_{q,k,v}.bias after each product,
RoPE rotates halves (LLAMA_ROPE_TYPE_NEOX), no frequency factors; the head is output.weight or the tied
token embeddings. The graph is engine.models.transformer's.
"""
from __future__ import annotations

from engine.errors import ModelFormatError
from engine.models.weights import Weights
from engine.models.registry import register
from engine.models.transformer import Layer, Transformer, TransformerArgs


@register("qwen2")
class Qwen2(Transformer):
    """Qwen 2 as llama.cpp's qwen2 graph runs it: the q/k/v biases are required."""

    rope_mode = "neox"
    default_rope_base = 10000.0

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> None:
        return None  # qwen2.cpp passes no freq_factors to ggml_rope_ext

    def load_layer(self, w: Weights, i: int, a: TransformerArgs) -> Layer:
        layer = super().load_layer(w, i, a)
        if layer.biases is None:  # create_tensor_qkv reads them as optional, but every Qwen 2 file has them
            name = f"blk.{i}.attn_q.bias"
            raise ModelFormatError(name, "required tensor is missing from the file (qwen2 has q/k/v biases)")
        return layer
