"""The recurrent mixer of the 2026 hybrids: a gated DeltaNet layer, the seam beside attention in the block graph.

Qwen3.5 / Qwen3.6 (`qwen35`, `qwen35moe`) and Qwen3-Next run three layers in four as linear attention with a
state of fixed size instead of a KV cache. As llama.cpp's build_layer_attn_linear (src/models/qwen35.cpp) and
llm_build_delta_net_base (delta-net-base.cpp) run one, on the normed input h:

1. four products of h: `attn_qkv` (q|k|v for the convolution, 2 * key_dim + value_dim), `attn_gate` (z, value_dim),
   `ssm_beta` and `ssm_alpha` (one per value head);
2. beta = sigmoid(h ssm_beta); the decay gate g = softplus(h ssm_alpha + ssm_dt.bias) * ssm_a (ssm_a is stored as
   -exp(A_log));
3. the short causal convolution over the whole q|k|v projection (`ssm_conv1d`, K taps, F32, no bias) with the
   last K - 1 inputs carried over from the previous batch (zeros at the start), then SiLU;
4. q, k (`state_size` per head, `group_count` key heads) L2-normalised; v (`time_step_rank` value heads);
   value head h reads key head h % n_k (Qwen3.5's converter orders the value heads so that ggml's broadcast tiles
   the key heads; Qwen3-Next's keeps them grouped: `key_heads`, engine.models.qwen3next);
5. the gated delta rule (engine.ops.delta_rule), the output reading the state after the token's own update,
   scaled by 1/sqrt(head_v_dim);
6. the gated norm: RMSNorm of each head's output by `ssm_norm` (stored without the +1 folded into the other norms)
   times SiLU(z); then `ssm_out`.

The state lives in engine.hybrid_cache.HybridCache; the recorder gets each token's q, k, v, g and beta so that
engine.observe.recurrent can say exactly how much each earlier token contributes to an output.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError
from engine.hybrid_cache import HybridCache, RecurrentShape, RecurrentState
from engine.models.args import MetadataView
from engine.models.ffn import DenseFFN
from engine.models.experts import MoEFFN
from engine.models.weights import Weights
from engine.tensor import FusedLinear, Linear

if TYPE_CHECKING:
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class DeltaNetDims:
    """A DeltaNet layer's sizes from `<arch>.ssm.*` (llama.cpp reads them as hparams.ssm_*)."""

    conv_kernel: int  # ssm.conv_kernel
    inner: int  # ssm.inner_size (= value_dim)
    state: int  # ssm.state_size: head_k_dim = head_v_dim
    v_heads: int  # ssm.time_step_rank
    k_heads: int  # ssm.group_count

    @property
    def key_dim(self) -> int:
        return self.state * self.k_heads

    @property
    def value_dim(self) -> int:
        return self.state * self.v_heads

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def recurrent_shape(self) -> RecurrentShape:
        return RecurrentShape(self.conv_kernel - 1, self.conv_dim, self.v_heads, self.state)

    @classmethod
    def read(cls, m: MetadataView) -> DeltaNetDims:
        """The keys, checked against each other before anything is allocated."""
        a = m.arch
        dims = cls(m.int("ssm.conv_kernel"), m.int("ssm.inner_size"), m.int("ssm.state_size"),
                   m.int("ssm.time_step_rank"), m.int("ssm.group_count"))
        for key, value, lo, hi in (("ssm.conv_kernel", dims.conv_kernel, 2, 64), ("ssm.state_size", dims.state, 1, 1024),
                                   ("ssm.time_step_rank", dims.v_heads, 1, 1024), ("ssm.group_count", dims.k_heads, 1, 1024)):
            if not lo <= value <= hi:
                raise ModelFormatError(f"{a}.{key}", f"must be between {lo} and {hi}", value)
        if dims.v_heads % dims.k_heads:
            raise ModelFormatError(f"{a}.ssm.group_count", f"does not divide ssm.time_step_rank {dims.v_heads} (each value "
                                   "head reads key head h % group_count)", dims.k_heads)
        if dims.inner != dims.value_dim:
            raise ModelFormatError(f"{a}.ssm.inner_size", f"must be ssm.state_size x ssm.time_step_rank = {dims.value_dim}",
                                   dims.inner)
        return dims


