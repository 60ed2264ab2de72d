"""The qwen3vl and qwen3vlmoe architectures (Qwen3-VL's language model, text only): Qwen 3 with multi-section RoPE.

As llama.cpp's llama_model_qwen3vl / _qwen3vlmoe (src/models/qwen3vl.cpp, qwen3vlmoe.cpp), which are qwen3's and
qwen3moe's graphs (engine.models.qwen3, qwen3moe: q/k RMSNorm per head, no biases, ffn_norm, SwiGLU or the softmax
router with its top expert_used_count renormalised, no shared expert) but for:

- RoPE is ggml_rope_multi in IMROPE mode with `rope.dimension_sections` (required; Qwen3-VL's [24, 20, 20]) over the
  whole head (llama.cpp asserts rope.dimension_count == key_length). For text the time, height and width positions
  are all the token's and the fourth is 0, so the pairs whose sector falls outside the three sections (61 and 62 of
  64 with [24, 20, 20]) are not rotated: engine.models.rope.imrope_factors gives them an infinite factor;
- `n_deepstack_layers`: the vision encoder's features are added to the outputs of the first n blocks. The input
  row is n_embd (1 + n) wide, and for tokens build_inp_embd pads the embedding with zeros, so for text each of
  those blocks adds exact zeros: nothing to run here (the count is read and checked only).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError
from engine.models.args import MetadataView
from engine.models.qwen3 import Qwen3
from engine.models.rope import imrope_factors, read_sections
from engine.models.registry import register
from engine.models.transformer import Layer, TransformerArgs
from engine.models.weights import Weights

F32 = npt.NDArray[np.float32]


@dataclass
class Qwen3VLArgs(TransformerArgs):
    """Qwen 3's hyper-parameters plus IMROPE's sections and the deepstack count."""

    rope_sections: tuple[int, int, int, int] = (0, 0, 0, 0)
    n_deepstack: int = 0  # n_deepstack_layers: blocks that add vision features (zeros for text)


@register("qwen3vl")
class Qwen3VL(Qwen3):
    """Qwen3-VL's dense language model as llama.cpp's qwen3vl graph runs it on text (see the module docstring)."""

    Args = Qwen3VLArgs

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> Qwen3VLArgs:
        args = cls.Args.read(md, n_vocab, cls.arch_name, cls.default_rope_base, moe=cls.moe)
        assert isinstance(args, Qwen3VLArgs)
        m = MetadataView(md, cls.arch_name)
        if args.rope_dim != args.head_dim:  # qwen3vl.cpp: GGML_ASSERT(n_embd_head == n_rot)
            raise ModelFormatError(f"{m.arch}.rope.dimension_count", f"must be the head size {args.head_dim} (the "
                                   "multi-section RoPE turns whole heads)", args.rope_dim)
        args.rope_sections = read_sections(m)
        if sum(args.rope_sections) * 2 > args.rope_dim:
            raise ModelFormatError(f"{m.arch}.rope.dimension_sections", f"sum to more than the {args.rope_dim // 2} "
                                   "rotated pairs", list(args.rope_sections))
        args.n_deepstack = m.int("n_deepstack_layers", 0)
        if args.n_deepstack < 0:
            raise ModelFormatError(f"{m.arch}.n_deepstack_layers", "must not be negative", args.n_deepstack)
        return args

    def load_layer(self, w: Weights, i: int, a: TransformerArgs) -> Layer:
        if a.n_expert and not w.has(gate := f"blk.{i}.ffn_gate_exps.weight"):  # load_moe would run llama's gate-less
            raise ModelFormatError(gate, "required tensor is missing from the file")  # experts; qwen3vlmoe.cpp won't
        return super().load_layer(w, i, a)

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> F32 | None:
        return imrope_factors(a.rope_dim, a.rope_sections)  # type: ignore[attr-defined]


@register("qwen3vlmoe")
class Qwen3VLMoE(Qwen3VL):
    """Qwen3-VL-30B-A3B / 235B-A22B's language model: qwen3vl's attention with qwen3moe's experts."""

    moe = "required"
    moe_normalize = True
