"""The numerics object a model is handed at load: how each of its ops is computed, chosen once.

`Float32Numerics` is the textbook reference (engine.ops.reference, exact RoPE angles, dense float32 weight copies,
one token's attention in one compiled float32 call). `GgmlNumerics` computes as llama.cpp's CPU backend does, bit for
bit: ggml-cpu's norms, RoPE tables, GLUs and attention products (engine.ops.ggml, engine.ops.attention_ggml), the
F16 cache by default, the compiled decode step (engine.runtime.decode_plan) and the kernel warm-up; with `flash`
(--flash-attn on) attention is ggml_flash_attn_ext's instead (engine.ops.attention_flash; one token in the compiled
step, engine.runtime.decode_flash). One
object per loaded model: it also holds what a pass leaves behind (the rounding for the cache type, the attention path
taken, the memoised RoPE tables, the decode plan).
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING, Callable

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.kernels import precompile
from engine.kernels.activations import KERNEL_LOCK
from engine.kernels.dispatch import NUMERICS, activation_values, compiled, quantize_activation
from engine.cache import CACHE_TYPES
from engine.errors import SettingError
from engine.models.rope import NO_SCALING, apply_rope, rope_angles
from engine.ops import (attention_decode, attention_flash, attention_flash_kv, attention_ggml, attention_prefill, delta_rule,
                        reference)
from engine.ops import ggml as ggml_ops
from engine.ops.attention_tiled import attention_tiled
from engine.quant.types import GGMLType
from engine.runtime import warmup
from engine.tensor import Linear, QTensor

if TYPE_CHECKING:
    from engine.models.decoder import DecoderModel
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
Rounding = Callable[[np.ndarray], np.ndarray]
Progress = Callable[[float], None]

FLASH_ATTN = ("off", "on")  # --flash-attn: ggml_flash_attn_ext's numbers (ggml numerics) or the mul_mat graph's
TILED_MIN_KEYS = 1024  # prefill chunks attending to this many keys or more take the tiled path
ROPE_BLOCK = 256  # positions per memoised RoPE table (ggml numerics)


def _to_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _through_q8_0(x: np.ndarray) -> np.ndarray:
    rows = np.ascontiguousarray(x, np.float32).reshape(-1, x.shape[-1])
    return activation_values(GGMLType.Q8_0, quantize_activation(GGMLType.Q8_0, rows), rows.shape[1]).reshape(x.shape)


def attention_rounding(cache_type: GGMLType) -> tuple[Rounding | None, Rounding | None]:
    """What ggml-cpu rounds in attention (without flash attention) for a K/V cache of this type.

    K*q reads q converted to K's vec_dot_type (F16 for an F16 cache, Q8_0 for Q8_0/Q4_0); V*softmax reads the
    weights converted to V's (F16). A quantized V cache needs flash attention in llama.cpp: its weights stay f32.
    """
    if cache_type == GGMLType.F16:
        return _to_f16, _to_f16
    if cache_type in (GGMLType.Q8_0, GGMLType.Q4_0):
        return _through_q8_0, None
    return None, None


class Float32Numerics:
    """The textbook maths in float32: the reference every other numerics is measured against."""

    name = "float32"
    cache_type = "F32"
    exact = False  # ggml-cpu's bits (the recurrent layers' ops take it as an argument)
    flash = False  # attention as ggml_flash_attn_ext computes it (GgmlNumerics with --flash-attn on)
    tiled_min_keys = TILED_MIN_KEYS

    def __init__(self) -> None:
        self.attention_path = "plain"
        self.rounding: tuple[Rounding | None, Rounding | None] = (None, None)  # (q, softmax weights)

    def begin(self, model: DecoderModel, cache: KVCache) -> None:
        """A pass over this cache starts (nothing to round in float32)."""
        self.rounding = (None, None)

    def step(self, model: DecoderModel, x: F32, cache: KVCache, start: int, recorder: Recorder | None) -> F32 | None:
        """Logits of one token in a compiled step, or None: the graph runs it op by op."""
        return None

    def embed_rows(self, model: DecoderModel, table: QTensor, ids: npt.NDArray[np.int64]) -> F32:
        return table.rows(ids)

    def norm(self, x: F32, weight: F32, eps: float) -> F32:
        return reference.rms_norm(x, weight, eps)

    def glu(self, kind: str, gate: F32, up: F32) -> F32:
        if kind == "swiglu_oai":
            return reference.swiglu_oai(gate, up)
        act = reference.gelu_tanh if kind == "geglu" else reference.silu
        return act(gate) * up

    def softmax(self, x: F32) -> F32:
        return reference.softmax(x)

    def silu(self, x: F32) -> F32:
        return reference.silu(x)

    def sigmoid(self, x: F32) -> F32:
        return delta_rule.sigmoid(x, self.exact)

    def recurrent(self) -> ModuleType:
        """The DeltaNet layers' ops (engine.ops.delta_rule), called with `exact` = this numerics' `exact`."""
        return delta_rule

    def rope_tables(self, model: DecoderModel, pos: np.ndarray, base: float, freqs: np.ndarray) -> tuple[F32, F32]:
        """cos and sin (T, rope_dim/2) from exact float64 angles (`freqs` already scaled as rope.rope_freqs does)."""
        return rope_angles(pos, freqs, model.rope_scaling.mscale())

    def rotate(self, x: F32, cos: F32, sin: F32, mode: str) -> F32:
        """RoPE on x (H, T, d) in the architecture's pair layout."""
        return apply_rope(x, cos, sin, mode)

    def decode_attention(
        self, cache: KVCache, layer: int, q: F32, k: F32, v: F32, pos: int, cos: F32, sin: F32, neox: bool,
        q_scale: float, scale: float, window: int | None,
    ) -> tuple[F32, F32] | None:
        """One token's RoPE, cache write and attention in one compiled call (engine.ops.attention_decode).

        q (Hq, d), k/v (Hkv, d) before RoPE; returns (rotated q (Hq, 1, d), output (Hq, 1, d)), or None where the
        NumPy path must run (no numba, quantized cache rows).
        """
        rows = cache.rows(layer) if attention_decode.available() else None
        if rows is None:
            return None
        round_q, round_w = self.rounding
        self.attention_path = "plain"
        q_rot, out = attention_decode.attend_one(q, k, v, rows[0], rows[1], pos, cos, sin, neox, q_scale, scale, window,
                                                 round_q is not None, round_w is not None)
        return q_rot[:, None, :], out[:, None, :]

    def attend(
        self, q: F32, cache: KVCache, layer: int, end: int, pos: np.ndarray, scale: float, window: int | None,
        masks: dict, softcap: float | None, sinks: F32 | None = None,
    ) -> F32:
        """Attention of one layer's queries q (Hq, T, d) over the cache's keys [0, end) (written already): the plain
        path for short contexts and single tokens, tiled for long prefills, with the rounding set by `begin`."""
        keys, values = cache.keys(layer, end), cache.values(layer, end)
        n_keys = keys.shape[1]
        round_q, round_w = self.rounding
        if round_q is not None:
            q = round_q(q)
        if q.shape[1] > 1 and n_keys >= self.tiled_min_keys and softcap is None and sinks is None:
            self.attention_path = "tiled"
            return attention_tiled(q, keys, values, pos, scale, window)
        self.attention_path = "plain"
        if q.shape[1] == 1 and (window is None or n_keys <= window):
            out, _ = reference.attention(q, keys, values, None, scale, round_w, softcap, sinks)  # one token sees every key
            return out
        if window not in masks:
            masks[window] = reference.causal_mask(pos, n_keys, window)
        out, _ = reference.attention(q, keys, values, masks[window], scale, round_w, softcap, sinks)
        return out

    def warm(self, model: DecoderModel, progress: Progress | None) -> None:
        """The dense weight copies, stacked for fused matrices, within the dense budget."""
        warmup.dequantize_all(model, progress)