@dataclass
class DeltaNetMixer:
    """One gated DeltaNet layer's weights and its forward (see the module docstring)."""

    layer: int
    dims: DeltaNetDims
    parts: list[Linear]  # the input products in llama.cpp's order; qwen35: attn_qkv (dim -> conv_dim), attn_gate
    # (dim -> value_dim), ssm_beta and ssm_alpha (dim -> v_heads); `projections` reads their outputs
    conv: F32  # ssm_conv1d (conv_dim, K)
    dt_bias: F32  # ssm_dt.bias (v_heads,)
    a: F32  # ssm_a (v_heads,): -exp(A_log)
    norm: F32  # ssm_norm (state,)
    w_out: Linear  # ssm_out: value_dim -> dim
    eps: float
    ablated_heads: npt.NDArray[np.int64] | None = None  # value heads whose output is zeroed (engine.intervene)
    key_map: ClassVar[int] = 0  # which key head value head h reads: 0 h % k_heads (Qwen3.5), 1 h // group (Qwen3-Next)
    inputs: FusedLinear = field(init=False)

    def __post_init__(self) -> None:
        self.inputs = FusedLinear(self.parts)

    def input_names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return tuple(p.weight.name for p in self.inputs.parts), (self.w_out.weight.name,)

    def linears(self) -> list[Linear]:
        return [*self.inputs.parts, self.w_out]

    def projections(self, h: F32) -> tuple[F32, F32, F32, F32]:
        """q|k|v for the convolution (T, conv_dim), z (T, value_dim), beta's and alpha's inputs (T, v_heads) from the
        normed input h: `split` of the four products."""
        return self.split(self.inputs(h))

    def split(self, parts: list[F32]) -> tuple[F32, F32, F32, F32]:
        """qkv, z, b, alpha from the input products' outputs (T, n) in the order of `parts`: here as they are (the
        compiled decode step, engine.runtime.decode_plan, hands its own product rows)."""
        qkv, z, b, alpha = parts
        return qkv, z, b, alpha

    def key_heads(self, x: F32) -> F32:
        """q or k (T, k_heads, S) as the delta rule takes them: as they are (value head h reads key head h % k_heads)."""
        return x

    def __call__(self, h: F32, ops: Any, cache: HybridCache, start: int, recorder: Recorder | None,
                 hook: Callable[[str, F32], F32] | None = None) -> F32:
        """The layer's output rows (T, dim) for its normed input h (T, dim); the state reached goes to the cache.
        `hook` (the model's, engine.intervene.hooks) sees each value head's output (T, heads, S) as
        `blocks.{layer}.attn.hook_z`, before the gated norm."""
        d, t, rec = self.dims, h.shape[0], ops.recurrent()
        exact = ops.exact
        if recorder is not None:
            recorder.record_input(self.input_names()[0], h)
        qkv, z, b, alpha = self.projections(h)
        if t == 1 and exact and hook is None and self.ablated_heads is None and rec.step_available():
            return self._one_token(qkv, z, b, alpha, rec, cache, start, recorder)
        g, decay, beta = rec.gates(alpha, self.dt_bias, self.a, b, exact)
        state = cache.state(self.layer)
        window = np.concatenate([state.conv, qkv.astype(np.float32)])  # (K - 1 + T, conv_dim)
        x = ops.silu(rec.ssm_conv(window, self.conv, exact))
        kd = d.key_dim
        q = self.key_heads(rec.l2_norm(x[:, :kd].reshape(t, d.k_heads, d.state), self.eps, exact))
        k = self.key_heads(rec.l2_norm(x[:, kd : 2 * kd].reshape(t, d.k_heads, d.state), self.eps, exact))
        v = x[:, 2 * kd :].reshape(t, d.v_heads, d.state)
        out, final, before = rec.delta_rule(q, k, v, decay, beta, state.ssm, exact, snap_at=t - 2 if t > 1 else -1)
        rows = d.conv_kernel - 1
        cache.put_state(self.layer, RecurrentState(window[t : t + rows].copy(), final),
                        RecurrentState(window[t - 1 : t - 1 + rows].copy(), before) if before is not None else None)
        if recorder is not None:
            recorder.record_recurrent(self.layer, start, q, k, v, g, beta)
        if self.ablated_heads is not None and self.ablated_heads.size:
            out = out.copy()
            out[:, self.ablated_heads] = 0.0
        if hook is not None:
            out = hook(f"blocks.{self.layer}.attn.hook_z", out)
        y = ops.norm(out, self.norm, self.eps) * ops.silu(z.reshape(t, d.v_heads, d.state))
        y = y.reshape(t, d.value_dim)
        if recorder is not None:
            recorder.record_input(self.input_names()[1], y)
        return self.w_out(y)


    def _one_token(self, qkv: F32, z: F32, b: F32, alpha: F32, rec: Any, cache: HybridCache, start: int,
                   recorder: Recorder | None) -> F32:
        """A decode step's layer between its products in one compiled call (engine.ops.delta_rule.step: the same
        bits as the ops one by one)."""
        d, state = self.dims, cache.state(self.layer)
        y, conv, ssm, got = rec.step(qkv, z, b, alpha, self.dt_bias, self.a, self.conv, self.norm, self.eps,
                                     state.conv, state.ssm, d.k_heads, self.key_map)
        cache.put_state(self.layer, RecurrentState(conv, ssm), None)
        if recorder is not None:
            recorder.record_recurrent(self.layer, start, self.key_heads(got["q"]), self.key_heads(got["k"]), got["v"],
                                      got["g"], got["beta"])
            recorder.record_input(self.input_names()[1], y[None])
        return self.w_out(y[None])


