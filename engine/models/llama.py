"""The llama architecture (SmolLM2, Llama 2/3, ...): RMSNorm, RoPE, grouped-query attention, SwiGLU."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.models import ggml_ops
from engine.models.base import BaseArgs, LayerAttentionSpec, MetadataView, silu
from engine.models.decoder import Block, DecoderModel, Weights
from engine.models.registry import register
from engine.models.rope import rope_freqs

if TYPE_CHECKING:  # the recorder is passed in; models never build one
    from engine.observe.recorder import Recorder


@dataclass
class LlamaArgs(BaseArgs):
    """Hyper-parameters of a llama-family model, read from `llama.*` metadata."""

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int, arch: str = "llama") -> LlamaArgs:
        args = cls(**cls.common_fields(MetadataView(md, arch), n_vocab, rope_base=10000.0))
        args.check()
        return args


@register("llama")
class Llama(DecoderModel):
    """Decoder of the llama family as llama.cpp's build_llama runs it (no biases, rope type NORM)."""

    rope_mode = "norm"

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> LlamaArgs:
        return LlamaArgs.from_metadata(md, n_vocab, cls.arch_name)

    def __init__(self, args: LlamaArgs, w: Weights):
        super().__init__(args, w)
        a = args
        self.tok_embd = w.qtensor("token_embd.weight", (a.dim, a.n_vocab))
        self.layers = [Block(**Block.fields(w, i, a)) for i in range(a.n_layers)]
        self.out_norm = w.vector("output_norm.weight", a.dim)
        # tied embeddings when the file has no output.weight (SmolLM2)
        name = "output.weight" if w.has("output.weight") else "token_embd.weight"
        self.output = w.linear(name, a.dim, a.n_vocab)
        self.output.column_major = True
        self.freqs = rope_freqs(a.rope_dim, a.rope_base)
        self.spec = LayerAttentionSpec(1.0 / math.sqrt(a.head_dim), None, a.n_heads // a.n_kv_heads, a.rope_base)

    def embed(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        return self.embed_rows(self.tok_embd, ids)  # (T, dim)

    def run_layers(
        self, x: npt.NDArray[np.float32], start: int, cache: KVCache, recorder: Recorder | None, which: range
    ) -> npt.NDArray[np.float32]:
        a = self.args
        t = x.shape[0]
        pos = np.arange(start, start + t)
        cos, sin = self.rope_tables(pos, a.rope_base, self.freqs)
        masks: dict = {}
        for i in which:
            layer = self.layers[i]
            h = self.norm(x, layer.attn_norm)
            q, k, v = layer.qkv(h)
            fast = None if t > 1 else self.decode_attention(
                i, q.reshape(a.n_heads, a.head_dim), k.reshape(a.n_kv_heads, a.head_dim),
                v.reshape(a.n_kv_heads, a.head_dim), cache, start, cos[0], sin[0], 1.0, self.spec.scale, None)
            if fast is not None:  # one token: RoPE, the cache write and attention in one compiled call
                q, o = fast
            else:
                q = self.rotate(q.reshape(t, a.n_heads, a.head_dim).transpose(1, 0, 2), cos, sin)  # (Hq, T, d)
                k = self.rotate(k.reshape(t, a.n_kv_heads, a.head_dim).transpose(1, 0, 2), cos, sin)
                v = v.reshape(t, a.n_kv_heads, a.head_dim).transpose(1, 0, 2)  # (Hkv, T, d)
                cache.put(i, start, k, v)
                o = self.attend(q, cache, i, start + t, pos, self.spec.scale, None, masks)  # (Hq, T, d)
            if recorder is not None:
                recorder.record_q(i, start, q, self.spec)
            x = x + layer.wo(o.transpose(1, 0, 2).reshape(t, a.n_heads * a.head_dim))
            h = self.norm(x, layer.ffn_norm)
            gate, up = layer.gate_up(h)
            x = x + layer.w_down(ggml_ops.swiglu(gate, up) if self.numerics == "ggml" else silu(gate) * up)
            if recorder is not None:
                recorder.record_hidden(i, start, x)
        return x

    def head(self, x: npt.NDArray[np.float32], all_logits: bool) -> npt.NDArray[np.float32]:
        x = self.norm(x if all_logits else x[-1:], self.out_norm)
        return self.output(x)
