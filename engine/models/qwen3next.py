"""The qwen3next architecture (Qwen3-Next-80B-A3B): gated DeltaNet layers and gated attention, every FFN experts.

As llama.cpp's llama_model_qwen3next (src/models/qwen3next.cpp), which is qwen35moe's graph (engine.models.qwen35)
but for these differences:

- RoPE: plain NEOX through ggml_rope_ext on the first rope.dimension_count dims of each head (partial: a quarter of
  them), no `rope.dimension_sections`, no frequency factors; llama.cpp's default freq_base (10000) when the file
  has none;
- the DeltaNet layer's input products come in one of two layouts (both loaded by llama.cpp, attn_qkv preferred):
  * `attn_qkv` (q | k | v, conv_dim wide) and `attn_gate` (z), which convert_hf_to_gguf.py writes now, or
  * the legacy fused `ssm_in` (2 key_dim + 2 value_dim wide, earlier conversions): per key head g, its q (state),
    its k (state), then the v and z of its value_heads / key_heads value heads; llama.cpp's build_qkvz concatenates
    the q's, the k's and the v's into the convolution's q | k | v and makes z contiguous;
  and beta and alpha come from one product `ssm_ba` (2 value_heads wide): per key head g, the betas of its value
  heads, then their alphas (not qwen35's ssm_beta / ssm_alpha);
- value head h reads key head h // (value_heads / key_heads): llama.cpp repeats each key head's q and k in place
  (ggml_repeat_4d on a [S, 1, n_k] view: k0 k0 k1 k1), since Qwen3-Next's converter keeps the value heads grouped by
  key head, where Qwen3.5's reorders them for ggml's tiling broadcast (h % n_k);
- the model must have experts (llama.cpp refuses expert_count 0); each FFN is build_moe_ffn (softmax router over all
  experts, the top expert_used_count renormalised, SwiGLU experts expert_feed_forward_length wide, else
  feed_forward_length / expert_used_count) plus the shared expert (expert_shared_feed_forward_length wide, else
  feed_forward_length) times ggml_sigmoid(ffn_gate_inp_shexp h), as qwen35moe.

Everything else is qwen35moe's: the layer pattern (`attention.recurrent_layers`, else every
`full_attention_interval`-th layer, default 4, attends), attn_q as each head's query then its output gate, q/k
RMSNorm, kq scale 1/sqrt(key_length), sigmoid(gate) times the attention's output, `post_attention_norm` as the FFN's
input norm, the DeltaNet conv / L2 norms / delta rule / gated norm (ssm_norm without the +1 the converter folds into
every other norm), `nextn_predict_layers` trailing MTP blocks loaded by llama.cpp and not run (skipped here).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError
from engine.models.deltanet import DeltaNetMixer, load_deltanet
from engine.models.hybrid import HybridArgs
from engine.models.qwen35 import Qwen35MoE
from engine.models.registry import register
from engine.models.transformer import TransformerArgs
from engine.models.weights import Weights
from engine.tensor import Linear

F32 = npt.NDArray[np.float32]


class Qwen3NextMixer(DeltaNetMixer):
    """A DeltaNet layer in Qwen3-Next's layouts: `parts` is [attn_qkv, attn_gate, ssm_ba] or [ssm_in, ssm_ba]."""

    key_map = 1  # value head h reads key head h // (value_heads / key_heads)

    def split(self, parts: list[F32]) -> tuple[F32, F32, F32, F32]:
        """qkv, z, beta's and alpha's inputs as qwen3next.cpp's build_qkvz and its ssm_ba views make them: copies of
        the products' values, so the numbers are the products'."""
        d, t = self.dims, parts[0].shape[0]
        r, s = d.v_heads // d.k_heads, d.state
        *front, ba = parts
        ba = ba.reshape(t, d.k_heads, 2 * r)  # per key head: its value heads' betas, then their alphas
        b = ba[:, :, :r].reshape(t, d.v_heads)
        alpha = ba[:, :, r:].reshape(t, d.v_heads)
        if len(front) == 2:  # attn_qkv, attn_gate
            qkv, z = front
            return qkv, z, b, alpha
        groups = front[0].reshape(t, d.k_heads, 2 * s + 2 * r * s)  # ssm_in, per key head: q (S) k (S) v (r S) z (r S)
        q, k = groups[:, :, :s].reshape(t, d.key_dim), groups[:, :, s : 2 * s].reshape(t, d.key_dim)
        v = groups[:, :, 2 * s : 2 * s + r * s].reshape(t, d.value_dim)
        z = groups[:, :, 2 * s + r * s :].copy().reshape(t, d.value_dim)
        return np.concatenate([q, k, v], axis=1), z, b, alpha

    def key_heads(self, x: F32) -> F32:
        """(T, k_heads, S) -> (T, v_heads, S): each key head repeated in place for its value heads (h // r)."""
        return np.repeat(x, self.dims.v_heads // self.dims.k_heads, axis=1)


@register("qwen3next")
class Qwen3Next(Qwen35MoE):
    """Qwen3-Next as llama.cpp's qwen3next graph runs it (see the module docstring)."""

    rope_mode = "neox"

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> HybridArgs:
        return HybridArgs.from_metadata(md, n_vocab, cls.arch_name, cls.moe, imrope=False, rope_base=10000.0)

    def load_mixer(self, w: Weights, i: int, a: HybridArgs) -> DeltaNetMixer:
        """Block i's DeltaNet layer: attn_qkv + attn_gate, else the legacy ssm_in, then ssm_ba (llama.cpp's order)."""
        d, b = a.deltanet, f"blk.{i}."
        assert d is not None
        parts: list[Linear]
        if w.has(b + "attn_qkv.weight"):  # build_qkvz takes the attn_qkv path whenever the file has it
            parts = [w.linear(b + "attn_qkv.weight", a.dim, d.conv_dim),
                     w.linear(b + "attn_gate.weight", a.dim, d.value_dim)]
        elif w.has(b + "ssm_in.weight"):
            parts = [w.linear(b + "ssm_in.weight", a.dim, 2 * d.key_dim + 2 * d.value_dim)]
        else:
            raise ModelFormatError(b + "attn_qkv.weight", f"required tensor is missing from the file (and there is no "
                                   f"legacy {b}ssm_in.weight either)")
        parts.append(w.linear(b + "ssm_ba.weight", a.dim, 2 * d.v_heads))
        return load_deltanet(w, i, a.dim, d, a.norm_eps, parts, Qwen3NextMixer)

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> None:
        return None  # qwen3next.cpp's ggml_rope_ext gets no freq_factors
