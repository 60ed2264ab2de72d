"""The pre-norm decoder most GGUF architectures are variations of, as one runner with per-architecture switches.

llama.cpp writes one graph per architecture (src/models/llama.cpp, qwen2.cpp, qwen3.cpp, phi3.cpp, gemma2.cpp),
and they differ in a handful of places: biases on q/k/v, per-head q/k RMSNorm, a fused attn_qkv or gate+up
matrix, where the query scale goes, post-attention and post-FFN norms, the GLU, soft-capping, sliding windows
on some layers, RoPE's pair layout and scaling. `Transformer.run_layers` is that graph with each of those as a
switch, op for op in the order llama.cpp adds the ops; each architecture file sets its switches and reads its
metadata. A block is two seams, `attention` and the layer's FFN (engine.models.ffn: dense, and room for experts),
between the norms; the recorder is called from here, so every architecture records the same things. Where layers
differ in attention shape or read another layer's K/V (Gemma 4), the Layer says so (head_dim, n_kv_heads, kv_source);
`rope_tables` / `rope_key` give each layer its RoPE, and `finish_block` what a block adds after its FFN.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.errors import ModelFormatError
from engine.models.args import BaseArgs, LayerAttentionSpec, MetadataView
from engine.models.decoder import DecoderModel, Numerics
from engine.models.experts import MoEFFN, load_moe
from engine.models.ffn import DenseFFN
from engine.models.rope import NO_SCALING, RopeScaling, rope_freqs, yarn_attn_factor
from engine.models.weights import Weights
from engine.ops.reference import soft_cap
from engine.tensor import FusedLinear, Linear

if TYPE_CHECKING:  # the recorder is passed in; models never build one
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # llama-model.cpp's LLAMA_ROPE_SCALING_TYPES
# optional tensors llama.cpp's llama / phi3 / qwen2 graphs add when a file has them, which this graph does not
# (and long/short RoPE factors outside Phi-3: llama's longrope variant picks them by context, not done here)
NOT_APPLIED = re.compile(r"^(blk\.\d+\.(attn_output|ffn_gate|ffn_up|ffn_down|attn_norm|ffn_norm)\.bias|output(_norm)?\.bias"
                            r"|rope_factors_(long|short)\.weight"
                            # experts this architecture or file does not run: a shared expert outside qwen2moe
                            # (Granite), expert biases and selection biases, experts in a file without expert_count
                            r"|blk\.\d+\.(ffn_(gate|up|down)_shexp|ffn_gate_inp_shexp|ffn_(gate|up|down|gate_up)_exps"
                            r"|ffn_gate_inp|exp_probs_b)\.(weight|bias))$")


@dataclass
class TransformerArgs(BaseArgs):
    """BaseArgs plus what the variations read: RoPE scaling, sliding windows, soft-capping, the query scale."""

    rope_scaling_type: str = "linear"  # rope.scaling.type (llama.cpp's default when the key is absent)
    rope_freq_scale: float = 1.0  # 1 / rope.scaling.factor (or rope.scale_linear)
    rope_attn_factor: float = 1.0  # rope.scaling.attn_factor
    n_ctx_orig: int = 0  # rope.scaling.original_context_length, else context_length
    sliding_window: int | None = None
    swa_pattern: int = 0  # layer i slides when i % pattern < pattern - 1 (llama_hparams::set_swa_pattern)
    rope_base_swa: float = 0.0  # rope.freq_base_swa, else rope.freq_base
    attn_softcap: float | None = None  # attn_logit_softcapping
    final_softcap: float | None = None  # final_logit_softcapping
    attn_scale: float = 0.0  # the attention scale; 1/sqrt(head_dim) unless the architecture says otherwise
    n_expert: int = 0  # Mixture-of-Experts: experts per layer (0: a dense FFN), chosen per token, one expert's
    n_expert_used: int = 0  # FFN width, the shared expert's (Qwen2-MoE; 0: none)
    expert_hidden: int = 0
    shared_hidden: int = 0

    def is_swa(self, layer: int) -> bool:
        p = self.swa_pattern
        return self.sliding_window is not None and p > 0 and layer % p < p - 1

    @classmethod
    def read(cls, md: dict[str, Any], n_vocab: int, arch: str, rope_base: float, moe: str = "", **extra: Any,
             ) -> TransformerArgs:
        """The common fields and RoPE scaling from `<arch>.*` metadata (llama_model::load_hparams); `moe`:
        'required' (an experts architecture), 'optional' (llama: experts when the file has them) or ''."""
        m = MetadataView(md, arch)
        common = cls.common_fields(m, n_vocab, rope_base, experts=bool(moe))
        if moe:  # llama's experts are feed_forward_length wide; qwen2moe / qwen3moe's default to n_ff / used
            common.update(m.experts(common["hidden_dim"], moe == "required",
                                    common["hidden_dim"] if moe == "optional" else None))
        kind = m.string("rope.scaling.type", "linear")
        if kind not in ROPE_SCALING_TYPES:
            raise ModelFormatError(f"{arch}.rope.scaling.type", f"is not supported (supported: {', '.join(ROPE_SCALING_TYPES)})", kind)
        factor = m.float("rope.scaling.factor", m.float("rope.scale_linear", 0.0))
        if factor < 0:
            raise ModelFormatError(f"{arch}.rope.scaling.factor", "must not be negative", factor)
        args = cls(**common, rope_scaling_type=kind,
                   rope_freq_scale=1.0 if factor == 0.0 or kind == "none" else float(np.float32(1.0) / np.float32(factor)),
                   rope_attn_factor=m.float("rope.scaling.attn_factor", 1.0),
                   n_ctx_orig=m.int("rope.scaling.original_context_length", common["n_ctx"]), **extra)
        args.rope_base_swa = m.float("rope.freq_base_swa", args.rope_base)
        args.check()
        value_length = m.optional_int("attention.value_length")  # after check(): key_length is known to be sane
        if value_length is not None and value_length != args.head_dim:
            raise ModelFormatError(f"{arch}.attention.value_length", f"differs from key_length {args.head_dim}: "
                                   "not supported by GGUF Lens", value_length)
        if args.attn_scale == 0.0:
            args.attn_scale = 1.0 / math.sqrt(args.head_dim)
        return args

    def layer_specs(self) -> list[LayerAttentionSpec]:
        """Each layer's attention: the scale, its sliding window and RoPE base (the SWA layers' own), the soft-cap."""
        group = self.n_heads // self.n_kv_heads
        return [LayerAttentionSpec(self.attn_scale, self.sliding_window if self.is_swa(i) else None, group,
                                   self.rope_base_swa if self.is_swa(i) else self.rope_base, self.attn_softcap)
                for i in range(self.n_layers)]

    def scaling(self, factors: F32 | None) -> RopeScaling:
        """ggml_rope_ext's scaling arguments as llama_context derives them from these hyper-parameters."""
        yarn = self.rope_scaling_type == "yarn"
        if not yarn and factors is None and self.rope_freq_scale == 1.0 and self.rope_attn_factor == 1.0:
            return NO_SCALING
        attn = yarn_attn_factor(self.rope_freq_scale, self.rope_attn_factor) if yarn else self.rope_attn_factor
        return RopeScaling(self.rope_scaling_type, self.rope_freq_scale, factors, 1.0 if yarn else 0.0, attn,
                           n_ctx_orig=self.n_ctx_orig)


