"""The phi3 architecture (Phi-3, Phi-3.5 mini): fused attn_qkv, fused gate+up, partial RoPE, long/short factors.

As llama.cpp's llama_model_phi3 (src/models/phi3.cpp): one attn_qkv product whose rows are q, then k, then v
(build_qkv's views); one ffn_up product 2 * feed_forward_length wide whose first half is the gate and second the
up projection (build_ffn with LLM_FFN_SWIGLU, ggml_swiglu on the fused row); RoPE rotates halves (NEOX) of the
first rope.dimension_count dims of each head, the rest pass through; the query is scaled by 1/sqrt(head size)
after RoPE and attends with kq scale 1; rope_factors_long / rope_factors_short divide the pair frequencies, the
long ones when the context is longer than rope.scaling.original_context_length (model.get_rope_factors).
Phi-3's sliding-window metadata is ignored, as llama.cpp does. The graph is engine.models.transformer's.
"""
from __future__ import annotations

from typing import Any

from engine.models.weights import Weights
from engine.models.decoder import Numerics
from engine.models.ffn import DenseFFN
from engine.models.registry import register
from engine.models.rope import rope_freqs
from engine.models.transformer import Transformer, TransformerArgs

FACTORS = ("rope_factors_long.weight", "rope_factors_short.weight")


@register("phi3")
class Phi3(Transformer):
    """Phi-3 as llama.cpp's phi3 graph runs it (the non-SWA variant it always builds)."""

    rope_mode = "neox"
    query_scaled = True

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> TransformerArgs:
        args = super().args_from_metadata(md, n_vocab)
        args.sliding_window = None  # llama_model_phi3::load_arch_hparams: "Phi SWA is currently disabled"
        return args

    def __init__(self, args: TransformerArgs, w: Weights, ops: Numerics):
        self._factors = {name: w.vector(name, args.rope_dim // 2) for name in FACTORS if w.has(name)}
        super().__init__(args, w, ops)
        self._scalings = {name: args.scaling(f) for name, f in self._factors.items()}
        self._chosen = ""
        self.select_rope(args.n_ctx)

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> None:
        return None  # chosen per context size in select_rope

    def load_ffn(self, w: Weights, b: str, a: TransformerArgs) -> DenseFFN:
        up = w.linear(b + "ffn_up.weight", a.dim, 2 * a.hidden_dim)  # gate rows, then up rows
        return DenseFFN([up], w.linear(b + "ffn_down.weight", a.hidden_dim, a.dim), self.glu)

    def select_rope(self, n_ctx: int) -> None:
        """model.get_rope_factors: the long factors when the context exceeds the original one, else the short."""
        a: TransformerArgs = self.args  # type: ignore[assignment]
        name = FACTORS[0] if n_ctx > a.n_ctx_orig else FACTORS[1]
        if name == self._chosen or name not in self._scalings:
            return
        self._chosen = name
        self.rope_scaling = self._scalings[name]
        self.freqs_by_base = {s.rope_base: rope_freqs(a.rope_dim, s.rope_base, self.rope_scaling) for s in self.specs}
        self.freqs = self.freqs_by_base[a.rope_base]
