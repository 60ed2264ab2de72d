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

For text, IMROPE rotates NEOX pairs, pair i taking the position of the section its sector (i mod the sections'
sum) falls in; the text, height and width sections all see the token's position, and a pair outside them reads the
fourth position, which is 0 for text: that pair is not rotated. Here such pairs get a frequency factor of infinity
(theta / inf = 0, as ggml's freq_factors divide), so where the sections cover every pair (Qwen3.5's [11, 11, 10])
the rotation is plain NEOX, and where they do not (Qwen3-VL's [24, 20, 20] leaves pairs 61 and 62) it is not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from engine.errors import ModelFormatError
from engine.hybrid_cache import HybridCache
from engine.models.args import MetadataView
from engine.models.deltanet import DeltaNetDims, MixerLayer, load_deltanet
from engine.models.experts import load_moe
from engine.models.registry import register
from engine.models.transformer import Layer, Transformer, TransformerArgs
from engine.models.weights import Weights


@dataclass
class Qwen35Args(TransformerArgs):
    """Qwen3.5 hyper-parameters: the transformer's, the DeltaNet sizes, which layers are recurrent, the sections."""

    deltanet: DeltaNetDims | None = None
    recurrent: tuple[bool, ...] = ()
    rope_sections: tuple[int, int, int, int] = (0, 0, 0, 0)
    n_nextn: int = 0  # nextn_predict_layers: trailing MTP blocks, not run

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int, arch: str, moe: str, recurrent: bool = True) -> Qwen35Args:
        m = MetadataView(md, arch)
        nextn = m.optional_int("nextn_predict_layers") or 0
        if moe and f"{arch}.feed_forward_length" not in md:  # the experts' width is given on its own
            md = {**md, f"{arch}.feed_forward_length": m.int("expert_feed_forward_length")}
        args = cls.read(md, n_vocab, arch, rope_base=10_000_000.0, moe=moe)
        n_all = args.n_layers
        if not 0 <= nextn < n_all:
            raise ModelFormatError(f"{arch}.nextn_predict_layers", f"must be less than block_count {n_all}", nextn)
        args.n_layers, args.n_nextn = n_all - nextn, nextn
        args.rope_sections = _sections(m)
        args.recurrent = _pattern(m, n_all, args.n_layers) if recurrent else (False,) * args.n_layers
        if any(args.recurrent):
            args.deltanet = DeltaNetDims.read(m)
        return args  # type: ignore[return-value]


def _sections(m: MetadataView) -> tuple[int, int, int, int]:
    key = f"{m.arch}.rope.dimension_sections"
    got = m.md.get(key)
    if got is None:
        raise ModelFormatError(key, "required metadata key is missing")
    vals = [int(v) for v in np.asarray(got).reshape(-1)]
    if len(vals) > 4 or any(v < 0 for v in vals) or not any(vals):
        raise ModelFormatError(key, "must be up to four non-negative section sizes, not all zero", vals)
    return tuple(vals + [0] * (4 - len(vals)))  # type: ignore[return-value]


def _pattern(m: MetadataView, n_all: int, n_layers: int) -> tuple[bool, ...]:
    """llama.cpp's is_recr per layer: `attention.recurrent_layers` when the file has it, else the interval rule."""
    key = f"{m.arch}.attention.recurrent_layers"
    got = m.md.get(key)
    if got is not None:
        flags = [bool(v) for v in np.asarray(got).reshape(-1)]
        if len(flags) != n_all:
            raise ModelFormatError(key, f"has {len(flags)} entries for block_count {n_all}", len(flags))
        return tuple(flags[:n_layers])
    interval = m.int("full_attention_interval", 4)
    if not 1 <= interval <= n_all:
        raise ModelFormatError(f"{m.arch}.full_attention_interval", f"must be between 1 and block_count {n_all}", interval)
    return tuple((i + 1) % interval != 0 for i in range(n_layers))


