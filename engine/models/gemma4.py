"""The gemma4 architecture: Gemma 4 (E2B / E4B with per-layer inputs and KV sharing, 31B dense, 26B-A4B experts).

As llama.cpp's gemma4.cpp: the embeddings times sqrtf(n_embd); sliding and global blocks of their own shapes, some
reading another's K/V (engine.models.layer_kinds); q and k RMS-normed per head, V without a weight, NEOX RoPE (sliding:
base rope.freq_base_swa, 10000 by default; global: rope_freqs.weight as factors, "proportional" partial RoPE whose
unrotated pairs are divided by 1e30), kq scale 1; no attn_v: V is K's product; post_attention_norm; the FFN seam
(engine.models.gemma4_ffn: dense, experts beside it where a block has ffn_gate_inp), post_ffw_norm; per-layer inputs
(engine.models.per_layer_inputs); the block's output times layer_output_scale; a control vector. The head is output or
token_embd, soft-capped (final_logit_softcapping, 30 by default). Norm weights are stored as is (no +1 in Gemma 4).
Decode steps take the compiled step (engine.runtime.decode_plan): the dense FFN bound there, the seam with experts
and the per-layer inputs called between its compiled calls.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.errors import ModelFormatError
from engine.models.args import LayerAttentionSpec, MetadataView
from engine.models.gemma4_ffn import load_gemma4_ffn
from engine.models.layer_kinds import LayerKinds, flat_counts, load_attention
from engine.models.per_layer_inputs import PerLayerInputs, load_per_layer_inputs
from engine.models.registry import register
from engine.models.transformer import NOT_APPLIED, Layer, Transformer, TransformerArgs
from engine.models.weights import Weights
from engine.tensor import Linear

if TYPE_CHECKING:
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
# per-tensor scales llama.cpp multiplies in (NVFP4 files' attn_q.scale, ffn_up.scale, ...) that this graph does not;
# the router's ffn_gate_inp.scale and the experts' ffn_down_exps.scale it applies (they are read, so never refused)
REFUSED = re.compile(NOT_APPLIED.pattern + r"|^blk\.\d+\.[a-z_]+\.(scale|input_scale)$")


@dataclass
class Gemma4Args(TransformerArgs):
    """The transformer's (head_dim, rope_dim: the global blocks'), the blocks' kinds, the FFN widths per block."""

    kinds: LayerKinds | None = None
    hidden: tuple[int, ...] = ()  # feed_forward_length per block (E2B's KV-sharing blocks are twice as wide)
    per_layer_dim: int = 0  # embedding_length_per_layer_input

    def is_swa(self, layer: int) -> bool:
        return self.kinds.swa[layer] if self.kinds is not None else False

    def layer_specs(self) -> list[LayerAttentionSpec]:
        assert self.kinds is not None and self.sliding_window is not None
        return self.kinds.specs(self.sliding_window, self.rope_base, self.rope_base_swa)

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int, arch: str) -> Gemma4Args:
        m = MetadataView(md, arch)
        flat, hidden = flat_counts(m)
        experts = m.optional_int("expert_count")
        if experts and f"{arch}.expert_feed_forward_length" not in md:  # llama.cpp reads 0 and no expert tensor fits
            raise ModelFormatError(f"{arch}.expert_feed_forward_length", "required metadata key is missing")
        window = m.int("attention.sliding_window")
        a = cls.read(flat, n_vocab, arch, 10000.0, moe="required" if experts else "", attn_scale=1.0,
                     sliding_window=window, hidden=hidden, per_layer_dim=m.int("embedding_length_per_layer_input"))
        a.kinds = LayerKinds.read(m, len(hidden), a.head_dim, a.rope_dim)
        a.rope_base_swa = m.float("rope.freq_base_swa", 10000.0)  # rope_freq_base_train_swa's default
        cap = m.float("final_logit_softcapping", 30.0)  # llama_hparams' default
        checks = [("attention.sliding_window", window, window > 0 or not any(a.kinds.swa), "must be positive"),
                  ("embedding_length_per_layer_input", a.per_layer_dim, 0 <= a.per_layer_dim <= 1 << 16, "is out of range"),
                  ("final_logit_softcapping", cap, cap >= 0, "must not be negative"),
                  ("rope.scaling.factor", md.get(f"{arch}.rope.scaling.factor"),
                   a.rope_freq_scale == 1.0 and a.rope_scaling_type != "yarn",
                   "is not applied by GGUF Lens's gemma4 graph yet (llama.cpp scales the global blocks only)")]
        for key, value, ok, why in checks:
            if not ok:
                raise ModelFormatError(f"{arch}.{key}", why, value)
        a.final_softcap = cap or None
        return a


