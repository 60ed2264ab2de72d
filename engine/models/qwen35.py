"""The qwen35 architecture (Qwen3.5 / Qwen3.6 dense): a hybrid of gated DeltaNet layers and gated full attention.

As llama.cpp's llama_model_qwen35 (src/models/qwen35.cpp):

- which layers are recurrent: `attention.recurrent_layers` (one flag per block) or else every layer but each
  `full_attention_interval`-th (default 4: layers 3, 7, 11, ... attend); the recurrent ones are DeltaNet mixers
  (engine.models.deltanet) reading `ssm.*`;
- attention layers: attn_q gives each head's query and then its output gate (2 x key_length per head); q and k
  RMS-normed per head (attn_q_norm / attn_k_norm), partial interleaved multi-section RoPE (IMROPE, the first
  rope.dimension_count dims of a head, `rope.dimension_sections`), kq scale 1/sqrt(key_length), the attention's
  output times sigmoid(gate) before attn_output;
- every block: attn_norm, the mixer, the residual; then `post_attention_norm` as the FFN's input norm, the FFN
  (SwiGLU here, experts in qwen35moe), the residual; then the control vector;
- `nextn_predict_layers` trailing blocks are the multi-token-prediction head, which llama.cpp loads but does not
  run in the main pass: skipped here too.

IMROPE for text is engine.models.rope's `imrope_factors`; the hyper-parameters are engine.models.hybrid's.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from engine.errors import ModelFormatError
from engine.hybrid_cache import HybridCache, RecurrentShape
from engine.models.deltanet import DeltaNetMixer, MixerLayer, load_deltanet
from engine.models.experts import load_moe
from engine.models.hybrid import HybridArgs
from engine.models.registry import register
from engine.models.rope import imrope_factors
from engine.models.transformer import Layer, Transformer, TransformerArgs
from engine.models.weights import Weights


@register("qwen35")
class Qwen35(Transformer):
    """Qwen3.5 as llama.cpp's qwen35 graph runs it (see the module docstring)."""

    Args = HybridArgs
    rope_mode = "neox"
    qk_norm = True
    attn_output_gate = True
    ffn_norm_name = "post_attention_norm"
    fused_gate_up_exps = True  # qwen35moe.cpp, qwen3next.cpp: create_tensor_gate_up_exps
    shared_sigmoid = "sigmoid"  # qwen35moe's shared expert gate: ggml_sigmoid

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> HybridArgs:
        return HybridArgs.from_metadata(md, n_vocab, cls.arch_name, cls.moe)

    def __init__(self, args: TransformerArgs, w: Weights, ops: Any):
        a: HybridArgs = args  # type: ignore[assignment]
        if a.rope_dim > a.head_dim or sum(a.rope_sections) * 2 > a.rope_dim:
            raise ModelFormatError(f"{a.arch}.rope.dimension_sections", f"sum to more than the {a.rope_dim // 2} rotated "
                                   "pairs", list(a.rope_sections))
        self.mixers = [i for i, r in enumerate(a.recurrent) if r]
        super().__init__(args, w, ops)

    def load_layer(self, w: Weights, i: int, a: TransformerArgs) -> Layer | MixerLayer:  # type: ignore[override]
        args: HybridArgs = a  # type: ignore[assignment]
        gate = f"blk.{i}.ffn_gate_exps.weight"  # load_moe would run llama's gate-less experts; llama.cpp requires it
        if a.n_expert and not w.has(gate) and not w.has(f"blk.{i}.ffn_gate_up_exps.weight"):  # (or the fused one)
            raise ModelFormatError(gate, "required tensor is missing from the file (and there is no fused "
                                   f"blk.{i}.ffn_gate_up_exps.weight either)")
        if not args.recurrent[i]:
            return super().load_layer(w, i, a)
        b = f"blk.{i}."
        attn_norm = w.vector(b + "attn_norm.weight", a.dim)
        mixer = self.load_mixer(w, i, args)
        ffn_norm = w.vector(b + self.ffn_norm_name + ".weight", a.dim)
        ffn = load_moe(self, w, i, a) if a.n_expert else self.load_ffn(w, b, a)
        return MixerLayer(attn_norm, mixer, ffn_norm, ffn)

    def load_mixer(self, w: Weights, i: int, a: HybridArgs) -> DeltaNetMixer:
        """Block i's DeltaNet layer: attn_qkv, attn_gate, ssm_beta, ssm_alpha and the rest (engine.models.deltanet)."""
        assert a.deltanet is not None
        return load_deltanet(w, i, a.dim, a.deltanet, a.norm_eps)

    def refuse_ignored(self, w: Weights) -> None:
        """As Transformer's, but for the trailing MTP blocks, which llama.cpp loads and does not run: left out whole."""
        for name in w.unused():
            block = re.match(r"blk\.(\d+)\.", name)
            if (block is None or int(block.group(1)) < self.args.n_layers) and self.refused.match(name):
                raise ModelFormatError(name, f"is not applied by GGUF Lens's {self.arch_name} graph yet; the logits "
                                       "would be wrong")

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> np.ndarray | None:
        return imrope_factors(a.rope_dim, a.rope_sections)  # type: ignore[attr-defined]

    def new_cache(self, n_ctx: int | None = None, cache_type: str | None = None) -> HybridCache:
        """KV rows for the attention layers, a constant-size state for each DeltaNet layer (engine.hybrid_cache)."""
        a: HybridArgs = self.args  # type: ignore[assignment]
        shape = a.deltanet.recurrent_shape() if a.deltanet is not None else RecurrentShape(1, 1, 1, 1)  # none recurs
        return HybridCache(a.n_layers, a.n_kv_heads, a.head_dim, n_ctx or a.n_ctx, cache_type or self.ops.cache_type,
                           frozenset(self.mixers), shape)


@register("qwen35moe")
class Qwen35MoE(Qwen35):
    """Qwen3.5 / Qwen3.6 MoE (Qwen3.6-35B-A3B): the same blocks with build_moe_ffn (softmax router, top k
    renormalised) plus the shared expert times sigmoid(ffn_gate_inp_shexp h)."""

    moe = "required"
    moe_normalize = True
    shared_expert = True