def imrope_factors(rope_dim: int, sections: tuple[int, int, int, int]) -> np.ndarray | None:
    """Per rotated pair: 1, or infinity where IMROPE gives the pair the fourth (extra) position, 0 for text; None
    where every pair takes the token's position (plain NEOX)."""
    total = sum(sections)
    out = np.ones(rope_dim // 2, np.float32)
    for i in range(rope_dim // 2):
        sector = i % total
        covered = ((sector % 3 == 0 and sector < 3 * sections[0]) or (sector % 3 == 1 and sector < 3 * sections[1])
                   or (sector % 3 == 2 and sector < 3 * sections[2]))
        if not covered:
            out[i] = np.inf
    return None if np.all(out == 1) else out


@register("qwen35")
class Qwen35(Transformer):
    """Qwen3.5 as llama.cpp's qwen35 graph runs it (see the module docstring)."""

    Args = Qwen35Args
    rope_mode = "neox"
    qk_norm = True
    attn_output_gate = True
    ffn_norm_name = "post_attention_norm"
    shared_sigmoid = "sigmoid"  # qwen35moe's shared expert gate: ggml_sigmoid
    recurrent_mixers: ClassVar[bool] = True  # qwen3vl's text path: the same attention without DeltaNet layers

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> Qwen35Args:
        return Qwen35Args.from_metadata(md, n_vocab, cls.arch_name, cls.moe, cls.recurrent_mixers)

    def __init__(self, args: TransformerArgs, w: Weights, ops: Any):
        a: Qwen35Args = args  # type: ignore[assignment]
        if a.rope_dim > a.head_dim or sum(a.rope_sections) * 2 > a.rope_dim:
            raise ModelFormatError(f"{a.arch}.rope.dimension_sections", f"sum to more than the {a.rope_dim // 2} rotated "
                                   "pairs", list(a.rope_sections))
        self.mixers = [i for i, r in enumerate(a.recurrent) if r]
        super().__init__(args, w, ops)

    def load_layer(self, w: Weights, i: int, a: TransformerArgs) -> Layer | MixerLayer:  # type: ignore[override]
        args: Qwen35Args = a  # type: ignore[assignment]
        if not args.recurrent[i]:
            return super().load_layer(w, i, a)
        b = f"blk.{i}."
        attn_norm = w.vector(b + "attn_norm.weight", a.dim)
        assert args.deltanet is not None
        mixer = load_deltanet(w, i, a.dim, args.deltanet, a.norm_eps)
        ffn_norm = w.vector(b + self.ffn_norm_name + ".weight", a.dim)
        ffn = load_moe(self, w, i, a) if a.n_expert else self.load_ffn(w, b, a)
        return MixerLayer(attn_norm, mixer, ffn_norm, ffn)

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> np.ndarray | None:
        return imrope_factors(a.rope_dim, a.rope_sections)  # type: ignore[attr-defined]

    def new_cache(self, n_ctx: int | None = None, cache_type: str | None = None) -> HybridCache:
        """KV rows for the attention layers, a constant-size state for each DeltaNet layer (engine.hybrid_cache)."""
        a: Qwen35Args = self.args  # type: ignore[assignment]
        shape = a.deltanet.recurrent_shape() if a.deltanet is not None else None
        if shape is None:  # no recurrent layer: a hybrid cache with none
            from engine.hybrid_cache import RecurrentShape  # noqa: PLC0415

            shape = RecurrentShape(1, 1, 1, 1)
        return HybridCache(a.n_layers, a.n_kv_heads, a.head_dim, n_ctx or a.n_ctx, cache_type or self.ops.cache_type,
                           frozenset(self.mixers), shape)


@register("qwen35moe")
class Qwen35MoE(Qwen35):
    """Qwen3.5 / Qwen3.6 MoE (Qwen3.6-35B-A3B): the same blocks with build_moe_ffn (softmax router, top k
    renormalised) plus the shared expert times sigmoid(ffn_gate_inp_shexp h)."""

    moe = "required"
    moe_normalize = True
    shared_expert = True

