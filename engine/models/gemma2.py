"""The gemma2 architecture: soft-capped attention and logits, sliding window on alternate layers, post-norms.

As llama.cpp's llama_model_gemma2 (src/models/gemma2.cpp): the embeddings are scaled by sqrtf(n_embd); layers
alternate sliding-window (even layers, set_swa_pattern(2), window attention.sliding_window, 4096 by default)
and global attention; the query is scaled after NEOX RoPE by f_attention_scale (1/sqrt(key_length), or
1/sqrt(embedding_length / head_count) for the 46-layer 27B) and attends with kq scale 1; build_attn_mha caps the
raw scores as cap * tanh(kq / cap) (attn_logit_softcapping, 50 by default); post_attention_norm and
post_ffw_norm follow the attention and the GELU-gated FFN; the head is always token_embd, capped as
cap * tanh(logits / cap) (final_logit_softcapping, 30 by default). Norm weights in the GGUF already hold
Gemma's +1. The graph is engine.models.transformer's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engine.models.args import MetadataView
from engine.models.weights import Weights
from engine.models.registry import register
from engine.models.transformer import Transformer, TransformerArgs

SWA_PATTERN = 2  # load_swa_pattern(ml, 2): layer i slides when i % 2 == 0
DEFAULT_WINDOW = 4096  # hparams.n_swa for gemma 2 when the file does not say
DEFAULT_ATTN_SOFTCAP = 50.0  # llama_hparams' f_attn_logit_softcapping default
DEFAULT_FINAL_SOFTCAP = 30.0  # f_final_logit_softcapping default


@dataclass
class Gemma2Args(TransformerArgs):
    """Gemma 2 hyper-parameters from `gemma2.*` metadata."""

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int, arch: str = "gemma2") -> Gemma2Args:
        m = MetadataView(md, arch)
        window = m.int("attention.sliding_window", DEFAULT_WINDOW)
        args = cls.read(md, n_vocab, arch, rope_base=10000.0, sliding_window=window if window > 0 else None,
                        swa_pattern=m.int("attention.sliding_window_pattern", SWA_PATTERN),
                        attn_softcap=m.float("attn_logit_softcapping", DEFAULT_ATTN_SOFTCAP),
                        final_softcap=m.float("final_logit_softcapping", DEFAULT_FINAL_SOFTCAP))
        # llama_model_gemma2::load_arch_hparams: the 27B (46 layers) scales by the model width per head
        width = args.dim // args.n_heads if args.n_layers == 46 else args.head_dim
        args.attn_scale = 1.0 / math.sqrt(width)
        return args  # type: ignore[return-value]


@register("gemma2")
class Gemma2(Transformer):
    """Gemma 2 as llama.cpp's gemma2 (iswa) graph runs it."""

    Args = Gemma2Args
    rope_mode = "neox"
    glu = "geglu"
    query_scaled = True
    post_norms = True
    embed_scale = True
    always_tied = True
    swa_pattern = SWA_PATTERN

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> Gemma2Args:
        return Gemma2Args.from_metadata(md, n_vocab, cls.arch_name)

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> None:
        return None  # gemma2.cpp passes no freq_factors to ggml_rope_ext
