"""The llama architecture (SmolLM2, Llama 2, Llama 3.x): RMSNorm, RoPE, grouped-query attention, SwiGLU.

As llama.cpp's llama_model_llama (src/models/llama.cpp): rope type NORM (adjacent pairs); Llama 3.x's
`rope_freqs.weight` divides each pair's frequency (model.get_rope_factors, ggml_rope_ext's freq_factors);
`rope.scaling.type` linear or yarn scales the positions where the metadata asks; the head is output.weight or,
when the file has none, the token embeddings (tied). A file with `expert_count` (Mixtral) has a Mixture-of-Experts
FFN in every block, feed_forward_length wide per expert, the top experts' weights renormalised (build_moe_ffn with
norm_w, engine.models.experts). The graph itself is engine.models.transformer's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ModelFormatError
from engine.models.registry import register
from engine.models.transformer import Transformer, TransformerArgs


@dataclass
class LlamaArgs(TransformerArgs):
    """Hyper-parameters of a llama-family model, read from `llama.*` metadata."""

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int, arch: str = "llama", moe: str = "") -> LlamaArgs:
        args = cls.read(md, n_vocab, arch, rope_base=10000.0, moe=moe)
        if args.rope_dim != args.head_dim:  # llama_model::load_hparams: "invalid n_rot"
            raise ModelFormatError(f"{arch}.rope.dimension_count", f"must equal the head size {args.head_dim} for llama",
                                   args.rope_dim)
        return args  # type: ignore[return-value]


@register("llama")
class Llama(Transformer):
    """Decoder of the llama family as llama.cpp's build_llama runs it (optional q/k/v biases, rope type NORM)."""

    Args = LlamaArgs
    rope_mode = "norm"
    moe = "optional"

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> LlamaArgs:
        return LlamaArgs.from_metadata(md, n_vocab, cls.arch_name, cls.moe)
