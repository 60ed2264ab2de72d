"""The gpt-oss architecture (gpt-oss-20b, gpt-oss-120b): attention sinks, sliding window on every other layer,
biases everywhere, and a Mixture-of-Experts FFN with the clamped SwiGLU.

As llama.cpp's llama_model_openai_moe (src/models/openai-moe.cpp):

- attention: q/k/v with biases (build_qkv), NEOX RoPE with YaRN where the file asks (rope.scaling.*), the sliding
  window (attention.sliding_window, required) on even layers (load_swa_pattern(2)), their own RoPE base only when
  rope.freq_base_swa says so; kq scale 1/sqrt(n_rot); the softmax of every row takes one learned logit per head,
  `attn_sinks` (ggml_soft_max_add_sinks), which carries no value; the output product plus `attn_output.bias`;
- the FFN's input norm is `post_attention_norm`; build_moe_ffn with the router's bias, SOFTMAX_WEIGHT gating (the
  top `expert_used_count` logits, weighted by a softmax over those alone), each expert's up/gate/down bias
  (ggml_add_id) and swiglu_oai: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1);
- the head is output.weight (never tied).

The graph is engine.models.transformer's, the experts engine.models.experts'.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.errors import ModelFormatError
from engine.models.args import MetadataView
from engine.models.decoder import Numerics
from engine.models.registry import register
from engine.models.transformer import Layer, Transformer, TransformerArgs
from engine.models.weights import Weights

SWA_PATTERN = 2  # load_swa_pattern(ml, 2): layer i slides when i % 2 == 0


@dataclass
class GptOssArgs(TransformerArgs):
    """gpt-oss hyper-parameters from `gpt-oss.*` metadata."""

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int, arch: str = "gpt-oss") -> GptOssArgs:
        m = MetadataView(md, arch)
        window = m.int("attention.sliding_window")  # ml.get_key without a default: required
        args = cls.read(md, n_vocab, arch, rope_base=10000.0, moe="required",
                        sliding_window=window if window > 0 else None,
                        swa_pattern=m.int("attention.sliding_window_pattern", SWA_PATTERN))
        args.attn_scale = 1.0 / math.sqrt(args.rope_dim)  # openai-moe.cpp: 1.0f/sqrtf(float(n_rot))
        return args  # type: ignore[return-value]


@register("gpt-oss")
class GptOss(Transformer):
    """gpt-oss as llama.cpp's openai-moe graph runs it."""

    Args = GptOssArgs
    rope_mode = "neox"
    glu = "swiglu_oai"
    moe = "required"
    moe_normalize = False
    moe_gating = "softmax_weight"
    expert_biases = True
    ffn_norm_name = "post_attention_norm"
    always_tied = False

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> GptOssArgs:
        return GptOssArgs.from_metadata(md, n_vocab, cls.arch_name)

    def __init__(self, args: TransformerArgs, w: Weights, ops: Numerics):
        if not w.has("output.weight"):  # create_tensor(output, 0): llama.cpp never ties gpt-oss's head
            raise ModelFormatError("output.weight", "required tensor is missing from the file")
        super().__init__(args, w, ops)

    def load_layer(self, w: Weights, i: int, a: TransformerArgs) -> Layer:
        layer = super().load_layer(w, i, a)
        layer.sinks = w.vector(f"blk.{i}.attn_sinks.weight", a.n_heads)
        layer.wo_bias = w.vector(f"blk.{i}.attn_output.bias", a.dim)
        return layer

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> None:
        return None  # openai-moe.cpp passes no freq_factors to ggml_rope_ext