def load_deltanet(w: Weights, i: int, dim: int, dims: DeltaNetDims, eps: float, parts: list[Linear] | None = None,
                  cls: type[DeltaNetMixer] | None = None) -> DeltaNetMixer:
    """Block i's DeltaNet tensors under llama.cpp's names, each checked against the sizes the metadata gives; `parts`
    and `cls`: other input products and the mixer that reads them (Qwen3-Next's layouts, engine.models.qwen3next)."""
    b = f"blk.{i}."
    if parts is None:
        parts = [w.linear(b + "attn_qkv.weight", dim, dims.conv_dim),
                 w.linear(b + "attn_gate.weight", dim, dims.value_dim),
                 w.linear(b + "ssm_beta.weight", dim, dims.v_heads),
                 w.linear(b + "ssm_alpha.weight", dim, dims.v_heads)]
    conv = w.qtensor(b + "ssm_conv1d.weight", (dims.conv_kernel, dims.conv_dim)).dequantize()
    conv = np.ascontiguousarray(conv.reshape(dims.conv_dim, dims.conv_kernel), np.float32)
    a = w.vector(b + "ssm_a", dims.v_heads)
    if not np.all(np.isfinite(a)):
        raise ModelFormatError(b + "ssm_a", "holds a value that is not finite (it is -exp(A_log): the decay gate "
                               "would be NaN)")
    dt = w.vector(b + "ssm_dt.bias", dims.v_heads)
    if not np.all(np.isfinite(conv)) or not np.all(np.isfinite(dt)):
        raise ModelFormatError(b + ("ssm_conv1d.weight" if not np.all(np.isfinite(conv)) else "ssm_dt.bias"),
                               "holds a value that is not finite")
    return (cls or DeltaNetMixer)(
        i, dims, parts, conv=conv, dt_bias=dt, a=a,
        norm=w.vector(b + "ssm_norm.weight", dims.state),
        w_out=w.linear(b + "ssm_out.weight", dims.value_dim, dim), eps=eps)


@dataclass
class MixerLayer:
    """A block whose mixer is not attention: the norms and the FFN seam as in engine.models.transformer.Layer."""

    attn_norm: F32
    mixer: DeltaNetMixer
    ffn_norm: F32
    ffn: DenseFFN | MoEFFN
    post_attn_norm: F32 | None = None
    post_ffn_norm: F32 | None = None
    sinks: F32 | None = None
    wo_bias: F32 | None = None

    def input_names(self) -> tuple[tuple[str, ...], ...]:
        return (*self.mixer.input_names(), *self.ffn.input_names())

    def linears(self) -> list[Linear]:
        return [*self.mixer.linears(), *self.ffn.linears()]

    def fused(self) -> list[FusedLinear]:
        return [f for f in (self.mixer.inputs, self.ffn.gate_up) if f is not None]
