"""The Qwen3.5-family test models for tools/make_arch_models.py: the DeltaNet hybrids (qwen35, qwen35moe, qwen3next)
and Qwen3-VL's language model (qwen3vl, qwen3vlmoe: attention only, with IMROPE).

No Qwen3.5 / Qwen3.6 file can be fetched here, so each is written in the exact tensor layout llama.cpp's
llama_model_qwen35 / _qwen35moe loads (src/models/qwen35.cpp, qwen35moe.cpp), small and from a fixed seed: four
blocks, the first three DeltaNet layers and the fourth gated full attention (full_attention_interval 4), two key
heads read by four value heads (h % 2), a 4-tap convolution, partial multi-section RoPE. `qwen35moe` also has
routed experts with a sigmoid-gated shared expert, and RoPE sections that leave one pair unrotated (IMROPE's fourth
section, position 0 for text). make_arch_models.py names them like any other architecture:

    /tmp/llvenv/bin/python tools/make_arch_models.py qwen35 qwen35moe qwen3next qwen3next_legacy qwen3vl qwen3vlmoe

The decay gates are spread (ssm_a from -1 to -16, the alpha products moderate) so that some heads forget within a
few tokens and others keep most of the prompt, and beta is anywhere in (0, 1).

`qwen3next` is in the layout convert_hf_to_gguf.py writes now (attn_qkv, attn_gate and ssm_ba, the value heads
grouped by key head, the layer pattern as `attention.recurrent_layers`) with one trailing MTP block (nextn tensors
and all, which llama.cpp loads and does not run); `qwen3next_legacy` is the same weights in the earlier layout
(the fused ssm_in, per key head q | k | v | z, and the interval rule), no MTP block. Their NEOX RoPE turns a
quarter of each head. `qwen3vl` and `qwen3vlmoe` have Qwen3-VL's 128-wide heads and sections [24, 20, 20] (pairs
61 and 62 unrotated for text) and three deepstack layers (zeros for text).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.quant.types import GGMLType

U32 = np.uint32
Tensor = tuple[str, GGMLType, tuple[int, ...], np.ndarray]


@dataclass(frozen=True)
class HybridSpec:
    arch: str
    dim: int = 256
    hidden: int = 512
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 64
    rope_dim: int = 32
    rope_base: float = 10_000_000.0
    sections: tuple[int, int, int, int] = (6, 5, 5, 0)
    state: int = 64
    k_heads: int = 2
    v_heads: int = 4
    conv_kernel: int = 4
    interval: int = 4
    kind: str = "qwen35"  # qwen35 (and qwen35moe), qwen3next (its DeltaNet layout, NEOX RoPE), qwen3vl (attention only)
    layout: str = "qkv"  # qwen3next: "qkv" (attn_qkv, attn_gate, ssm_ba) or "ssm_in" (the legacy fused ssm_in, ssm_ba)
    pattern_array: bool = False  # attention.recurrent_layers instead of full_attention_interval
    nextn: int = 0  # trailing MTP blocks (nextn_predict_layers)
    deepstack: int = 0  # qwen3vl: n_deepstack_layers
    n_expert: int = 0
    n_used: int = 0
    expert_hidden: int = 0
    mixer_scale: float = 0.5  # ssm_out's share of OUT_SCALE (its input is RMS-normed per head: unit scale)
    router_std: float = 2.5
    fused_gate_up: bool = False  # ffn_gate_up_exps (gate rows then up rows) instead of ffn_gate_exps + ffn_up_exps


HYBRIDS: dict[str, HybridSpec] = {
    "qwen35": HybridSpec("qwen35"),
    "qwen35moe": HybridSpec("qwen35moe", hidden=256, sections=(6, 4, 4, 0), n_expert=8, n_used=2, expert_hidden=128),
    # the same weights as qwen35moe, its experts' gate and up in one ffn_gate_up_exps (convert_hf_to_gguf.py
    # --fuse-gate-up-exps)
    "qwen35moe_fused": HybridSpec("qwen35moe", hidden=256, sections=(6, 4, 4, 0), n_expert=8, n_used=2,
                                  expert_hidden=128, fused_gate_up=True),
    "qwen3next": HybridSpec("qwen3next", hidden=256, rope_dim=16, sections=(0, 0, 0, 0), kind="qwen3next",
                            pattern_array=True, nextn=1, n_expert=8, n_used=2, expert_hidden=128),
    "qwen3next_legacy": HybridSpec("qwen3next", hidden=256, rope_dim=16, sections=(0, 0, 0, 0), kind="qwen3next",
                                   layout="ssm_in", n_expert=8, n_used=2, expert_hidden=128),
    # qwen3vl: a small RoPE base, so that even the slowest pairs turn by radians over the 200 tokens: leaving pairs 61
    # and 62 unrotated (or not) changes the logits far past rounding
    "qwen3vl": HybridSpec("qwen3vl", head_dim=128, rope_dim=128, rope_base=100.0, sections=(24, 20, 20, 0),
                          kind="qwen3vl", deepstack=3),
    "qwen3vlmoe": HybridSpec("qwen3vlmoe", hidden=256, head_dim=128, rope_dim=128, rope_base=100.0,
                             sections=(24, 20, 20, 0), kind="qwen3vl", deepstack=3, n_expert=8, n_used=2,
                             expert_hidden=128),
}


def build_hybrid(name: str, rng: np.random.Generator, base_md: dict[str, Any], head: list[Tensor],
                 out_scale: float) -> tuple[dict[str, Any], list[Tensor]]:
    """Metadata and F32 tensors of test model `name`; base_md and head hold the vocabulary, the token embedding, the
    output norm and head that make_arch_models.build writes for every architecture."""
    s = HYBRIDS[name]
    a, f32 = s.arch, GGMLType.F32
    md = dict(base_md)
    recurrent = [s.kind != "qwen3vl" and (i + 1) % s.interval != 0 for i in range(s.n_layers)]
    md.update({  # in this order: the qwen35 files' bytes (and so their fixtures' sha256) depend on it
        f"{a}.block_count": U32(s.n_layers + s.nextn), f"{a}.context_length": U32(4096),
        f"{a}.embedding_length": U32(s.dim), f"{a}.feed_forward_length": U32(s.hidden),
        f"{a}.attention.head_count": U32(s.n_heads), f"{a}.attention.head_count_kv": U32(s.n_kv_heads),
        f"{a}.attention.key_length": U32(s.head_dim), f"{a}.attention.value_length": U32(s.head_dim),
        f"{a}.rope.freq_base": s.rope_base, f"{a}.rope.dimension_count": U32(s.rope_dim),
    })
    if s.kind != "qwen3next":  # qwen3next's RoPE is plain NEOX
        md[f"{a}.rope.dimension_sections"] = np.array(s.sections, np.int32)
    md[f"{a}.attention.layer_norm_rms_epsilon"] = 1e-6
    if s.kind == "qwen3vl":
        md[f"{a}.n_deepstack_layers"] = U32(s.deepstack)
    else:
        md.update({f"{a}.ssm.conv_kernel": U32(s.conv_kernel), f"{a}.ssm.inner_size": U32(s.state * s.v_heads),
                   f"{a}.ssm.state_size": U32(s.state), f"{a}.ssm.time_step_rank": U32(s.v_heads),
                   f"{a}.ssm.group_count": U32(s.k_heads), f"{a}.full_attention_interval": U32(s.interval)})
        if s.pattern_array:
            md[f"{a}.attention.recurrent_layers"] = np.array(recurrent + [False] * s.nextn, np.bool_)
    if s.nextn:
        md[f"{a}.nextn_predict_layers"] = U32(s.nextn)
    if s.n_expert:
        md.update({f"{a}.expert_count": U32(s.n_expert), f"{a}.expert_used_count": U32(s.n_used),
                   f"{a}.expert_feed_forward_length": U32(s.expert_hidden)})
        if s.kind != "qwen3vl":
            md[f"{a}.expert_shared_feed_forward_length"] = U32(s.hidden)

    def mat(n_in: int, n_out: int, std: float | None = None) -> np.ndarray:
        return rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(std or 1 / math.sqrt(n_in))

    def norm(n: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    ts = list(head)
    key_dim, value_dim = s.state * s.k_heads, s.state * s.v_heads
    conv_dim = 2 * key_dim + value_dim
    qd, kvd = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    q_rows = qd if s.kind == "qwen3vl" else 2 * qd  # the hybrids' attn_q: each head's query, then its output gate
    for i in range(s.n_layers + s.nextn):
        b = f"blk.{i}."
        ts.append((b + "attn_norm.weight", f32, (s.dim,), norm(s.dim)))
        if i < s.n_layers and recurrent[i]:
            mixer = [(b + "attn_qkv.weight", f32, (s.dim, conv_dim), mat(s.dim, conv_dim)),
                     (b + "attn_gate.weight", f32, (s.dim, value_dim), mat(s.dim, value_dim)),
                     (b + "ssm_conv1d.weight", f32, (s.conv_kernel, conv_dim),
                      (0.5 * rng.standard_normal((conv_dim, s.conv_kernel))).astype(np.float32)),
                     (b + "ssm_dt.bias", f32, (s.v_heads,), rng.uniform(-2.0, 1.0, s.v_heads).astype(np.float32)),
                     (b + "ssm_a", f32, (s.v_heads,),
                      -np.exp(np.linspace(0.0, math.log(16.0), s.v_heads)).astype(np.float32)),
                     (b + "ssm_beta.weight", f32, (s.dim, s.v_heads), mat(s.dim, s.v_heads)),
                     (b + "ssm_alpha.weight", f32, (s.dim, s.v_heads), mat(s.dim, s.v_heads, 0.5 / math.sqrt(s.dim))),
                     (b + "ssm_norm.weight", f32, (s.state,), norm(s.state)),
                     (b + "ssm_out.weight", f32, (value_dim, s.dim),
                      mat(value_dim, s.dim, s.mixer_scale * out_scale / math.sqrt(value_dim)))]
            ts += _qwen3next_layout(mixer, s) if s.kind == "qwen3next" else mixer
        else:
            ts += [(b + "attn_q.weight", f32, (s.dim, q_rows), mat(s.dim, q_rows)),
                   (b + "attn_k.weight", f32, (s.dim, kvd), mat(s.dim, kvd)),
                   (b + "attn_v.weight", f32, (s.dim, kvd), mat(s.dim, kvd)),
                   (b + "attn_q_norm.weight", f32, (s.head_dim,), norm(s.head_dim)),
                   (b + "attn_k_norm.weight", f32, (s.head_dim,), norm(s.head_dim)),
                   (b + "attn_output.weight", f32, (qd, s.dim), mat(qd, s.dim, out_scale / math.sqrt(qd)))]
        ts.append((b + ("ffn_norm" if s.kind == "qwen3vl" else "post_attention_norm") + ".weight", f32, (s.dim,),
                   norm(s.dim)))
        if s.n_expert:
            ts += _experts(b, s, rng, out_scale)
        else:
            ts += [(b + "ffn_gate.weight", f32, (s.dim, s.hidden), mat(s.dim, s.hidden)),
                   (b + "ffn_up.weight", f32, (s.dim, s.hidden), mat(s.dim, s.hidden)),
                   (b + "ffn_down.weight", f32, (s.hidden, s.dim),
                    mat(s.hidden, s.dim, out_scale / math.sqrt(s.hidden)))]
        if i >= s.n_layers:  # an MTP block's own tensors (qwen3next.cpp's load_block_mtp)
            ts += [(b + "nextn.eh_proj.weight", f32, (2 * s.dim, s.dim), mat(2 * s.dim, s.dim)),
                   (b + "nextn.enorm.weight", f32, (s.dim,), norm(s.dim)),
                   (b + "nextn.hnorm.weight", f32, (s.dim,), norm(s.dim)),
                   (b + "nextn.shared_head_norm.weight", f32, (s.dim,), norm(s.dim))]
    return md, ts


def _qwen3next_layout(mixer: list[Tensor], s: HybridSpec) -> list[Tensor]:
    """A qwen35-layout DeltaNet layer's tensors in Qwen3-Next's: ssm_beta and ssm_alpha become ssm_ba (per key head
    its value heads' betas, then their alphas) and, for the legacy layout, attn_qkv and attn_gate become ssm_in (per
    key head its q, its k, its value heads' v, then their z: the original in_proj_qkvz). The value heads stay grouped
    by key head (Qwen3-Next's converter does not reorder them), so value head h reads key head h // (n_v / n_k)."""
    t = {name.split(".", 2)[2]: (name, qtype, shape, arr) for name, qtype, shape, arr in mixer}
    b = mixer[0][0].rsplit("attn_qkv", 1)[0]
    f32, r, n_k = GGMLType.F32, s.v_heads // s.k_heads, s.k_heads
    beta, alpha = t["ssm_beta.weight"][3], t["ssm_alpha.weight"][3]  # (v_heads, dim)
    ba = np.concatenate([beta.reshape(n_k, r, s.dim), alpha.reshape(n_k, r, s.dim)], axis=1)
    ba = ba.reshape(2 * s.v_heads, s.dim)
    out: list[Tensor] = []
    if s.layout == "ssm_in":
        qkv, z = t["attn_qkv.weight"][3], t["attn_gate.weight"][3]
        kd = s.state * n_k
        q, k, v = qkv[:kd], qkv[kd : 2 * kd], qkv[2 * kd :]
        per_head = [a.reshape(n_k, -1, s.dim) for a in (q, k, v, z)]  # (n_k, rows of that key head, dim)
        fused = np.concatenate(per_head, axis=1).reshape(-1, s.dim)
        out.append((b + "ssm_in.weight", f32, (s.dim, fused.shape[0]), fused))
    else:
        out += [t["attn_qkv.weight"], t["attn_gate.weight"]]
    out += [t[k] for k in ("ssm_conv1d.weight", "ssm_dt.bias", "ssm_a")]
    out.append((b + "ssm_ba.weight", f32, (s.dim, 2 * s.v_heads), ba))
    out += [t[k] for k in ("ssm_norm.weight", "ssm_out.weight")]
    return out


def _experts(b: str, s: HybridSpec, rng: np.random.Generator, out_scale: float) -> list[Tensor]:
    """Router, stacked experts (each down matrix with its own scale, so routing moves the output) and, but in
    qwen3vlmoe, the shared expert with its one-row gate."""
    f32, n, d, w, h = GGMLType.F32, s.n_expert, s.dim, s.expert_hidden, s.hidden
    gen = lambda *shape, std: rng.standard_normal(shape, dtype=np.float32) * np.float32(std)  # noqa: E731
    scale = np.geomspace(0.5, 2.0, n).astype(np.float32)[:, None, None]
    routed = [(b + "ffn_gate_inp.weight", f32, (d, n), gen(n, d, std=s.router_std / math.sqrt(d))),
              (b + "ffn_gate_exps.weight", f32, (d, w, n), gen(n, w, d, std=1 / math.sqrt(d))),
              (b + "ffn_up_exps.weight", f32, (d, w, n), gen(n, w, d, std=1 / math.sqrt(d))),
              (b + "ffn_down_exps.weight", f32, (w, d, n), gen(n, d, w, std=out_scale / math.sqrt(w)) * scale)]
    if s.fused_gate_up:  # each expert's gate rows, then its up rows (the same draws as the unfused file)
        gate_up = np.concatenate([routed[1][3], routed[2][3]], axis=1)
        routed = [routed[0], (b + "ffn_gate_up_exps.weight", f32, (d, 2 * w, n), gate_up), routed[3]]
    if s.kind == "qwen3vl":  # qwen3vlmoe: no shared expert
        return routed
    return routed + [(b + "ffn_gate_inp_shexp.weight", f32, (d,), gen(d, std=2 / math.sqrt(d))),
                     (b + "ffn_gate_shexp.weight", f32, (d, h), gen(h, d, std=1 / math.sqrt(d))),
                     (b + "ffn_up_shexp.weight", f32, (d, h), gen(h, d, std=1 / math.sqrt(d))),
                     (b + "ffn_down_shexp.weight", f32, (h, d), gen(d, h, std=out_scale / math.sqrt(h)))]
