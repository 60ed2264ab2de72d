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
from engine.models.attention_tiled import attention_tiled
from engine.models.base import BaseArgs, attention, causal_mask
from engine.quant.types import GGMLType
from engine.tensor import DenseBudget, FusedLinear, Linear, QTensor

if TYPE_CHECKING:  # the recorder is passed in; models never build one
    from engine.observe.recorder import Recorder

log = logging.getLogger(__name__)


class Weights:
    """Reads named tensors from a GGUF file, checking each against the shape the architecture expects."""

    def __init__(self, gguf: GGUFFile, budget: DenseBudget):
        self.gguf = gguf
        self.budget = budget
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
        return Linear(self.qtensor(name, (n_in, n_out)), self.budget)

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


TILED_MIN_KEYS = 1024  # prefill chunks attending to this many keys or more take the tiled path


class DecoderModel:
    """A decoder-only transformer. Subclasses set `Args`, build layers in `__init__` and implement `forward`."""

    arch_name: ClassVar[str] = ""
    rope_mode: ClassVar[str] = "norm"
    args: BaseArgs
    attention_path: str = "plain"  # which path the last forward took: 'plain' or 'tiled'
    tiled_min_keys: int = TILED_MIN_KEYS

    def __init__(self, args: BaseArgs, weights: Weights):
        self.args = args
        self.weights = weights

    @classmethod
    def args_from_metadata(cls, metadata: dict[str, Any]) -> BaseArgs:  # pragma: no cover - abstract
        raise NotImplementedError

    def new_cache(self, n_ctx: int | None = None, cache_type: str = "F32") -> KVCache:
        """An empty KV cache for up to n_ctx positions (default: the model's trained context) of F32/F16/Q8_0/Q4_0 rows."""
        a = self.args
        return KVCache(a.n_layers, a.n_kv_heads, a.head_dim, n_ctx or a.n_ctx, cache_type)

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
        x = self.embed(ids)
        x = self.run_layers(x, start, cache, recorder, range(self.args.n_layers))
        return self.head(x, all_logits)

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
        self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, pos: np.ndarray, scale: float,
        window: int | None, masks: dict,
    ) -> np.ndarray:
        """Attention for one layer: the plain path for short contexts and single tokens, tiled for long prefills."""
        n_keys = keys.shape[1]
        if q.shape[1] > 1 and n_keys >= self.tiled_min_keys:
            self.attention_path = "tiled"
            return attention_tiled(q, keys, values, pos, scale, window)
        self.attention_path = "plain"
        if q.shape[1] == 1 and (window is None or n_keys <= window):
            out, _ = attention(q, keys, values, None, scale)  # one new token sees every cached key
            return out
        if window not in masks:
            masks[window] = causal_mask(pos, n_keys, window)
        out, _ = attention(q, keys, values, masks[window], scale)
        return out

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
        """Build the float32 weight copies now (stacked for fused matrices) instead of on the first token."""
        fused = [f for layer in getattr(self, "layers", []) for f in vars(layer).values() if isinstance(f, FusedLinear)]
        linears = list(self.linears().values())
        total = max(1, len(fused) + len(linears))
        for i, f in enumerate(fused):
            if not f._fresh():
                f._build()
            if progress is not None and i % 8 == 0:
                progress(i / total)
        for j, lin in enumerate(linears):
            lin.dense()
            if progress is not None and j % 8 == 0:
                progress((len(fused) + j) / total)

    def weight_bytes(self) -> int:
        return sum(info.nbytes for info in self.weights.gguf.tensors.values())

    def check_tokens(self, ids: np.ndarray) -> None:
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.args.n_vocab):
            bad = int(ids[(ids < 0) | (ids >= self.args.n_vocab)][0])
            raise ModelFormatError("token id", f"out of range for a vocabulary of {self.args.n_vocab}", bad)
