"""What the compiled decode step (engine.runtime.decode_plan) adds for the 2026 hybrids: a recurrent block's mixer
and gated attention's output gate, each between the plan's bound products.

- `MixerStep`: a gated DeltaNet layer (engine.models.deltanet) after its input products. The products' rows are
  split as the mixer reads them (`DeltaNetMixer.split`: Qwen3.5's four products as they are, Qwen3-Next's fused
  ones reordered), then engine.ops.delta_rule's one compiled call for the token (gates, convolution with the carried
  rows, SiLU, L2 norms, the delta rule, the gated norm) writes y, which is quantized for `ssm_out`. The new
  convolution rows and state are fresh arrays handed to the cache (engine.hybrid_cache keeps the old ones as
  snapshots); the recorder gets what the op-by-op layer gives it.
- `gate_quant`: Qwen3.5's gated attention (qwen35.cpp): the attention output times sigmoid(gate), gate being the
  second half of each head's q row, then quantized for `attn_output`; ggml_sigmoid is 1 / (1 + expf(-x)) with
  libm's expf and ggml_mul one product, as engine.ops.delta_rule.sigmoid computes them op by op.

Both give the same bits as the graph run op by op (tests hold the compiled step to it and to llama.cpp).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.hybrid_cache import HybridCache, RecurrentState
from engine.kernels import isa
from engine.kernels.activations import HAVE_NUMBA
from engine.models.deltanet import DeltaNetMixer
from engine.ops import delta_rule

if TYPE_CHECKING:
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
U8 = npt.NDArray[np.uint8]


class MixerStep:
    """One DeltaNet layer of a compiled step: `views` are its input products' outputs (1, n) in the mixer's order,
    y is quantized as `vdt` into `buf` (what ssm_out's bound product reads)."""

    def __init__(self, mixer: DeltaNetMixer, views: list[F32], vdt: int, buf: U8):
        d = mixer.dims
        self.mixer, self.views, self.vdt, self.buf = mixer, views, np.int64(vdt), buf
        self.x = np.empty(d.conv_dim, np.float32)  # the convolution's output, q and k normed in place
        self.gdb = np.empty((3, d.v_heads), np.float32)  # g, exp(g), beta per value head
        self.y = np.empty((1, d.value_dim), np.float32)
        self.eps = np.float32(mixer.eps)
        self.w8 = isa.lanes() == 8  # the build whose order the step follows (a change of it rebuilds the plan)

    def fits(self) -> bool:
        """Whether the token can take this path: no ablated value head (the op-by-op layer zeroes them)."""
        heads = self.mixer.ablated_heads
        return heads is None or not heads.size

    def run(self, cache: HybridCache, pos: int, recorder: Recorder | None) -> None:
        """The layer's token at `pos` after its products (the kernel lock held by the caller)."""
        m, d = self.mixer, self.mixer.dims
        qkv, z, b, alpha = m.split(self.views)
        state = cache.state(m.layer)
        conv, ssm = delta_rule.step_into(qkv, z, b, alpha, m.dt_bias, m.a, m.conv, m.norm, self.eps, state.conv,
                                         state.ssm, d.k_heads, m.key_map, self.x, self.gdb, self.y[0], self.w8)
        cache.put_state(m.layer, RecurrentState(conv, ssm), None)
        if recorder is not None:  # as the layer records op by op: copies, the scratch is the next token's
            got = delta_rule.step_inputs(self.x.copy(), self.gdb.copy(), d.k_heads, d.v_heads, d.state)
            recorder.record_recurrent(m.layer, pos, m.key_heads(got["q"]), m.key_heads(got["k"]), got["v"], got["g"],
                                      got["beta"])
            recorder.record_input(m.input_names()[1], self.y.copy())
        quantize_into(self.vdt, self.y, self.buf)  # (a compiled call: the bytes ssm_out's product reads)


if HAVE_NUMBA:
    from engine.kernels.activations import njit
    from engine.runtime.decode_step import quantize_into

    @njit(cache=True)
    def gate_quant(o, gate, vdt, out):  # pragma: no cover - compiled
        """o (1, n) *= sigmoid(gate (n,)) as ggml_sigmoid and ggml_mul compute them, then o quantized as vdt."""
        one = np.float32(1.0)
        for i in range(gate.shape[0]):
            o[0, i] = o[0, i] * (one / (one + np.exp(-gate[i])))
        quantize_into(vdt, o, out)