@dataclass
class Layer:
    """One block's weights; the optional ones are None where the architecture has none."""

    attn_norm: F32
    qkv_parts: list[Linear]  # [wq, wk, wv], or [wqkv] (fused, split by q_dim / kv_dim); [wq] reading another
    wo: Linear  # layer's K/V (kv_source); [wq, wk] where V is K (v_from_k)
    ffn_norm: F32 | None  # None: the FFN seam takes the residual itself and norms it (Gemma 4's FFN + experts)
    ffn: DenseFFN | MoEFFN | Any  # the FFN seam: the gated dense FFN (engine.models.ffn), the experts (models.experts),
    # or an architecture's own (Gemma 4: a dense FFN beside experts, engine.models.gemma4_ffn)
    q_dim: int
    kv_dim: int
    biases: tuple[F32, F32, F32] | None = None  # q, k, v biases (ggml_add after the products)
    q_norm: F32 | None = None  # per-head RMSNorm before RoPE (Qwen 3, Gemma 3)
    k_norm: F32 | None = None
    post_attn_norm: F32 | None = None  # Gemma 2 and 3
    post_ffn_norm: F32 | None = None
    sinks: F32 | None = None  # gpt-oss: attn_sinks, one softmax logit per query head (attention to nothing)
    wo_bias: F32 | None = None  # gpt-oss: attn_output.bias
    gated: bool = False  # Qwen3.5 / Qwen3-Next: each head's q row carries its output gate (q | gate), sigmoid(gate) * out
    head_dim: int = 0  # this layer's attention shape where it is not the model's (Gemma 4's global layers); 0: the
    n_heads: int = 0  # model's
    n_kv_heads: int = 0
    kv_source: int | None = None  # Gemma 4's KV sharing: attend to that layer's cached K/V, compute and cache none
    v_from_k: bool = False  # Gemma 4 without attn_v (attention_k_eq_v): V is K's product (before K's norm)
    v_norm: F32 | None = None  # Gemma 4: V RMS-normed per head before the cache (ones: ggml_rms_norm unweighted)
    qkv: FusedLinear = field(init=False)

    def __post_init__(self) -> None:
        self.qkv = FusedLinear(self.qkv_parts)
        fused = len(self.qkv_parts) == 1 and self.qkv_parts[0].n_out != self.q_dim
        names = ("wqkv",) if fused else ("wq", "wk", "wv")
        for name, lin in zip(names, self.qkv_parts):
            setattr(self, name, lin)

    def split_qkv(self, parts: list[F32]) -> list[F32 | None]:
        """q, k, v (rows, n) from the products' outputs: the parts, or views into the fused one; k and v None in a
        layer that reads another's cache (its q is the first q_dim columns, of attn_q or of a fused attn_qkv)."""
        if self.kv_source is not None:
            return [parts[0][..., : self.q_dim], None, None]
        if self.v_from_k:  # gemma4.cpp: Vcur = Kcur when the layer has no attn_v
            return [parts[0], parts[1], parts[1]]
        if len(parts) == 3:
            return parts
        return self.split_fused(parts[0])

    def split_fused(self, y: F32) -> list[F32]:
        """q, k, v: views into the fused attn_qkv product's rows."""
        a, b = self.q_dim, self.q_dim + self.kv_dim
        return [y[..., :a], y[..., a:b], y[..., b:]]

    def input_names(self) -> tuple[tuple[str, ...], ...]:
        """The matrices each recorded input of the block feeds: q/k/v, output, then the FFN's (gate/up, down)."""
        return (tuple(p.weight.name for p in self.qkv_parts), (self.wo.weight.name,), *self.ffn.input_names())

    def linears(self) -> list[Linear]:
        """The block's matrices in the order its graph multiplies them."""
        return [*self.qkv_parts, self.wo, *self.ffn.linears()]

    def fused(self) -> list[FusedLinear]:
        """The products that multiply several matrices' rows at once (q/k/v, gate/up)."""
        return [f for f in (self.qkv, self.ffn.gate_up) if f is not None]