class GgmlNumerics(Float32Numerics):
    """llama.cpp's CPU numerics: products on the blocks, 8-bit activations, an F16 cache, ggml-cpu's elementwise bits."""

    name = "ggml"
    cache_type = "F16"
    exact = True

    def __init__(self, flash: bool = False, flash_threads: int | None = None) -> None:
        super().__init__()
        self.flash = flash
        # llama.cpp's thread count: one token over 512 cells or more takes ggml's split-KV path, one chunk per thread
        self.flash_threads = flash_threads or os.cpu_count() or 1
        self._rope_memo: dict[tuple[float, int, int], tuple[F32, F32]] = {}
        self.decode_plan = None  # engine.runtime.decode_plan.DecodePlan, built at the first compiled step

    def begin(self, model: DecoderModel, cache: KVCache) -> None:
        self.rounding = attention_rounding(cache.qtype)
        if self.flash and cache.qtype in attention_flash_kv.TYPES and not cache.length:
            cache.rotated = True  # llama.cpp rotates q, k and v around a quantized cache (engine.quant.hadamard)

    def step(self, model: DecoderModel, x: F32, cache: KVCache, start: int, recorder: Recorder | None) -> F32 | None:
        """The compiled decode step (eight calls per block; a hybrid's recurrent blocks too) where the kernels and the
        cache allow it."""
        if (not compiled() or getattr(model, "ablated_heads", None)
                or getattr(model, "ablated_blocks", None) or getattr(model, "hooks", None)):
            return None  # ablations, hooks (engine.intervene): op by op; LoRA, control vectors, flash attention: the plan
        if not precompile.late_ready():
            return None  # the step's kernels compile in the background (engine.kernels.precompile): op by op
        from engine.runtime.decode_plan import plan_for  # noqa: PLC0415 - compiled kernels only

        plan = plan_for(model, self)
        if not plan.fits(cache, start):
            return None
        self.attention_path = "flash" if self.flash else "plain"
        return plan.step(x, cache, start, recorder)

    def embed_rows(self, model: DecoderModel, table: QTensor, ids: npt.NDArray[np.int64]) -> F32:
        """With tied embeddings, rows of the output head's repacked copy (the file's pages of a table the head
        repacked are released, and a look-up maps a whole folio)."""
        out = getattr(model, "output", None)
        if isinstance(out, Linear) and out.weight.name == table.name:
            product = out.product()
            if product.planar or product.path in ("q8_0_x16", "q8_0_rows"):
                return product.rows(ids)
        return table.rows(ids)

    def norm(self, x: F32, weight: F32, eps: float) -> F32:
        return ggml_ops.rms_norm(x, weight, eps)

    def glu(self, kind: str, gate: F32, up: F32) -> F32:
        if kind == "swiglu_oai":
            return ggml_ops.swiglu_oai(gate, up)
        return ggml_ops.geglu(gate, up) if kind == "geglu" else ggml_ops.swiglu(gate, up)

    def softmax(self, x: F32) -> F32:
        """ggml_soft_max over the last axis (the router's probabilities)."""
        return ggml_ops.soft_max(x)

    def silu(self, x: F32) -> F32:
        return ggml_ops.silu_rows(x)

    def rope_tables(self, model: DecoderModel, pos: np.ndarray, base: float, freqs: np.ndarray) -> tuple[F32, F32]:
        """ggml's theta recurrence and libm, from tables memoised per block of positions."""
        pos = np.asarray(pos, np.int64)
        if not (pos.size and pos.min() >= 0):
            return self._ggml_rope(model, pos, base)
        lo, hi = pos.min() // ROPE_BLOCK, pos.max() // ROPE_BLOCK
        blocks = [self._rope_block(model, base, b) for b in range(lo, hi + 1)]
        cos = np.concatenate([c for c, _ in blocks]) if len(blocks) > 1 else blocks[0][0]
        sin = np.concatenate([s for _, s in blocks]) if len(blocks) > 1 else blocks[0][1]
        return cos[pos - lo * ROPE_BLOCK], sin[pos - lo * ROPE_BLOCK]

    def rope_row(self, model: DecoderModel, base: float, pos: int) -> tuple[F32, F32]:
        """cos and sin (rope_dim/2,) of one position (contiguous rows of the memoised table)."""
        cos, sin = self._rope_block(model, base, pos // ROPE_BLOCK)
        return cos[pos % ROPE_BLOCK], sin[pos % ROPE_BLOCK]

    def _rope_block(self, model: DecoderModel, base: float, block: int) -> tuple[F32, F32]:
        """ggml's RoPE cache for positions [block * ROPE_BLOCK, +ROPE_BLOCK), computed once (each position's row
        depends on that position alone, so a row is the same whichever batch computed it); keyed by the scaling
        too (Phi-3 switches between its long and short factors with the context size)."""
        key = (float(base), block, id(model.rope_scaling))
        got = self._rope_memo.get(key)
        if got is None:
            got = self._rope_memo[key] = self._ggml_rope(model, np.arange(block * ROPE_BLOCK, (block + 1) * ROPE_BLOCK), base)
        return got

    @staticmethod
    def _ggml_rope(model: DecoderModel, pos: np.ndarray, base: float) -> tuple[F32, F32]:
        """ggml_rope_cache_init for these positions with the model's scaling (ggml_rope_ext's arguments)."""
        sc, n = model.rope_scaling, model.args.rope_dim
        if sc is NO_SCALING:
            return ggml_ops.rope_cache(pos, n, base)
        ramp = sc.ramp(n, base) if sc.ext_factor != 0.0 else None
        return ggml_ops.rope_cache(pos, n, base, sc.freq_scale, sc.factors, sc.mscale(), ramp)

    def rotate(self, x: F32, cos: F32, sin: F32, mode: str) -> F32:
        return ggml_ops.rope(x, cos, sin, mode)

    def decode_attention(self, *args: object) -> None:
        """ggml numerics run one token through the compiled decode step or op by op, never the float32 call."""
        return None

    def attend(
        self, q: F32, cache: KVCache, layer: int, end: int, pos: np.ndarray, scale: float, window: int | None,
        masks: dict, softcap: float | None, sinks: F32 | None = None,
    ) -> F32:
        """With an F32/F16 cache: llama.cpp's own products, softmax and padding (engine.ops.attention_ggml, bit for
        bit; a prompt in one compiled call where it can). Quantized cache rows: the reference path with ggml's
        rounding."""
        if self.flash:
            return self._flash(q, cache, layer, end, pos, scale, window, masks, softcap, sinks)
        stored = cache.stored(layer, end)
        if stored is None:
            return super().attend(q, cache, layer, end, pos, scale, window, masks, softcap, sinks)
        self.attention_path = "plain"
        if window not in masks:
            masks[window] = reference.causal_mask(pos, end, window)
        n_kv = attention_ggml.kv_length(end, cache.n_ctx)
        rows = cache.rows(layer)
        if (stored[0].dtype == np.float16 and attention_prefill.takes(q.shape[1], q.shape[2], n_kv) and compiled()
                and precompile.late_ready()):  # else the NumPy path: the same bits, while the kernel compiles
            with KERNEL_LOCK:  # tinyBLAS products and the softmax in one compiled call, the same bits
                return attention_prefill.attend_f16(q, rows[0], rows[1], end, masks[window], scale, n_kv, softcap, sinks)
        out, _ = attention_ggml.attention(q, stored[0], stored[1], masks[window], scale, n_kv=n_kv, softcap=softcap,
                                          sinks=sinks)
        return out

    def _flash(
        self, q: F32, cache: KVCache, layer: int, end: int, pos: np.ndarray, scale: float, window: int | None,
        masks: dict, softcap: float | None, sinks: F32 | None,
    ) -> F32:
        """ggml_flash_attn_ext over the F16 cache (engine.ops.attention_flash), or its one-row kernel over a Q8_0 /
        Q4_0 cache (engine.ops.attention_flash_kv), one compiled call."""
        quantized = cache.qtype in attention_flash_kv.TYPES
        if cache.qtype != GGMLType.F16 and not quantized:
            raise SettingError(f"flash attention numerics need an F16, Q8_0 or Q4_0 KV cache, not {cache.qtype.name}")
        self.attention_path = "flash"
        if window not in masks:
            masks[window] = reference.causal_mask(pos, end, window)
        if quantized:
            k_rows, v_rows = cache.blocks(layer)  # the kernels take KERNEL_LOCK themselves
            return attention_flash_kv.flash_attention_quant(q, k_rows, v_rows, cache.qtype, end, masks[window], scale,
                                                            softcap, sinks, rotated=cache.rotated)
        k_bits, v_bits = cache.rows(layer)
        n_kv = attention_ggml.kv_length(end, cache.n_ctx)
        with KERNEL_LOCK:
            return attention_flash.flash_attention(q, k_bits, v_bits, end, masks[window], scale, n_kv,
                                                   self.flash_threads, softcap, sinks)

    def warm(self, model: DecoderModel, progress: Progress | None) -> None:
        """Compile the CPU kernels (or load them from numba's cache) and build the products' copies."""
        warmup.warm(model, progress)


def flash_setting(value: str | bool, numerics: str) -> bool:
    """--flash-attn's value as a flag: 'on' or 'off' (or a bool); SettingError for anything else, or for 'on' with
    numerics other than ggml (float32 is the textbook reference: no kernel's order to follow)."""
    if isinstance(value, bool):
        on = value
    elif value in FLASH_ATTN:
        on = value == "on"
    else:
        raise SettingError(f"--flash-attn {value!r} is not one of {', '.join(FLASH_ATTN)}")
    if on and numerics != "ggml":
        raise SettingError(f"--flash-attn on follows ggml-cpu's flash attention kernels: it needs --numerics ggml, "
                           f"not {numerics}")
    if on and not attention_flash.available():
        raise SettingError("--flash-attn on needs numba (the flash attention kernels are compiled)")
    return on


def cache_setting(value: str | None, flash: bool) -> str | None:
    """--cache-type's value as a cache type name (None: the numerics' default); SettingError for one the cache does not
    store, or for F32 with flash attention (the flash kernels read F16, Q8_0 or Q4_0 rows)."""
    if value is None:
        return None
    name = str(value).upper()
    if name not in CACHE_TYPES:
        raise SettingError(f"--cache-type {value!r} is not one of {', '.join(CACHE_TYPES)}")
    if flash and name == "F32":
        raise SettingError("--flash-attn on reads an F16, Q8_0 or Q4_0 KV cache, not F32 (llama.cpp casts F32 to F16)")
    return name


def numerics_for(name: str, flash: bool = False) -> Float32Numerics:
    """A fresh numerics object for one model: 'ggml' (with flash attention or not) or 'float32'."""
    if name not in NUMERICS:
        raise ValueError(f"numerics {name!r} is not one of {', '.join(NUMERICS)}")
    return GgmlNumerics(flash) if name == "ggml" else Float32Numerics()
