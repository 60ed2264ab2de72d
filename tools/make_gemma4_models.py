"""The Gemma 4 test models (gemma4: E2B-like, dense; gemma4_moe: 26B-A4B-like, experts) for tools/make_arch_models.py.

No Gemma 4 file can be fetched here, so each is written in the layout llama.cpp's llama_model_gemma4 loads
(src/models/gemma4.cpp) with the metadata Gemma 4's converter writes (conversion/gemma.py, Gemma4Model), small and
from a fixed seed:

- `gemma4` as E2B / E4B: eight blocks, three sliding (64-wide heads, window 32, base 10000) then one global
  (128-wide heads, base 1e6, proportional RoPE: rope_freqs.weight rotates a quarter of the head), one KV head; the
  last four blocks share the K/V of blocks 2 (sliding) and 3 (global) and have FFNs twice as wide
  (feed_forward_length per layer); per-layer inputs (64 per layer); layer_output_scale on every block;
- `gemma4_moe` as 26B-A4B / 31B: six blocks, two sliding then one global, two KV heads on sliding layers and one on
  global ones (attention.head_count_kv per layer), no attn_v on the global layers (V is K), and in every block eight
  experts (two per token, ffn_gate_up_exps fused, ffn_down_exps.scale, the router's ffn_gate_inp.scale) beside the
  dense FFN, with Gemma 4's extra norms.

Both tie the head to token_embd and soft-cap the logits at 30, as Gemma 4 does. The post-block norms and the
per-layer inputs' output norm are scaled down (make_arch_models.OUT_SCALE) so the token embedding stays visible in
the residual stream. make_arch_models.py names them like any other architecture:

    /tmp/llvenv/bin/python tools/make_arch_models.py gemma4 gemma4_moe
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.quant.types import GGMLType

U32 = np.uint32
Tensor = tuple[str, GGMLType, tuple[int, ...], np.ndarray]
QUANTS = {"F16": 1, "Q8_0": 7, "Q4_K_M": 15}  # llama_ftype ids; and MXFP4_MOE (38) for the experts model


@dataclass(frozen=True)
class Gemma4Spec:
    dim: int = 256
    n_layers: int = 8
    n_heads: int = 4
    kv_swa: int = 1  # KV heads of the sliding layers
    kv_full: int = 1  # and of the global ones (a per-layer array where they differ)
    head_swa: int = 64  # attention.key_length_swa
    head_full: int = 128  # attention.key_length
    partial_full: float = 0.25  # the global layers' rotated fraction (proportional RoPE)
    period: int = 4  # layer i is global when i % period == period - 1
    window: int = 32
    hidden: int = 512
    double_wide: bool = False  # the KV-sharing layers' FFN twice as wide (use_double_wide_mlp)
    shared_kv: int = 0  # attention.shared_kv_layers
    per_layer: int = 0  # embedding_length_per_layer_input
    k_eq_v: bool = False  # the global layers have no attn_v (attention_k_eq_v)
    n_expert: int = 0
    n_used: int = 0
    expert_hidden: int = 0
    router_std: float = 2.5
    logit_std: float = 1.0  # the token embedding's spread (the tied head reads it): mean top-1 probability 0.4-0.6

    @property
    def arch(self) -> str:
        return "gemma4"

    def is_swa(self, i: int) -> bool:
        return i % self.period != self.period - 1

    def ffn_width(self, i: int) -> int:
        return 2 * self.hidden if self.double_wide and i >= self.n_layers - self.shared_kv else self.hidden

    def kv_heads(self, i: int) -> int:
        return self.kv_swa if self.is_swa(i) else self.kv_full


GEMMA4: dict[str, Gemma4Spec] = {
    "gemma4": Gemma4Spec(shared_kv=4, per_layer=64, double_wide=True, logit_std=1.3),
    "gemma4_moe": Gemma4Spec(n_layers=6, period=3, kv_swa=2, kv_full=1, hidden=256, k_eq_v=True, n_expert=8, n_used=2,
                             expert_hidden=128, logit_std=0.9),
}


def build_gemma4(name: str, rng: np.random.Generator, base_md: dict[str, Any], head: list[Tensor],
                 out_scale: float) -> tuple[dict[str, Any], list[Tensor]]:
    """Metadata and F32 tensors of Gemma 4 test model `name`; base_md and head hold the vocabulary, the token
    embedding and the output norm that make_arch_models.build writes for every architecture."""
    s = GEMMA4[name]
    a, f32, n = s.arch, GGMLType.F32, s.n_layers
    md = {k: v for k, v in base_md.items() if not k.startswith(f"{a}.")}
    md.update({
        f"{a}.block_count": U32(n), f"{a}.context_length": U32(4096), f"{a}.embedding_length": U32(s.dim),
        f"{a}.attention.head_count": U32(s.n_heads), f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.rope.freq_base": 1_000_000.0, f"{a}.rope.freq_base_swa": 10_000.0,
        f"{a}.attention.key_length": U32(s.head_full), f"{a}.attention.value_length": U32(s.head_full),
        f"{a}.attention.key_length_swa": U32(s.head_swa), f"{a}.attention.value_length_swa": U32(s.head_swa),
        f"{a}.final_logit_softcapping": 30.0, f"{a}.attention.sliding_window": U32(s.window),
        f"{a}.attention.shared_kv_layers": U32(s.shared_kv), f"{a}.embedding_length_per_layer_input": U32(s.per_layer),
        f"{a}.attention.sliding_window_pattern": [s.is_swa(i) for i in range(n)],
        f"{a}.rope.dimension_count": U32(s.head_full), f"{a}.rope.dimension_count_swa": U32(s.head_swa),
    })
    widths = [s.ffn_width(i) for i in range(n)]
    md[f"{a}.feed_forward_length"] = np.array(widths, np.int32) if len(set(widths)) > 1 else U32(s.hidden)
    kv = [s.kv_heads(i) for i in range(n)]
    md[f"{a}.attention.head_count_kv"] = np.array(kv, np.int32) if len(set(kv)) > 1 else U32(s.kv_swa)
    if s.n_expert:
        md.update({f"{a}.expert_count": U32(s.n_expert), f"{a}.expert_used_count": U32(s.n_used),
                   f"{a}.expert_feed_forward_length": U32(s.expert_hidden)})

    def mat(n_in: int, n_out: int, std: float | None = None) -> np.ndarray:
        return rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(std or 1 / math.sqrt(n_in))

    def norm(n_: int, scale: float = 1.0) -> np.ndarray:
        return (scale * (1 + 0.1 * rng.standard_normal(n_))).astype(np.float32)

    ts = list(head)
    rot = int(s.head_full * s.partial_full / 2)  # the converter's rope_freqs: 1 for rotated pairs, 1e30 for the rest
    ts.append(("rope_freqs.weight", f32, (s.head_full // 2,),
               np.array([1.0] * rot + [1e30] * (s.head_full // 2 - rot), np.float32)))
    d = s.dim
    if s.per_layer:
        wide = s.per_layer * n
        ts += [("per_layer_token_embd.weight", f32, (wide, 1024), mat(wide, 1024, 1 / math.sqrt(s.per_layer))),
               ("per_layer_model_proj.weight", f32, (d, wide), mat(d, wide)),
               ("per_layer_proj_norm.weight", f32, (s.per_layer,), norm(s.per_layer))]
    for i in range(n):
        b = f"blk.{i}."
        hd, hkv = (s.head_swa, s.kv_heads(i)) if s.is_swa(i) else (s.head_full, s.kv_heads(i))
        qd, kvd = s.n_heads * hd, hkv * hd
        ts.append((b + "attn_norm.weight", f32, (d,), norm(d)))
        ts.append((b + "attn_q.weight", f32, (d, qd), mat(d, qd)))
        ts.append((b + "attn_k.weight", f32, (d, kvd), mat(d, kvd)))  # a KV-sharing layer's too: loaded, unused
        if not (s.k_eq_v and not s.is_swa(i)):
            ts.append((b + "attn_v.weight", f32, (d, kvd), mat(d, kvd)))
        ts.append((b + "attn_output.weight", f32, (qd, d), mat(qd, d)))
        ts.append((b + "attn_q_norm.weight", f32, (hd,), norm(hd)))
        ts.append((b + "attn_k_norm.weight", f32, (hd,), norm(hd)))
        ts.append((b + "post_attention_norm.weight", f32, (d,), norm(d, out_scale)))
        ts.append((b + "layer_output_scale.weight", f32, (1,), rng.uniform(0.7, 1.0, 1).astype(np.float32)))
        w = s.ffn_width(i)
        ts += [(b + "ffn_norm.weight", f32, (d,), norm(d)),
               (b + "ffn_gate.weight", f32, (d, w), mat(d, w)),
               (b + "ffn_up.weight", f32, (d, w), mat(d, w)),
               (b + "ffn_down.weight", f32, (w, d), mat(w, d)),
               (b + "post_ffw_norm.weight", f32, (d,), norm(d, out_scale))]
        if s.n_expert:
            ts += _experts(b, s, rng)
        if s.per_layer:
            ts += [(b + "inp_gate.weight", f32, (d, s.per_layer), mat(d, s.per_layer)),
                   (b + "proj.weight", f32, (s.per_layer, d), mat(s.per_layer, d)),
                   (b + "post_norm.weight", f32, (d,), norm(d, out_scale))]
    return md, ts


def _experts(b: str, s: Gemma4Spec, rng: np.random.Generator) -> list[Tensor]:
    """The router (with its input scale: sqrt(n_embd) undoes the router input's 1/sqrt(n_embd)), the experts' fused
    gate|up and down weights, each expert's down scale (0.5x to 2x, so routing moves the output), and the norms of
    both branches."""
    f32, n, d, w = GGMLType.F32, s.n_expert, s.dim, s.expert_hidden
    gen = lambda *shape, std: rng.standard_normal(shape, dtype=np.float32) * np.float32(std)  # noqa: E731
    norm = lambda: (1 + 0.1 * rng.standard_normal(d)).astype(np.float32)  # noqa: E731
    return [(b + "ffn_gate_inp.weight", f32, (d, n), gen(n, d, std=s.router_std / math.sqrt(d))),
            (b + "ffn_gate_inp.scale", f32, (d,), (math.sqrt(d) * norm()).astype(np.float32)),
            (b + "pre_ffw_norm_2.weight", f32, (d,), norm()),
            (b + "post_ffw_norm_1.weight", f32, (d,), norm()),
            (b + "post_ffw_norm_2.weight", f32, (d,), norm()),
            (b + "ffn_gate_up_exps.weight", f32, (d, 2 * w, n), gen(n, 2 * w, d, std=1 / math.sqrt(d))),
            (b + "ffn_down_exps.weight", f32, (w, d, n), gen(n, d, w, std=1 / math.sqrt(w))),
            (b + "ffn_down_exps.scale", f32, (n,), np.geomspace(0.5, 2.0, n).astype(np.float32))]