class Transformer(DecoderModel):
    """The shared graph; subclasses set the switches below, `Args`, and `load_layer` where tensors differ."""

    Args: ClassVar[type[TransformerArgs]] = TransformerArgs
    default_rope_base: ClassVar[float] = 10000.0
    qk_norm: ClassVar[bool] = False  # attn_q_norm / attn_k_norm required
    post_norms: ClassVar[bool] = False  # post_attention_norm / post_ffw_norm required
    embed_scale: ClassVar[bool] = False  # the embeddings times sqrtf(dim) (Gemma)
    always_tied: ClassVar[bool] = False  # the head is token_embd even when output.weight exists (Gemma 2)
    refused: ClassVar[re.Pattern[str]] = NOT_APPLIED  # tensors this graph does not apply: refused by name
    moe: ClassVar[str] = ""  # Mixture-of-Experts layers: '' none, 'optional' (llama), 'required' (qwen2moe, qwen3moe)
    moe_normalize: ClassVar[bool] = True  # build_moe_ffn's norm_w: the chosen experts' weights divided by their sum
    shared_expert: ClassVar[bool] = False  # Qwen2-MoE's shared expert and its sigmoid gate
    fused_gate_up_exps: ClassVar[bool] = False  # ffn_gate_up_exps accepted in place of ffn_gate_exps + ffn_up_exps
    shared_sigmoid: ClassVar[str] = "silu_div"  # its gate: qwen2moe's silu(x) / x, or "sigmoid" (qwen35moe, qwen3next)
    moe_gating: ClassVar[str] = "softmax"  # build_moe_ffn's gating: 'softmax', or 'softmax_weight' (gpt-oss)
    expert_biases: ClassVar[bool] = False  # gpt-oss: router and expert biases
    ffn_norm_name: ClassVar[str] = "ffn_norm"  # the FFN's input norm (gpt-oss calls it post_attention_norm)
    attn_output_gate: ClassVar[bool] = False  # attn_q holds each head's query then its output gate (Qwen3.5)
    ablated_heads: dict[int, np.ndarray] = {}  # layer -> query heads whose output is zeroed (engine.intervene)
    head_means: dict[int, np.ndarray] = {}  # layer -> (len(heads), 1, d): the ablated heads' outputs when mean-ablated
    ablated_blocks: dict[int, frozenset[str]] = {}  # layer -> 'attn', 'ffn', 'experts' switched off (engine.intervene)
    control: dict[int, np.ndarray] = {}  # layer -> a control vector's direction added to its output (build_cvec)
    hooks: dict[str, Any] = {}  # hook point name -> fn(value, name) -> None or a replacement (engine.intervene.hooks)

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> TransformerArgs:
        return cls.Args.read(md, n_vocab, cls.arch_name, cls.default_rope_base, moe=cls.moe)

    def __init__(self, args: TransformerArgs, w: Weights, ops: Numerics):
        super().__init__(args, w, ops)
        a = args
        self.tok_embd = w.qtensor("token_embd.weight", (a.dim, a.n_vocab))
        self.layers = [self.load_layer(w, i, a) for i in range(a.n_layers)]
        self.out_norm = w.vector("output_norm.weight", a.dim)
        name = "output.weight" if w.has("output.weight") and not self.always_tied else "token_embd.weight"
        self.output = w.linear(name, a.dim, a.n_vocab)
        self.output.column_major = True
        self.refuse_ignored(w)
        self.attn_softcap = a.attn_softcap
        self.rope_scaling = a.scaling(self.load_rope_factors(w, a))
        self.specs = [spec if layer.sinks is None else replace(spec, sinks=tuple(float(v) for v in layer.sinks))
                      for spec, layer in zip(a.layer_specs(), self.layers)]
        self.spec = self.specs[0]
        self.freqs_by_base = {s.rope_base: rope_freqs(a.rope_dim, s.rope_base, self.rope_scaling) for s in self.specs}
        self.freqs = self.freqs_by_base.get(a.rope_base, self.freqs_by_base[self.spec.rope_base])  # the GPU plan's

    def refuse_ignored(self, w: Weights) -> None:
        """Tensors llama.cpp would add into the graph (optional biases of build_attn / build_ffn, output.bias) that
        this one does not: refused by name, never left out silently (that would change every logit)."""
        for name in w.unused():
            if self.refused.match(name):
                raise ModelFormatError(name, f"is not applied by GGUF Lens's {self.arch_name} graph yet; the logits would be wrong")

    def load_rope_factors(self, w: Weights, a: TransformerArgs) -> F32 | None:
        """rope_freqs.weight (Llama 3) when the file has it: one factor per rotated pair."""
        if w.has("rope_freqs.weight"):
            return w.vector("rope_freqs.weight", a.rope_dim // 2)
        return None

    def load_layer(self, w: Weights, i: int, a: TransformerArgs) -> Layer:
        """Block i's tensors under llama.cpp's names (create_tensor_qkv: a fused attn_qkv, or q/k/v with biases)."""
        b = f"blk.{i}."
        q_dim, kv_dim = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        q_rows = 2 * q_dim if self.attn_output_gate else q_dim  # q and its gate, head by head
        attn_norm = w.vector(b + "attn_norm.weight", a.dim)  # first, as load_arch_tensors creates them
        if w.has(b + "attn_qkv.weight"):
            qkv = [w.linear(b + "attn_qkv.weight", a.dim, q_rows + 2 * kv_dim)]
        else:
            if not w.has(b + "attn_q.weight"):
                raise ModelFormatError(b + "attn_q.weight", f"required tensor is missing from the file (and there is no fused "
                                       f"{b}attn_qkv.weight either)")
            qkv = [w.linear(b + "attn_q.weight", a.dim, q_rows), w.linear(b + "attn_k.weight", a.dim, kv_dim),
                   w.linear(b + "attn_v.weight", a.dim, kv_dim)]
        names = [b + f"attn_{x}.bias" for x in "qkv"]
        biases = None
        if w.has(b + "attn_qkv.weight") and w.has(b + "attn_qkv.bias"):  # wqkv_b: one add on the fused row
            fused = w.vector(b + "attn_qkv.bias", q_dim + 2 * kv_dim)
            biases = (fused[:q_dim], fused[q_dim : q_dim + kv_dim], fused[q_dim + kv_dim :])
        elif all(w.has(n) for n in names):
            biases = (w.vector(names[0], q_dim), w.vector(names[1], kv_dim), w.vector(names[2], kv_dim))
        elif any(w.has(n) for n in names):
            missing = next(n for n in names if not w.has(n))
            raise ModelFormatError(missing, "required tensor is missing from the file (the other q/k/v biases are there)")
        extra: dict[str, Any] = {}
        if self.qk_norm:
            extra["q_norm"] = w.vector(b + "attn_q_norm.weight", a.head_dim)
            extra["k_norm"] = w.vector(b + "attn_k_norm.weight", a.head_dim)
        if self.post_norms:
            extra["post_attn_norm"] = w.vector(b + "post_attention_norm.weight", a.dim)
            extra["post_ffn_norm"] = w.vector(b + "post_ffw_norm.weight", a.dim)
        wo = w.linear(b + "attn_output.weight", q_dim, a.dim)
        ffn_norm = w.vector(b + self.ffn_norm_name + ".weight", a.dim)
        ffn = load_moe(self, w, i, a) if a.n_expert else self.load_ffn(w, b, a)
        return Layer(attn_norm, qkv, wo, ffn_norm, ffn, q_rows, kv_dim, biases, gated=self.attn_output_gate, **extra)

    def load_ffn(self, w: Weights, b: str, a: TransformerArgs) -> DenseFFN:
        """Block b's FFN: ffn_gate and ffn_up, then ffn_down."""
        parts = [w.linear(b + "ffn_gate.weight", a.dim, a.hidden_dim), w.linear(b + "ffn_up.weight", a.dim, a.hidden_dim)]
        return DenseFFN(parts, w.linear(b + "ffn_down.weight", a.hidden_dim, a.dim), self.glu)

    def embed(self, ids: npt.NDArray[np.int64]) -> F32:
        x = self.ops.embed_rows(self, self.tok_embd, ids)  # (T, dim)
        return x * np.float32(math.sqrt(self.args.dim)) if self.embed_scale else x

    def run_layers(self, x: F32, start: int, cache: KVCache, recorder: Recorder | None, which: range) -> F32:
        t = x.shape[0]
        pos = np.arange(start, start + t)
        tables = self.rope_tables(pos)
        masks: dict = {}
        hook = self.hook if self.hooks else None
        for i in which:
            layer = self.layers[i]
            off = self.ablated_blocks.get(i, ())
            if hook is not None:
                x = hook(f"blocks.{i}.hook_resid_pre", x)
            h = self.norm(x, layer.attn_norm)
            mixer = getattr(layer, "mixer", None)  # the mixer seam: a recurrent layer (engine.models.deltanet), else attention
            o = (mixer(h, self.ops, cache, start, recorder, hook) if mixer is not None else
                 self.attention(i, layer, h, start, pos, tables[self.rope_key(i)], cache, masks, recorder))
            o = self.norm(o, layer.post_attn_norm) if layer.post_attn_norm is not None else o
            o = np.zeros_like(o) if "attn" in off else o  # an ablated attention adds nothing (its K, V are cached)
            x = x + (o if hook is None else hook(f"blocks.{i}.hook_attn_out", o))
            h = self.norm(x, layer.ffn_norm) if layer.ffn_norm is not None else x  # else the seam norms it
            f = layer.ffn(h, self.ops, recorder)
            f = self.norm(f, layer.post_ffn_norm) if layer.post_ffn_norm is not None else f
            f = np.zeros_like(f) if "ffn" in off else f
            x = x + (f if hook is None else hook(f"blocks.{i}.hook_mlp_out", f))
            x = self.finish_block(i, x, recorder)
            direction = self.control.get(i)
            if direction is not None:  # build_cvec: ggml_add of the layer's direction to its output
                x = x + direction
            if hook is not None:
                x = hook(f"blocks.{i}.hook_resid_post", x)
            if recorder is not None:
                recorder.record_hidden(i, start, x)
        return x

    def rope_tables(self, pos: np.ndarray) -> dict[Any, tuple[F32, F32]]:
        """cos and sin for these positions, one table per RoPE the layers use (here: per base)."""
        return {base: self.ops.rope_tables(self, pos, base, f) for base, f in self.freqs_by_base.items()}

    def rope_key(self, i: int) -> Any:
        """Which of `rope_tables` layer i rotates with."""
        return self.specs[i].rope_base

    def finish_block(self, i: int, x: F32, recorder: Recorder | None) -> F32:
        """What block i adds after its FFN's residual and before a control vector: nothing here (Gemma 4: the
        per-layer input and the layer's output scale)."""
        return x

    def attention(
        self, i: int, layer: Layer, h: F32, start: int, pos: np.ndarray, rope: tuple[F32, F32], cache: KVCache,
        masks: dict, recorder: Recorder | None,
    ) -> F32:
        """Layer i's attention block on its normed input h (T, dim): the output product's rows (T, dim)."""
        a, spec, ops = self.args, self.specs[i], self.ops
        t, d = h.shape[0], layer.head_dim or a.head_dim
        n_heads, n_kv = layer.n_heads or a.n_heads, layer.n_kv_heads or a.n_kv_heads
        cos, sin = rope
        if recorder is not None:  # the inputs of the products, for an importance matrix
            recorder.record_input(layer.input_names()[0], h)
        q, k, v = layer.split_qkv(layer.qkv(h))
        if layer.biases is not None:  # build_qkv: ggml_add of each bias after its product
            q, k, v = (y + bias for y, bias in zip((q, k, v), layer.biases))
        gate = None
        if layer.gated:  # qwen35.cpp: views of each head's q and its gate, the gate made contiguous
            qg = q.reshape(t, n_heads, 2, d)
            q, gate = qg[:, :, 0], qg[:, :, 1].copy().reshape(t, n_heads * d)
        q = q.reshape(t, n_heads, d)  # (T, Hq, d)
        if layer.q_norm is not None:  # build_norm on each head before RoPE (qwen3.cpp, gemma3.cpp)
            q = self.norm(q, layer.q_norm)
        if k is not None:  # else the layer reads another's cache rows (Gemma 4's KV sharing)
            k = k.reshape(t, n_kv, d)  # (T, Hkv, d)
            v = v.reshape(t, n_kv, d)
            if layer.k_norm is not None:
                k = self.norm(k, layer.k_norm)
            if layer.v_norm is not None:  # gemma4.cpp: ggml_rms_norm of each V head
                v = self.norm(v, layer.v_norm)
        # Gemma 2/3 and Phi-3 scale the query after RoPE (ggml_scale) and attend with kq_scale 1
        q_scale, kq_scale = (spec.scale, 1.0) if self.query_scaled else (1.0, spec.scale)
        fast = None if t > 1 or self.attn_softcap is not None or layer.sinks is not None or k is None else \
            ops.decode_attention(cache, i, q[0], k[0], v[0], start, cos[0], sin[0], self.rope_mode == "neox", q_scale,
                                 kq_scale, spec.window)
        if fast is not None:  # one token: RoPE, the cache write and attention in one compiled call
            q, o = fast
        else:
            q = ops.rotate(q.transpose(1, 0, 2), cos, sin, self.rope_mode)  # (Hq, T, d)
            if k is not None:
                k = ops.rotate(k.transpose(1, 0, 2), cos, sin, self.rope_mode)  # (Hkv, T, d)
                cache.put(i, start, k, v.transpose(1, 0, 2))
            qs = q * np.float32(q_scale) if q_scale != 1.0 else q
            o = ops.attend(qs, cache, i, start + t, pos, kq_scale, spec.window, masks, self.attn_softcap, layer.sinks)
        if recorder is not None:
            recorder.record_q(i, start, q, spec)
        off = self.ablated_heads.get(i)
        if off is not None:  # an ablated head: its output zeroed (or its mean) before the output product mixes them
            o = o.copy()
            means = self.head_means.get(i)
            o[off] = 0.0 if means is None else means
        if self.hooks:  # each head's output, (T, heads, d) as TransformerLens's hook_z
            o = self.hook(f"blocks.{i}.attn.hook_z", o.transpose(1, 0, 2)).transpose(1, 0, 2)
        o = o.transpose(1, 0, 2).reshape(t, n_heads * d)
        if gate is not None:  # ggml_mul by ggml_sigmoid(gate)
            o = o * ops.sigmoid(gate)
        if recorder is not None:
            recorder.record_input(layer.input_names()[1], o)
        out = layer.wo(o)
        return out if layer.wo_bias is None else out + layer.wo_bias  # build_attn's ggml_add of wo_b

    def hook(self, name: str, value: F32) -> F32:
        """The value at hook point `name` after its hook (if any): the hook's replacement, checked, or the value."""
        fn = self.hooks.get(name)
        if fn is None:
            return value
        got = fn(value, name)
        if got is None:
            return value
        got = np.asarray(got, np.float32)
        if got.shape != value.shape:
            raise ValueError(f"hook {name}: returned shape {got.shape}, expected {value.shape}")
        return got

    def head(self, x: F32, all_logits: bool) -> F32:
        x = self.norm(x if all_logits else x[-1:], self.out_norm)
        logits = self.output(x)
        cap = self.args.final_softcap
        if cap is not None:  # gemma2.cpp: ggml_scale by 1/cap, ggml_tanh, ggml_scale by cap
            logits = soft_cap(logits, cap)
        return logits
