"""The gemma3 architecture: scaled embeddings, Q/K norms, GELU-gated FFN, post-norms, local/global attention."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.models import ggml_ops
from engine.models.base import BaseArgs, LayerAttentionSpec, MetadataView, gelu_tanh
from engine.models.decoder import Block, DecoderModel, Weights
from engine.models.registry import register
from engine.models.rope import rope_freqs

if TYPE_CHECKING:  # the recorder is passed in; models never build one
    from engine.observe.recorder import Recorder

SWA_PATTERN = 6  # every 6th layer is global, the other five use the sliding window (as llama.cpp's set_swa_pattern(6))
ROPE_BASE_LOCAL = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3 when the file does not say


@dataclass
class Gemma3Args(BaseArgs):
    """Gemma 3 hyper-parameters from `gemma3.*` metadata."""

    sliding_window: int | None = None  # attention.sliding_window; None = every layer global
    rope_base_local: float = ROPE_BASE_LOCAL
    attn_scale: float = 0.0  # query scale, 1/sqrt(key_length)

    def is_local(self, layer: int) -> bool:
        return self.sliding_window is not None and layer % SWA_PATTERN < SWA_PATTERN - 1

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int, arch: str = "gemma3") -> Gemma3Args:
        m = MetadataView(md, arch)
        window = m.optional_int("attention.sliding_window")
        args = cls(
            **cls.common_fields(m, n_vocab, rope_base=1_000_000.0),
            sliding_window=window if window and window > 0 else None,
            rope_base_local=m.float("rope.freq_base_swa", ROPE_BASE_LOCAL),
        )
        args.check()
        args.attn_scale = 1.0 / math.sqrt(args.head_dim)  # after check(): key_length is known to be >= 2
        return args


@dataclass
class Gemma3Layer(Block):
    """A Gemma 3 block: the common weights plus per-head q/k norms and post-attention / post-FFN norms."""

    q_norm: npt.NDArray[np.float32]
    k_norm: npt.NDArray[np.float32]
    post_attn_norm: npt.NDArray[np.float32]
    post_ffn_norm: npt.NDArray[np.float32]


@register("gemma3")
class Gemma3(DecoderModel):
    """Gemma 3 as llama.cpp's build_gemma3 (iswa) runs it; norm weights in the GGUF already include Gemma's +1."""

    rope_mode = "neox"
    glu = "geglu"
    query_scaled = True

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> Gemma3Args:
        return Gemma3Args.from_metadata(md, n_vocab, cls.arch_name)

    def __init__(self, args: Gemma3Args, w: Weights):
        super().__init__(args, w)
        a = args
        d = a.head_dim
        self.tok_embd = w.qtensor("token_embd.weight", (a.dim, a.n_vocab))
        self.layers = [
            Gemma3Layer(
                **Block.fields(w, i, a),
                q_norm=w.vector(f"blk.{i}.attn_q_norm.weight", d),
                k_norm=w.vector(f"blk.{i}.attn_k_norm.weight", d),
                post_attn_norm=w.vector(f"blk.{i}.post_attention_norm.weight", a.dim),
                post_ffn_norm=w.vector(f"blk.{i}.post_ffw_norm.weight", a.dim),
            )
            for i in range(a.n_layers)
        ]
        self.out_norm = w.vector("output_norm.weight", a.dim)
        name = "output.weight" if w.has("output.weight") else "token_embd.weight"
        self.output = w.linear(name, a.dim, a.n_vocab)
        self.output.column_major = True
        self.freqs_global = rope_freqs(a.rope_dim, a.rope_base)
        self.freqs_local = rope_freqs(a.rope_dim, a.rope_base_local)
        group = a.n_heads // a.n_kv_heads
        # the query is scaled before attention (ggml_scale by f_attention_scale), so the kq scale is 1
        self.specs = [
            LayerAttentionSpec(a.attn_scale, a.sliding_window if a.is_local(i) else None, group,
                               a.rope_base_local if a.is_local(i) else a.rope_base)
            for i in range(a.n_layers)
        ]

    def embed(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        return self.embed_rows(self.tok_embd, ids) * np.float32(math.sqrt(self.args.dim))  # (T, dim)

    def run_layers(
        self, x: npt.NDArray[np.float32], start: int, cache: KVCache, recorder: Recorder | None, which: range
    ) -> npt.NDArray[np.float32]:
        a: Gemma3Args = self.args  # type: ignore[assignment]
        t = x.shape[0]
        pos = np.arange(start, start + t)
        rope = {
            "global": self.rope_tables(pos, a.rope_base, self.freqs_global),
            "local": self.rope_tables(pos, a.rope_base_local, self.freqs_local),
        }
        masks: dict = {}
        for i in which:
            layer = self.layers[i]
            spec = self.specs[i]
            cos, sin = rope["local" if a.is_local(i) else "global"]
            h = self.norm(x, layer.attn_norm)
            if recorder is not None:  # the inputs of the products, for an importance matrix
                recorder.record_input((layer.wq.weight.name, layer.wk.weight.name, layer.wv.weight.name), h)
            q, k, v = layer.qkv(h)
            q = self.norm(q.reshape(t, a.n_heads, a.head_dim), layer.q_norm)  # (T, Hq, d)
            k = self.norm(k.reshape(t, a.n_kv_heads, a.head_dim), layer.k_norm)  # (T, Hkv, d)
            v = v.reshape(t, a.n_kv_heads, a.head_dim)
            # the query is scaled (ggml_scale by f_attention_scale) after RoPE, then attention runs with scale 1
            fast = None if t > 1 else self.decode_attention(
                i, q[0], k[0], v[0], cache, start, cos[0], sin[0], spec.scale, 1.0, spec.window)
            if fast is not None:  # one token: RoPE, the cache write and attention in one compiled call
                q, o = fast
            else:
                q = self.rotate(q.transpose(1, 0, 2), cos, sin)  # (Hq, T, d)
                k = self.rotate(k.transpose(1, 0, 2), cos, sin)  # (Hkv, T, d)
                cache.put(i, start, k, v.transpose(1, 0, 2))
                o = self.attend(q * np.float32(spec.scale), cache, i, start + t, pos, 1.0, spec.window, masks)
            if recorder is not None:
                recorder.record_q(i, start, q, spec)
            o = o.transpose(1, 0, 2).reshape(t, a.n_heads * a.head_dim)
            if recorder is not None:
                recorder.record_input((layer.wo.weight.name,), o)
            o = layer.wo(o)
            x = x + self.norm(o, layer.post_attn_norm)
            h = self.norm(x, layer.ffn_norm)
            if recorder is not None:
                recorder.record_input((layer.w_gate.weight.name, layer.w_up.weight.name), h)
            gate, up = layer.gate_up(h)
            g = ggml_ops.geglu(gate, up) if self.numerics == "ggml" else gelu_tanh(gate) * up
            if recorder is not None:
                recorder.record_input((layer.w_down.weight.name,), g)
            f = layer.w_down(g)
            x = x + self.norm(f, layer.post_ffn_norm)
            if recorder is not None:
                recorder.record_hidden(i, start, x)
        return x

    def head(self, x: npt.NDArray[np.float32], all_logits: bool) -> npt.NDArray[np.float32]:
        x = self.norm(x if all_logits else x[-1:], self.out_norm)
        return self.output(x)
