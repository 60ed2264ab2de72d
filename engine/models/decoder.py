"""DecoderModel: what every architecture shares: weights from the GGUF, the KV cache, the forward contract."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.errors import ModelFormatError
from engine.gguf import GGUFFile
from engine.kernels.dispatch import activation_values, compiled, quantize_activation
from engine.kernels.activations import KERNEL_LOCK
from engine.models import decode, ggml_attention, ggml_ops, ggml_prefill, warmup
from engine.models.attention_tiled import attention_tiled
from engine.models.base import BaseArgs, LayerAttentionSpec, attention, causal_mask, rms_norm
from engine.models.rope import NO_SCALING, RopeScaling, apply_rope, rope_angles
from engine.quant.types import GGMLType
from engine.tensor import DenseBudget, FusedLinear, Linear, QTensor

if TYPE_CHECKING:  # the recorder is passed in; models never build one
    from engine.observe.recorder import Recorder

log = logging.getLogger(__name__)


class Weights:
    """Reads named tensors from a GGUF file, checking each against the shape the architecture expects."""

    def __init__(self, gguf: GGUFFile, budget: DenseBudget, numerics: str = "float32"):
        self.gguf = gguf
        self.budget = budget
        self.numerics = numerics
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.gguf.tensors

    def qtensor(self, name: str, shape: tuple[int, ...]) -> QTensor:
        """The tensor `name` with ggml shape `shape` (row length first), as raw blocks."""
        info = self.gguf.tensors.get(name)
        if info is None:
            raise ModelFormatError(name, "required tensor is missing from the file")
        got = tuple(info.shape) + (1,) * (len(shape) - len(info.shape))
        want = tuple(shape) + (1,) * (len(info.shape) - len(shape))
        if got != want:
            exp = "x".join(map(str, shape))
            raise ModelFormatError(name, f"has wrong shape; expected {exp}, got {'x'.join(map(str, info.shape))}")
        self.used.add(name)
        return QTensor(name, GGMLType(info.qtype), tuple(shape), self.gguf.rows(name))

    def linear(self, name: str, n_in: int, n_out: int) -> Linear:
        return Linear(self.qtensor(name, (n_in, n_out)), self.budget, numerics=self.numerics)

    def vector(self, name: str, n: int) -> npt.NDArray[np.float32]:
        """A 1-D tensor (norm weights) as float32."""
        t = self.qtensor(name, (n,))
        return t.dequantize().reshape(n)

    def unused(self) -> list[str]:
        return [n for n in self.gguf.tensors if n not in self.used]


@dataclass
class Block:
    """The weights of a pre-norm block every architecture has: q/k/v/o attention and a gated FFN.

    q/k/v and gate/up are also held fused (one product each); architectures subclass it to add their norms.
    """

    attn_norm: npt.NDArray[np.float32]
    wq: Linear
    wk: Linear
    wv: Linear
    wo: Linear
    ffn_norm: npt.NDArray[np.float32]
    w_gate: Linear
    w_up: Linear
    w_down: Linear

    def __post_init__(self) -> None:
        self.qkv = FusedLinear([self.wq, self.wk, self.wv])
        self.gate_up = FusedLinear([self.w_gate, self.w_up])

    @staticmethod
    def fields(w: Weights, i: int, a: BaseArgs) -> dict[str, Any]:
        """Block i's common tensors under llama.cpp's names, shape-checked."""
        q_dim, kv_dim = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        return {
            "attn_norm": w.vector(f"blk.{i}.attn_norm.weight", a.dim),
            "wq": w.linear(f"blk.{i}.attn_q.weight", a.dim, q_dim),
            "wk": w.linear(f"blk.{i}.attn_k.weight", a.dim, kv_dim),
            "wv": w.linear(f"blk.{i}.attn_v.weight", a.dim, kv_dim),
            "wo": w.linear(f"blk.{i}.attn_output.weight", q_dim, a.dim),
            "ffn_norm": w.vector(f"blk.{i}.ffn_norm.weight", a.dim),
            "w_gate": w.linear(f"blk.{i}.ffn_gate.weight", a.dim, a.hidden_dim),
            "w_up": w.linear(f"blk.{i}.ffn_up.weight", a.dim, a.hidden_dim),
            "w_down": w.linear(f"blk.{i}.ffn_down.weight", a.hidden_dim, a.dim),
        }


Rounding = Callable[[np.ndarray], np.ndarray]


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


TILED_MIN_KEYS = 1024  # prefill chunks attending to this many keys or more take the tiled path


class DecoderModel:
    """A decoder-only transformer. Subclasses set `Args`, build layers in `__init__` and implement `forward`."""

    arch_name: ClassVar[str] = ""
    rope_mode: ClassVar[str] = "norm"
    args: BaseArgs
    attention_path: str = "plain"  # which path the last forward took: 'plain' or 'tiled'
    _rounding: tuple[Rounding | None, Rounding | None] = (None, None)  # (q, softmax weights) as ggml rounds them
    tiled_min_keys: int = TILED_MIN_KEYS
    glu: ClassVar[str] = "swiglu"  # the gated activation of the FFN: 'swiglu' or 'geglu'
    query_scaled: ClassVar[bool] = False  # True: q is scaled by the spec's scale after RoPE and attention uses 1
    ROPE_BLOCK: ClassVar[int] = 256  # positions per memoised RoPE table (ggml numerics)
    rope_scaling: RopeScaling = NO_SCALING  # factors / linear / YaRN, set by architectures whose metadata asks
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap) before the softmax

    def __init__(self, args: BaseArgs, weights: Weights):
        self.args = args
        self.weights = weights

    @classmethod
    def args_from_metadata(cls, metadata: dict[str, Any]) -> BaseArgs:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def numerics(self) -> str:
        """'ggml' (products on the blocks, 8-bit activations, F16 cache) or 'float32' (the textbook reference)."""
        return self.weights.numerics

    def new_cache(self, n_ctx: int | None = None, cache_type: str | None = None) -> KVCache:
        """An empty KV cache for up to n_ctx positions (default: the trained context) of F32/F16/Q8_0/Q4_0 rows.

        The default type is F16 with ggml numerics (llama.cpp's default) and F32 with float32 numerics.
        """
        a = self.args
        kind = cache_type or ("F16" if self.numerics == "ggml" else "F32")
        return KVCache(a.n_layers, a.n_kv_heads, a.head_dim, n_ctx or a.n_ctx, kind)

    def forward(
        self,
        tokens: npt.ArrayLike,
        cache: KVCache,
        recorder: Recorder | None = None,
        all_logits: bool = False,
    ) -> npt.NDArray[np.float32]:
        """Run tokens at positions [cache.length, +T); logits (T, n_vocab) or (1, n_vocab) for the last one.

        Writes K/V for the new positions into the cache but does not commit them.
        """
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self.check_tokens(ids)
        t, start = ids.size, cache.length
        cache.reserve(start + t)
        if recorder is not None:
            recorder.begin(start, t)
        self._rounding = attention_rounding(cache.qtype) if self.numerics == "ggml" else (None, None)
        self.select_rope(cache.n_ctx)
        x = self.embed(ids)
        if t == 1 and self.numerics == "ggml" and compiled():
            from engine.models.ggml_decode import plan_for  # noqa: PLC0415 - compiled kernels only

            plan = plan_for(self)
            if plan.fits(cache, start):
                self.attention_path = "plain"
                return plan.step(x, cache, start, recorder)
        x = self.run_layers(x, start, cache, recorder, range(self.args.n_layers))
        return self.head(x, all_logits)

    def select_rope(self, n_ctx: int) -> None:
        """Choose RoPE scaling that depends on the context size (Phi-3's long/short factors); nothing by default."""

    def embed_rows(self, tok_embd: QTensor, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """Embedding rows; with tied embeddings in ggml numerics, read from the output head's repacked copy
        (the file's pages of a table the head repacked are released, and a look-up maps a whole folio)."""
        out = getattr(self, "output", None)
        if self.numerics == "ggml" and isinstance(out, Linear) and out.weight.name == tok_embd.name:
            product = out.product()
            if product.planar:
                return product.rows(ids)
        return tok_embd.rows(ids)

    def embed(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:  # pragma: no cover - abstract
        """The input embeddings of token ids, (T, dim)."""
        raise NotImplementedError

    def run_layers(
        self, x: npt.NDArray[np.float32], start: int, cache: KVCache, recorder: Recorder | None, which: range
    ) -> npt.NDArray[np.float32]:  # pragma: no cover - abstract
        """The residual stream (T, dim) at positions [start, +T) after the layers `which` (the GPU runner runs a prefix here)."""
        raise NotImplementedError

    def head(self, x: npt.NDArray[np.float32], all_logits: bool) -> npt.NDArray[np.float32]:  # pragma: no cover - abstract
        """Final norm and output matrix: logits for every row, or for the last one."""
        raise NotImplementedError

    def attend(
        self, q: np.ndarray, cache: KVCache, layer: int, end: int, pos: np.ndarray, scale: float,
        window: int | None, masks: dict, softcap: float | None = None,
    ) -> np.ndarray:
        """Attention of one layer's queries q (Hq, T, d) over the cache's keys [0, end) (written already).

        ggml numerics with an F32/F16 cache: llama.cpp's own products, softmax and padding (ggml_attention, bit for
        bit). Otherwise: the plain path for short contexts and single tokens, tiled for long prefills, with the
        rounding ggml applies for the cache type where the numerics ask for it.
        """
        stored = cache.stored(layer, end) if self.numerics == "ggml" else None
        if stored is not None:
            self.attention_path = "plain"
            if window not in masks:
                masks[window] = causal_mask(pos, end, window)
            n_kv = ggml_attention.kv_length(end, cache.n_ctx)
            rows = cache.rows(layer)
            if stored[0].dtype == np.float16 and ggml_prefill.takes(q.shape[1], q.shape[2], n_kv) and compiled():
                with KERNEL_LOCK:  # tinyBLAS products and the softmax in one compiled call, the same bits
                    return ggml_prefill.attend_f16(q, rows[0], rows[1], end, masks[window], scale, n_kv, softcap)
            out, _ = ggml_attention.attention(q, stored[0], stored[1], masks[window], scale, n_kv=n_kv, softcap=softcap)
            return out
        keys, values = cache.keys(layer, end), cache.values(layer, end)
        n_keys = keys.shape[1]
        round_q, round_w = self._rounding
        if round_q is not None:
            q = round_q(q)
        if q.shape[1] > 1 and n_keys >= self.tiled_min_keys and softcap is None:
            self.attention_path = "tiled"
            return attention_tiled(q, keys, values, pos, scale, window)
        self.attention_path = "plain"
        if q.shape[1] == 1 and (window is None or n_keys <= window):
            out, _ = attention(q, keys, values, None, scale, round_w, softcap)  # one new token sees every cached key
            return out
        if window not in masks:
            masks[window] = causal_mask(pos, n_keys, window)
        out, _ = attention(q, keys, values, masks[window], scale, round_w, softcap)
        return out

    # ---- the elementwise maths, as ggml computes it (ggml numerics) or the textbook way (float32)

    def norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """RMSNorm over the last axis times the weight."""
        if self.numerics == "ggml":
            return ggml_ops.rms_norm(x, weight, self.args.norm_eps)
        return rms_norm(x, weight, self.args.norm_eps)

    def rope_tables(self, pos: np.ndarray, base: float, freqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin (T, rope_dim/2) of the positions: ggml's theta recurrence and libm, or exact float64 angles
        (`freqs` already scaled as rope.rope_freqs does; the model's rope_scaling gives the magnitude)."""
        if self.numerics == "ggml":
            pos = np.asarray(pos, np.int64)
            if pos.size and pos.min() >= 0:
                blocks = [self._rope_block(base, b) for b in range(pos.min() // self.ROPE_BLOCK, pos.max() // self.ROPE_BLOCK + 1)]
                first = (pos.min() // self.ROPE_BLOCK) * self.ROPE_BLOCK
                cos = np.concatenate([c for c, _ in blocks]) if len(blocks) > 1 else blocks[0][0]
                sin = np.concatenate([s for _, s in blocks]) if len(blocks) > 1 else blocks[0][1]
                return cos[pos - first], sin[pos - first]
            return self._ggml_rope(pos, base)
        return rope_angles(pos, freqs, self.rope_scaling.mscale())

    def _ggml_rope(self, pos: np.ndarray, base: float) -> tuple[np.ndarray, np.ndarray]:
        """ggml_rope_cache_init for these positions with the model's scaling (ggml_rope_ext's arguments)."""
        sc, n = self.rope_scaling, self.args.rope_dim
        if sc is NO_SCALING:
            return ggml_ops.rope_cache(pos, n, base)
        ramp = sc.ramp(n, base) if sc.ext_factor != 0.0 else None
        return ggml_ops.rope_cache(pos, n, base, sc.freq_scale, sc.factors, sc.mscale(), ramp)

    def _rope_block(self, base: float, block: int) -> tuple[np.ndarray, np.ndarray]:
        """ggml's RoPE cache for positions [block * ROPE_BLOCK, +ROPE_BLOCK), computed once (each position's row
        depends on that position alone, so a row is the same whichever batch computed it); keyed by the scaling
        too (Phi-3 switches between its long and short factors with the context size)."""
        memo = self.__dict__.setdefault("_rope_memo", {})
        key = (float(base), block, id(self.rope_scaling))
        got = memo.get(key)
        if got is None:
            n = self.ROPE_BLOCK
            got = memo[key] = self._ggml_rope(np.arange(block * n, (block + 1) * n), base)
        return got

    def rope_row(self, base: float, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin (rope_dim/2,) of one position, ggml numerics (contiguous rows of the memoised table)."""
        cos, sin = self._rope_block(base, pos // self.ROPE_BLOCK)
        return cos[pos % self.ROPE_BLOCK], sin[pos % self.ROPE_BLOCK]

    def attention_spec(self, layer: int) -> LayerAttentionSpec:
        """Layer `layer`'s attention: scale, sliding window, KV group, RoPE base."""
        specs = getattr(self, "specs", None)
        return specs[layer] if specs is not None else self.spec

    def rotate(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """RoPE on x (H, T, d) in the architecture's mode."""
        if self.numerics == "ggml":
            return ggml_ops.rope(x, cos, sin, self.rope_mode)
        return apply_rope(x, cos, sin, self.rope_mode)

    def decode_attention(
        self, layer: int, q: np.ndarray, k: np.ndarray, v: np.ndarray, cache: KVCache, pos: int, cos: np.ndarray,
        sin: np.ndarray, q_scale: float, scale: float, window: int | None,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """One token's RoPE, cache write and attention in one compiled call (engine/models/decode.py).

        q (Hq, d), k/v (Hkv, d) before RoPE; returns (rotated q (Hq, 1, d), output (Hq, 1, d)), or None where the
        NumPy path must run (no numba, quantized cache rows).
        """
        rows = cache.rows(layer) if decode.available() and self.numerics != "ggml" else None
        if rows is None:
            return None
        round_q, round_w = self._rounding
        self.attention_path = "plain"
        q_rot, out = decode.attend_one(q, k, v, rows[0], rows[1], pos, cos, sin, self.rope_mode == "neox", q_scale,
                                       scale, window, round_q is not None, round_w is not None)
        return q_rot[:, None, :], out[:, None, :]

    def linears(self) -> dict[str, Linear]:
        """Every quantized matrix by tensor name (for the Quantization lens and requantizing): each layer's, then the output."""
        out: dict[str, Linear] = {}
        for layer in getattr(self, "layers", []):
            for value in vars(layer).values():
                if isinstance(value, Linear):
                    out[value.weight.name] = value
        output = getattr(self, "output", None)
        if isinstance(output, Linear):
            out[output.weight.name] = output
        return out

    def warm(self, progress: Callable[[float], None] | None = None) -> None:
        """Get ready for the first token: compile the CPU kernels (ggml numerics) or build the float32 weight
        copies, stacked for fused matrices (float32 numerics); see engine.models.warmup."""
        warmup.warm(self, progress)

    def weight_bytes(self) -> int:
        return sum(info.nbytes for info in self.weights.gguf.tensors.values())

    def check_tokens(self, ids: np.ndarray) -> None:
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.args.n_vocab):
            bad = int(ids[(ids < 0) | (ids >= self.args.n_vocab)][0])
            raise ModelFormatError("token id", f"out of range for a vocabulary of {self.args.n_vocab}", bad)
