"""A decode step (one token) with ggml numerics as a short list of compiled calls: eight per block.

A hybrid's recurrent block (engine.models.deltanet.MixerLayer) takes the same calls with its mixer's products and
one compiled call for the recurrence in place of attention, and gated attention (Qwen3.5) one more for its output
gate (engine.runtime.decode_mixer). Gemma 4: each block in its own shape and RoPE kind, a KV-sharing block reading its
source's rows (nothing written), V normed before the cache; its FFN seam's dense FFN bound like any other, the seam
with experts and the per-layer inputs (`finish_block`) called between the compiled calls.

Per block: residual + RMSNorm + activation quantization (one call), the q/k/v product(s), attention with RoPE
and the fp16 cache write (one call; with flash attention on, engine.runtime.decode_flash's), the output product,
residual + norm + quantization, the gate/up product(s), the GLU + quantization, the down product. The products are the kernels of engine.kernels bound
once to their weights and to buffers that live as long as the plan, so no call allocates or converts
anything; the non-matrix work is engine.runtime.decode_step. The numbers are those of the NumPy path (the same
operations in the same order), which still runs prompts, other cache types and the float32 numerics.

The plan is built from the model's one description of a block (engine.models.transformer.Layer: its products,
norms and biases; the FFN seam dense or experts) and its switches; the step calls the recorder where the
graph does (the inputs of the products, the rotated queries, the residual stream after each block). An experts
FFN (engine.models.experts) runs as the graph runs it, between the compiled calls of its block. LoRA adapters run
after the product they adapt (engine.runtime.decode_lora); a control vector's direction is added to the residual after
its block, once the block's output is added (build_cvec). A plan is rebuilt when a weight is swapped (requantizing in
the Quantization lens) or the adapters change.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.kernels import isa, precompile
from engine.kernels.activations import KERNEL_LOCK
from engine.ops import attention_ggml as ggml_attention
from engine.ops import ggml as ggml_ops
from engine.runtime import decode_flash, decode_lora
from engine.runtime import decode_step as ggml_step
from engine.runtime.decode_bind import EMPTY as _EMPTY
from engine.runtime.decode_bind import Inputs, Product, bind, bind_all, vec, views
from engine.runtime.decode_mixer import MixerStep, gate_quant
from engine.models.decoder import DecoderModel
from engine.models.deltanet import MixerLayer
from engine.models.experts import MoEFFN
from engine.models.ffn import DenseFFN
from engine.models.transformer import Layer, Transformer
from engine.ops.reference import soft_cap
from engine.quant.types import GGMLType
from engine.tensor import Linear

if TYPE_CHECKING:
    from engine.observe.recorder import Recorder
    from engine.runtime.numerics import GgmlNumerics

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]


@dataclass
class _Layer:
    """One block as the step calls it: the bound products, their output views and what never changes between tokens."""

    runs: tuple[Callable[[], None], ...]  # the q/k/v products
    q: F32
    k: F32
    v: F32
    wo: Product
    ffn_runs: tuple[Callable[[], None], ...]  # the gate/up products
    gate: F32
    up: F32
    down: Product | None  # None in an experts layer
    attn_norm: F32
    ffn_norm: F32
    q_norm: F32
    k_norm: F32
    post_attn: F32
    post_ffn: F32
    h_slots: tuple[int, U8, int, U8]  # the attention input's activation types and buffers
    f_slots: tuple[int, U8, int, U8]  # the FFN input's
    o_vdt: int  # the attention output's (wo reads it)
    o_buf: U8
    d_vdt: int  # the GLU output's (down reads it)
    d_buf: U8
    biases: tuple[F32, F32, F32] | None  # q, k, v biases added after the products (ggml_add)
    window: int
    base: float
    q_scale: np.float32
    kq_scale: np.float32
    names: tuple[tuple[str, ...], ...]  # the matrices each recorded input goes to: q/k/v, output, gate/up, down
    moe: MoEFFN | None = None  # an experts FFN: run by its own module between the compiled calls
    sinks: F32 = field(default_factory=lambda: _EMPTY)  # gpt-oss: one softmax logit per head (empty: none)
    wo_bias: F32 | None = None  # gpt-oss: added to the output product's row (ggml_add)
    q_gated: F32 | None = None  # Qwen3.5's gated attention: the q product's rows (Hq, 2, d), q then its output gate
    out_gate: F32 | None = None  # (Hq * d,) the gates, copied out of q_gated each token (q too, into `q`)
    mixer: MixerStep | None = None  # a recurrent block: its mixer instead of attention (q, k, v unused)
    v_norm: F32 = field(default_factory=lambda: _EMPTY)  # Gemma 4: V RMS-normed per head before the cache
    kv_layer: int = -1  # Gemma 4's KV sharing: the layer whose cached rows this one reads (k, v empty); -1: its own
    q_rot: F32 = field(default_factory=lambda: _EMPTY)  # (Hq, d) this layer's rotated queries, o (1, Hq*d) its output
    o: F32 = field(default_factory=lambda: _EMPTY)
    act: F32 = field(default_factory=lambda: _EMPTY)  # (1, n_ff) the GLU's output (widths differ per layer: Gemma 4)
    rope: tuple[Any, float] = (None, 0.0)  # what the RoPE tables are read off (the model, or Gemma 4's kind) and base
    seam: Any = None  # Gemma 4's FFN seam with experts: called on the residual itself between the compiled calls
    finish: bool = False  # the model adds to the residual after the FFN (Gemma 4's per-layer input, output scale)


class DecodePlan:
    """Bound products and buffers for one-token steps of one model with ggml numerics and an F16 cache."""

    def __init__(self, model: DecoderModel, ops: GgmlNumerics):
        a = model.args
        self.model, self.ops = model, ops
        self.key = self._key(model)
        self.adapters = list(getattr(model, "lora_adapters", None) or ())  # alive: their ids in the key stay theirs
        self.dim = a.dim
        self.eps = np.float32(a.norm_eps)
        self.glu = ggml_step.GEGLU if model.glu == "geglu" else ggml_step.SWIGLU
        self.table = ggml_ops.gelu_table() if self.glu == ggml_step.GEGLU else _EMPTY
        self.layers: list[_Layer] = []
        self.ok = True
        self.ones = np.ones(a.dim, np.float32)  # a norm weight where the step adds to the residual and norms nothing
        self.x = np.zeros(a.dim, np.float32)
        self.h = np.zeros((1, a.dim), np.float32)  # the normed input of the products that read the residual
        for index, layer in enumerate(model.layers):
            built = self._layer(index, layer)
            if built is None:
                self.ok = False
                return
            self.layers.append(built)
        self.head_in = Inputs(a.dim, [model.output.weight.qtype])
        head = bind(model.output.product(), [model.output], self.head_in)
        if head is None or not decode_lora.adapt(head, self.h):
            self.ok = False
            return
        self.head = head
        self.softcap = np.float32(model.attn_softcap or 0.0)  # Gemma 2's attention soft-cap, 0 for none
        self.final_softcap = getattr(a, "final_softcap", None)  # and its logits'

    @staticmethod
    def _key(model: DecoderModel) -> tuple[Any, ...]:
        """What the bound products depend on: the weights swapped so far (Linear.replace is the only way to swap), the
        build whose order the kernels follow, the LoRA adapters bound with them."""
        return (Linear.swaps, isa.bits(), decode_lora.key(model))

    def _adapt(self, bound: list[Product], x: F32) -> bool:
        """The LoRA adapters on these products' parts (all reading x) bound to run after them (decode_lora)."""
        return all(decode_lora.adapt(p, x) for p in bound)

    def _layer(self, index: int, layer: Layer | MixerLayer) -> _Layer | None:
        if isinstance(layer, MixerLayer):
            return self._mixer_layer(index, layer)
        if not isinstance(layer, Layer) or (layer.gated and layer.biases is not None):
            return None
        a = self.model.args
        d, hq = layer.head_dim or a.head_dim, layer.n_heads or a.n_heads  # Gemma 4's global layers: their own
        qkv_groups = layer.qkv.products()
        h_in = Inputs(self.dim, [p.qtype for p, _ in qkv_groups])
        qkv = bind_all(qkv_groups, h_in)
        o_in = Inputs(layer.wo.n_in, [layer.wo.weight.qtype])
        wo = bind(layer.wo.product(), [layer.wo], o_in)
        ffn = self._ffn(layer)
        o = np.zeros((1, hq * d), np.float32)  # the attention's output, wo's input
        if qkv is None or wo is None or ffn is None or len(h_in.vdts) > 2 or layer.wo.n_in != hq * d:
            return None  # residual_norm_quant fills two activation types
        if not self._adapt(qkv, self.h) or not self._adapt([wo], o):
            return None
        q, k, v = layer.split_qkv(views(qkv))
        if k is None or v is None:  # Gemma 4's KV sharing: the source layer's rows, nothing written
            k = v = _EMPTY
        gated: dict = {}
        if layer.gated:  # q's product rows hold each head's query then its gate: both copied out before attention
            gated = {"q_gated": q.reshape(hq, 2, d), "out_gate": np.zeros(hq * d, np.float32)}
            q = np.zeros(hq * d, np.float32)  # (the layer's q_dim counts the gates too)
        spec = self.model.attention_spec(index)
        one, scale = np.float32(1.0), np.float32(spec.scale)
        q_scale, kq_scale = (scale, one) if self.model.query_scaled else (one, scale)
        o_vdt = o_in.vdts[0]
        return _Layer(runs=tuple(p.run for p in qkv), q=q, k=k, v=v, wo=wo, attn_norm=layer.attn_norm,
                      q_norm=vec(layer.q_norm), k_norm=vec(layer.k_norm), post_attn=vec(layer.post_attn_norm),
                      post_ffn=vec(layer.post_ffn_norm), h_slots=h_in.slots(), o_vdt=int(o_vdt),
                      o_buf=o_in.bufs[o_vdt], biases=layer.biases, window=spec.window or 0, base=spec.rope_base,
                      q_scale=q_scale, kq_scale=kq_scale, names=layer.input_names(), sinks=vec(layer.sinks),
                      wo_bias=layer.wo_bias, v_norm=vec(layer.v_norm),
                      kv_layer=-1 if layer.kv_source is None else int(layer.kv_source),
                      q_rot=np.zeros((hq, d), np.float32), o=o,
                      rope=self._rope_of(index, spec.rope_base), **ffn, **gated)

    def _rope_of(self, index: int, base: float) -> tuple[Any, float]:
        """What layer i's RoPE tables are read off and its base: the model, or the layer's kind where the
        architecture keeps one RoPE per kind of block (Gemma 4's `ropes`, engine.models.layer_kinds.LayerRope)."""
        ropes = getattr(self.model, "ropes", None)
        if isinstance(ropes, dict) and ropes:
            r = ropes[self.model.rope_key(index)]
            return r, float(r.base)
        return self.model, float(base)

    def _mixer_layer(self, index: int, layer: MixerLayer) -> _Layer | None:
        """A recurrent block: the mixer's input products, its compiled token (MixerStep), ssm_out, then the FFN."""
        mixer = layer.mixer
        groups = mixer.inputs.products()
        h_in = Inputs(self.dim, [p.qtype for p, _ in groups])
        bound = bind_all(groups, h_in)
        o_in = Inputs(mixer.w_out.n_in, [mixer.w_out.weight.qtype])
        wo = bind(mixer.w_out.product(), [mixer.w_out], o_in)
        ffn = self._ffn(layer)
        if (bound is None or wo is None or ffn is None or len(h_in.vdts) > 2 or layer.post_attn_norm is not None
                or layer.post_ffn_norm is not None):
            return None
        o_vdt = o_in.vdts[0]
        step = MixerStep(mixer, [b.out[:, s:e] for b in bound for _, s, e in b.parts], int(o_vdt), o_in.bufs[o_vdt])
        if not self._adapt(bound, self.h) or not self._adapt([wo], step.y):
            return None
        one = np.float32(1.0)
        return _Layer(runs=tuple(b.run for b in bound), q=_EMPTY, k=_EMPTY, v=_EMPTY, wo=wo, attn_norm=layer.attn_norm,
                      q_norm=_EMPTY, k_norm=_EMPTY, post_attn=_EMPTY, post_ffn=_EMPTY, h_slots=h_in.slots(),
                      o_vdt=int(o_vdt), o_buf=o_in.bufs[o_vdt], biases=None, window=0, base=0.0, q_scale=one,
                      kq_scale=one, names=layer.input_names(), mixer=step, **ffn)

    def _ffn(self, layer: Layer | MixerLayer) -> dict[str, Any] | None:
        """The block's FFN bound, as the _Layer fields that say it (its products, views, input norm and slots, the GLU
        output's type and buffer, the experts module or Gemma 4's seam, whether the model adds after the block); None
        for an FFN the plan does not take (the graph runs it)."""
        ffn, norm = layer.ffn, layer.ffn_norm
        fields: dict[str, Any] = {"finish": type(self.model).finish_block is not Transformer.finish_block,
                                  "ffn_runs": (), "gate": _EMPTY, "up": _EMPTY, "down": None, "moe": None}
        if norm is None:  # Gemma 4's seam norms the residual itself: its dense FFN bound, or the whole seam called
            dense, seam_norm = getattr(ffn, "dense", None), getattr(ffn, "norm", None)
            if not isinstance(dense, DenseFFN) or seam_norm is None:
                return None
            if getattr(ffn, "moe", None) is not None:
                f_in = Inputs(self.dim, [GGMLType.F32])  # (the seam quantizes its own inputs)
                vdt = f_in.vdts[0]
                return {**fields, "seam": ffn, "ffn_norm": self.ones, "f_slots": f_in.slots(), "d_vdt": int(vdt),
                        "d_buf": f_in.bufs[vdt]}
            ffn, norm = dense, seam_norm
        if isinstance(ffn, MoEFFN):  # the FFN's input h in float (quantized by the experts module itself)
            f_in = Inputs(self.dim, [ffn.router.weight.qtype])
            vdt = f_in.vdts[0]
            return {**fields, "moe": ffn, "ffn_norm": norm, "f_slots": f_in.slots(), "d_vdt": int(vdt),
                    "d_buf": f_in.bufs[vdt]}
        if not isinstance(ffn, DenseFFN):
            return None
        gu_groups = ffn.gate_up.products()
        f_in = Inputs(self.dim, [p.qtype for p, _ in gu_groups])
        gate_up = bind_all(gu_groups, f_in)
        d_in = Inputs(ffn.w_down.n_in, [ffn.w_down.weight.qtype])
        down = bind(ffn.w_down.product(), [ffn.w_down], d_in)
        act = np.zeros((1, ffn.w_down.n_in), np.float32)  # the GLU's output, down's input
        if gate_up is None or down is None or len(f_in.vdts) > 2:
            return None
        if not self._adapt(gate_up, self.h) or not self._adapt([down], act):
            return None
        gate, up = ffn.split(views(gate_up))
        d_vdt = d_in.vdts[0]
        return {**fields, "ffn_runs": tuple(p.run for p in gate_up), "gate": gate, "up": up, "down": down,
                "ffn_norm": norm, "f_slots": f_in.slots(), "d_vdt": int(d_vdt), "d_buf": d_in.bufs[d_vdt], "act": act}

    def fits(self, cache: KVCache, pos: int) -> bool:
        """Whether this token can take the compiled step: an F16 cache and a softmax row without a scalar tail."""
        if not self.ok or cache.qtype != GGMLType.F16:
            return False
        if not all(lay.mixer is None or lay.mixer.fits() for lay in self.layers):
            return False  # an ablated DeltaNet value head: the layer runs op by op
        n_kv = ggml_attention.kv_length(pos + 1, cache.n_ctx)
        lanes = isa.lanes()  # a softmax / SiLU chunk of the build whose order the numerics follow
        return all(lay.act.shape[-1] % lanes == 0 for lay in self.layers) and pos + 1 <= n_kv - n_kv % lanes

    def _attend(self, i: int, lay: _Layer, cache: KVCache, pos: int, n_kv: int, rope: tuple[F32, F32],
                attend: Callable[..., None], parts: np.int64, recorder: Recorder | None) -> None:
        """Layer i's attention after its q/k/v products: the output quantized for attn_output. `attend` is
        decode_step's kernel (`parts` its thread shares) or, with flash attention, decode_flash's (`parts` the cells
        per split-KV partial)."""
        if lay.biases is not None:  # build_qkv's ggml_add of each bias, in place in the product rows
            lay.q += lay.biases[0]
            lay.k += lay.biases[1]
            lay.v += lay.biases[2]
        gated = lay.q_gated is not None and lay.out_gate is not None
        if gated:  # qwen35.cpp's views of each head's query and gate, made contiguous
            heads = lay.q_gated.shape[0]
            np.copyto(lay.q.reshape(heads, -1), lay.q_gated[:, 0])
            np.copyto(lay.out_gate.reshape(heads, -1), lay.q_gated[:, 1])
        k_rows, v_rows = cache.rows(i if lay.kv_layer < 0 else lay.kv_layer)
        cos, sin = rope
        q_rot, o = lay.q_rot, lay.o
        attend(lay.q, lay.k, lay.v, lay.q_norm, lay.k_norm, lay.v_norm, self.eps, k_rows, v_rows, pos, n_kv, lay.window, cos, sin,
               self.model.rope_mode == "neox", lay.q_scale, lay.kq_scale, self.softcap, lay.sinks, q_rot, o,
               -1 if gated else lay.o_vdt, lay.o_buf, parts)
        if gated:  # the output times sigmoid(gate), then its bytes for attn_output
            gate_quant(o, lay.out_gate, np.int64(lay.o_vdt), lay.o_buf)
        if recorder is not None:
            recorder.record_q(i, pos, q_rot[:, None, :].copy(), self.model.attention_spec(i))
            recorder.record_input(lay.names[1], o.copy())

    @staticmethod
    def _unlocked(call: Callable[..., F32], *args: Any) -> F32:
        """A module of the graph run between the compiled calls (its products take the kernel lock themselves)."""
        KERNEL_LOCK.release()
        try:
            return call(*args)
        finally:
            KERNEL_LOCK.acquire()

    def _ffn_step(self, lay: _Layer, h: F32, glu: Callable[..., None], recorder: Recorder | None) -> tuple[F32, F32]:
        """The block's FFN on its normed input h (quantized for its products), `glu` the GLU kernel of the build in
        use: (its output, the post-norm)."""
        if lay.moe is not None:  # the experts FFN as the graph runs it (it records its own inputs, routing)
            f = self._unlocked(lay.moe, h.copy(), self.ops, recorder)
            return np.ascontiguousarray(f[0], np.float32), lay.post_ffn
        if recorder is not None:
            recorder.record_input(lay.names[2], h.copy())
        for run in lay.ffn_runs:
            run()
        glu(lay.gate, lay.up, self.glu, self.table, lay.act, lay.d_vdt, lay.d_buf)
        if recorder is not None:
            recorder.record_input(lay.names[3], lay.act.copy())
        lay.down.run()
        return lay.down.out[0], lay.post_ffn

    def step(self, x0: F32, cache: KVCache, pos: int, recorder: Recorder | None) -> F32:
        """Logits (1, n_vocab) of the token whose embedding is x0 (1, dim) at position `pos` (cache reserved)."""
        model = self.model
        n_kv = ggml_attention.kv_length(pos + 1, cache.n_ctx)
        rope = {(id(src), base): self.ops.rope_row(src, base, pos) for src, base in
                {(lay.rope[0], lay.rope[1]) for lay in self.layers if lay.mixer is None}}
        x, h, eps = self.x, self.h, self.eps
        x[:] = x0[0]
        control = getattr(model, "control", None) or {}  # a control vector's directions by layer (engine.intervene)
        delta, post = _EMPTY, _EMPTY
        w8 = bool(isa.w8())
        rnq, glu = ggml_step.residual_norm_quant, ggml_step.GLU_QUANT[w8]
        from numba import get_num_threads  # noqa: PLC0415 - this plan runs with compiled kernels only

        if self.ops.flash:  # ggml_flash_attn_ext's one-row kernel, split in chunks of llama.cpp's thread count
            attend, parts = decode_flash.ATTEND_FLASH[w8], decode_flash.chunk_of(n_kv, self.ops.flash_threads)
        else:  # the heads in a share per thread
            attend, parts = ggml_step.ATTEND[w8], np.int64(get_num_threads())
        with KERNEL_LOCK:
            for i, lay in enumerate(self.layers):
                rnq(x, delta, post, lay.attn_norm, eps, h, *lay.h_slots)
                if recorder is not None:  # the inputs of the products, as the graph records them
                    recorder.record_input(lay.names[0], h.copy())
                for run in lay.runs:
                    run()
                if lay.mixer is not None:  # a recurrent block: its token in one call, y quantized for ssm_out
                    lay.mixer.run(cache, pos, recorder)  # type: ignore[arg-type]
                else:
                    self._attend(i, lay, cache, pos, n_kv, rope[(id(lay.rope[0]), lay.rope[1])], attend, parts, recorder)
                lay.wo.run()
                if lay.wo_bias is not None:  # build_attn's ggml_add of wo_b
                    lay.wo.out[0] += lay.wo_bias
                if lay.seam is not None:  # Gemma 4's FFN seam with experts, on the residual itself
                    rnq(x, lay.wo.out[0], lay.post_attn, self.ones, eps, h, -1, lay.d_buf, -1, lay.d_buf)
                    f = self._unlocked(lay.seam, x[None].copy(), self.ops, recorder)
                    delta, post = np.ascontiguousarray(f[0], np.float32), lay.post_ffn
                else:
                    rnq(x, lay.wo.out[0], lay.post_attn, lay.ffn_norm, eps, h, *lay.f_slots)
                    delta, post = self._ffn_step(lay, h, glu, recorder)
                if lay.finish:  # the residual whole, then what the model adds to it (Gemma 4's per-layer input)
                    rnq(x, delta, post, self.ones, eps, h, -1, lay.d_buf, -1, lay.d_buf)
                    done = self._unlocked(model.finish_block, i, x[None].copy(), recorder)
                    x[:] = done[0]
                    delta, post = _EMPTY, _EMPTY
                direction = control.get(i)
                if direction is not None:  # build_cvec: the residual whole, then the layer's direction added to it
                    rnq(x, delta, post, self.ones, eps, h, -1, lay.d_buf, -1, lay.d_buf)
                    x += direction
                    delta, post = _EMPTY, _EMPTY
                if recorder is not None:  # the residual after the block (the next call adds it to x)
                    hidden = x.copy()
                    rnq(hidden, delta, post, lay.attn_norm, eps, h, -1, lay.d_buf, -1, lay.d_buf)
                    recorder.record_hidden(i, pos, hidden[None, :])
            rnq(x, delta, post, model.out_norm, eps, h, *self.head_in.slots())
            self.head.run()
        logits = self.head.out.copy()
        if self.final_softcap is not None:  # gemma2.cpp: ggml_scale by 1/cap, ggml_tanh, ggml_scale by cap
            logits = soft_cap(logits, self.final_softcap)
        return logits


def plan_for(model: DecoderModel, ops: GgmlNumerics) -> DecodePlan:
    """The model's current plan (kept by its numerics object), rebuilt when a weight was swapped since it was made."""
    plan = ops.decode_plan
    if plan is None or plan.key != DecodePlan._key(model):
        plan = DecodePlan(model, ops)
        if not precompile.is_dry():  # a dry pass's plan holds products that do nothing
            ops.decode_plan = plan
    return plan