@register("gemma4")
class Gemma4(Transformer):
    """Gemma 4 as llama.cpp's gemma4.cpp runs it (see the module docstring)."""

    Args = Gemma4Args
    rope_mode = "neox"
    glu = "geglu"
    embed_scale = True
    refused = REFUSED
    per_layer: PerLayerInputs | None = None

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> Gemma4Args:
        return Gemma4Args.from_metadata(md, n_vocab, cls.arch_name)

    def __init__(self, args: TransformerArgs, w: Weights, ops: Any):
        a: Gemma4Args = args  # type: ignore[assignment]
        self.out_scales: list[np.float32 | None] = []  # layer_output_scale per block, filled by load_layer
        super().__init__(args, w, ops)
        if a.per_layer_dim:
            self.per_layer = load_per_layer_inputs(w, a.dim, a.per_layer_dim, a.n_layers, a.n_vocab, a.norm_eps)
        self.ropes = a.kinds.ropes(w, a.rope_base, a.rope_base_swa)  # type: ignore[union-attr]

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> None:
        return None  # only the global blocks' RoPE takes rope_freqs (self.ropes)

    def load_layer(self, w: Weights, i: int, a: TransformerArgs) -> Layer:  # type: ignore[override]
        """Block i's tensors in llama_model_gemma4::load_arch_tensors's order, each checked against its shape."""
        g: Gemma4Args = a  # type: ignore[assignment]
        b = f"blk.{i}."
        attn_norm = w.vector(b + "attn_norm.weight", a.dim)
        attention = load_attention(w, i, g.kinds, a.dim)  # type: ignore[arg-type]
        post_attn = w.vector(b + "post_attention_norm.weight", a.dim)
        scale = b + "layer_output_scale.weight"
        self.out_scales.append(np.float32(w.vector(scale, 1)[0]) if w.has(scale) else None)
        ffn = load_gemma4_ffn(w, i, g, self.glu)  # the seam norms the residual itself: the block's ffn_norm is None
        return Layer(attn_norm, ffn_norm=None, ffn=ffn, post_attn_norm=post_attn,
                     post_ffn_norm=w.vector(b + "post_ffw_norm.weight", a.dim), **attention)

    def new_cache(self, n_ctx: int | None = None, cache_type: str | None = None) -> KVCache:
        a: Gemma4Args = self.args  # type: ignore[assignment]
        return a.kinds.new_cache(n_ctx or a.n_ctx, cache_type or self.ops.cache_type)  # type: ignore[union-attr]

    def embed(self, ids: npt.NDArray[np.int64]) -> F32:
        """The scaled embeddings (T, dim); the per-layer inputs of the same tokens are kept for the blocks."""
        x = super().embed(ids)
        if self.per_layer is not None:
            self.per_layer.prepare(self, ids, x)
        return x

    def rope_tables(self, pos: np.ndarray) -> dict[Any, tuple[F32, F32]]:
        return {kind: self.ops.rope_tables(r, pos, r.base, r.freqs) for kind, r in self.ropes.items()}

    def rope_key(self, i: int) -> bool:
        return self.args.is_swa(i)  # type: ignore[attr-defined]

    def finish_block(self, i: int, x: F32, recorder: Recorder | None) -> F32:
        """gemma4.cpp after the FFN's residual: the per-layer input, then the block's output scale."""
        if self.per_layer is not None:
            x = self.per_layer.apply(i, x, self.ops, recorder)
        scale = self.out_scales[i]
        return x if scale is None else x * scale

    def linears(self) -> dict[str, Linear]:
        """Every matrix by tensor name in the order the graph multiplies them, the per-layer inputs' too."""
        p = self.per_layer
        mats = [m for i, layer in enumerate(self.layers) for m in [*layer.linears(), *(p.linears(i) if p else [])]]
        return {m.weight.name: m for m in [*mats, self.output]}
