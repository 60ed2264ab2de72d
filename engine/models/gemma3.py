"""The gemma3 architecture: scaled embeddings, Q/K norms, GELU-gated FFN, post-norms, local/global attention.

As llama.cpp's llama_model_gemma3 (src/models/gemma3.cpp, iswa): the embeddings are scaled by sqrtf(n_embd); each
head of q and k is RMS-normed before NEOX RoPE; the query is scaled after RoPE by f_attention_scale
(1/sqrt(key_length)) and attends with kq scale 1; post_attention_norm and post_ffw_norm follow the attention and the
GELU-gated FFN. With `attention.sliding_window` five layers in six slide (set_swa_pattern(6)) and rotate with their
own base (rope_freq_base_train_swa, 10000 unless the file says). Norm weights in the GGUF already hold Gemma's +1.
The graph is engine.models.transformer's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ModelFormatError
from engine.models.args import MetadataView
from engine.models.registry import register
from engine.models.transformer import Transformer, TransformerArgs
from engine.models.weights import Weights

SWA_PATTERN = 6  # every 6th layer is global, the other five use the sliding window (set_swa_pattern(6))
ROPE_BASE_LOCAL = 10000.0  # llama.cpp's rope_freq_base_train_swa for gemma3 when the file does not say


@dataclass
class Gemma3Args(TransformerArgs):
    """Gemma 3 hyper-parameters from `gemma3.*` metadata."""

    @classmethod
    def from_metadata(cls, md: dict[str, Any], n_vocab: int, arch: str = "gemma3") -> Gemma3Args:
        m = MetadataView(md, arch)
        window = m.optional_int("attention.sliding_window")
        args = cls.read(md, n_vocab, arch, rope_base=1_000_000.0, sliding_window=window if window and window > 0 else None,
                        swa_pattern=SWA_PATTERN)
        args.rope_base_swa = m.float("rope.freq_base_swa", ROPE_BASE_LOCAL)
        if args.rope_freq_scale != 1.0 or args.rope_scaling_type == "yarn":
            # llama.cpp scales the global layers' positions only (rope_freq_scale_train_swa = 1): not done here
            raise ModelFormatError(f"{arch}.rope.scaling.factor", "is not applied by GGUF Lens's gemma3 graph yet "
                                   "(it scales the global layers only); the logits would be wrong",
                                   md.get(f"{arch}.rope.scaling.factor"))
        return args  # type: ignore[return-value]


@register("gemma3")
class Gemma3(Transformer):
    """Gemma 3 as llama.cpp's build_gemma3 (iswa) runs it."""

    Args = Gemma3Args
    rope_mode = "neox"
    glu = "geglu"
    query_scaled = True
    qk_norm = True
    post_norms = True
    embed_scale = True
    swa_pattern = SWA_PATTERN
    rope_base_swa = ROPE_BASE_LOCAL

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> Gemma3Args:
        return Gemma3Args.from_metadata(md, n_vocab, cls.arch_name)

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> None:
        return None  # gemma3.cpp passes no freq_factors to ggml_rope_ext
