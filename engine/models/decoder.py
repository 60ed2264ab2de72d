"""DecoderModel: the forward contract every architecture keeps, and the numerics object it is handed.

A model holds its weights and its architecture's switches; how each op is computed (the float32 reference or
ggml-cpu's exact bits, the compiled decode step, the warm-up) is the numerics object's business
(engine.runtime.numerics), chosen when the model is loaded and passed in. The model calls it and never branches on
which one it holds.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from engine.cache import KVCache
from engine.errors import ModelFormatError
from engine.models.args import BaseArgs, LayerAttentionSpec
from engine.models.rope import NO_SCALING, RopeScaling
from engine.models.weights import Weights
from engine.tensor import Linear, QTensor

if TYPE_CHECKING:  # the recorder is passed in; models never build one
    from engine.observe.recorder import Recorder

log = logging.getLogger(__name__)

F32 = npt.NDArray[np.float32]
Progress = Callable[[float], None]


class Numerics(Protocol):
    """How a model's ops are computed (engine.runtime.numerics implements it: 'float32' and 'ggml')."""

    name: str
    cache_type: str  # the KV cache rows by default
    attention_path: str  # which path the last attention took: 'plain' or 'tiled'

    def begin(self, model: DecoderModel, cache: KVCache) -> None: ...
    def step(self, model: DecoderModel, x: F32, cache: KVCache, start: int, recorder: Recorder | None) -> F32 | None: ...
    def embed_rows(self, model: DecoderModel, table: QTensor, ids: npt.NDArray[np.int64]) -> F32: ...
    def norm(self, x: F32, weight: F32, eps: float) -> F32: ...
    def glu(self, kind: str, gate: F32, up: F32) -> F32: ...
    def rope_tables(self, model: DecoderModel, pos: np.ndarray, base: float, freqs: np.ndarray) -> tuple[F32, F32]: ...
    def rotate(self, x: F32, cos: F32, sin: F32, mode: str) -> F32: ...
    def decode_attention(self, cache: KVCache, layer: int, q: F32, k: F32, v: F32, pos: int, cos: F32, sin: F32,
                         neox: bool, q_scale: float, scale: float, window: int | None) -> tuple[F32, F32] | None: ...
    def attend(self, q: F32, cache: KVCache, layer: int, end: int, pos: np.ndarray, scale: float, window: int | None,
               masks: dict, softcap: float | None) -> F32: ...
    def warm(self, model: DecoderModel, progress: Progress | None) -> None: ...


class DecoderModel:
    """A decoder-only transformer. Subclasses set `Args`, build layers in `__init__` and implement the graph."""

    arch_name: ClassVar[str] = ""
    rope_mode: ClassVar[str] = "norm"
    args: BaseArgs
    glu: ClassVar[str] = "swiglu"  # the gated activation of the FFN: 'swiglu' or 'geglu'
    query_scaled: ClassVar[bool] = False  # True: q is scaled by the spec's scale after RoPE and attention uses 1
    rope_scaling: RopeScaling = NO_SCALING  # factors / linear / YaRN, set by architectures whose metadata asks
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap) before the softmax
    swa_pattern: ClassVar[int] = 0  # with a sliding window, layer i slides when i % pattern < pattern - 1 (0: none)
    rope_base_swa: ClassVar[float | None] = None  # the sliding layers' RoPE base when the file does not say
    specs: list[LayerAttentionSpec]

    def __init__(self, args: BaseArgs, weights: Weights, ops: Numerics):
        self.args = args
        self.weights = weights
        self.ops = ops

    @classmethod
    def args_from_metadata(cls, metadata: dict[str, Any], n_vocab: int) -> BaseArgs:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def numerics(self) -> str:
        """'ggml' (products on the blocks, 8-bit activations, F16 cache) or 'float32' (the textbook reference)."""
        return self.ops.name

    @property
    def attention_path(self) -> str:
        """Which path the last forward's attention took: 'plain' or 'tiled'."""
        return self.ops.attention_path

    def new_cache(self, n_ctx: int | None = None, cache_type: str | None = None) -> KVCache:
        """An empty KV cache for up to n_ctx positions (default: the trained context) of F32/F16/Q8_0/Q4_0 rows.

        The default type is F16 with ggml numerics (llama.cpp's default) and F32 with float32 numerics.
        """
        a = self.args
        return KVCache(a.n_layers, a.n_kv_heads, a.head_dim, n_ctx or a.n_ctx, cache_type or self.ops.cache_type)

    def forward(
        self,
        tokens: npt.ArrayLike,
        cache: KVCache,
        recorder: Recorder | None = None,
        all_logits: bool = False,
    ) -> F32:
        """Run tokens at positions [cache.length, +T); logits (T, n_vocab) or (1, n_vocab) for the last one.

        Writes K/V for the new positions into the cache but does not commit them.
        """
        x, start = self._enter(tokens, cache, recorder)
        if x.shape[0] == 1:
            logits = self.ops.step(self, x, cache, start, recorder)  # the compiled decode step, where it runs
            if logits is not None:
                return logits
        x = self.run_layers(x, start, cache, recorder, range(self.args.n_layers))
        return self.head(x, all_logits)

    def forward_hidden(self, tokens: npt.ArrayLike, cache: KVCache, recorder: Recorder | None = None) -> F32:
        """forward's pass without the output head: the residual stream (T, dim) after the last layer, K/V written
        but not committed. head(rows of it, True) gives those rows of forward(..., all_logits=True) bit for bit (each
        row's norm and product is its own), so a caller can take a long vocabulary's logits a few rows at a time."""
        x, start = self._enter(tokens, cache, recorder)
        return self.run_layers(x, start, cache, recorder, range(self.args.n_layers))

    def _enter(self, tokens: npt.ArrayLike, cache: KVCache, recorder: Recorder | None) -> tuple[F32, int]:
        """Checked ids, the cache grown for them, the recorder and numerics ready: their embeddings and the start."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        self.check_tokens(ids)
        t, start = ids.size, cache.length
        cache.reserve(start + t)
        if recorder is not None:
            recorder.begin(start, t)
        self.begin(cache)
        return self.embed(ids), start

    def begin(self, cache: KVCache) -> None:
        """Get ready for a pass over this cache: the numerics' rounding for its type, RoPE for its size."""
        self.ops.begin(self, cache)
        self.select_rope(cache.n_ctx)

    def select_rope(self, n_ctx: int) -> None:
        """Choose RoPE scaling that depends on the context size (Phi-3's long/short factors); nothing by default."""

    def embed(self, ids: npt.NDArray[np.int64]) -> F32:  # pragma: no cover - abstract
        """The input embeddings of token ids, (T, dim)."""
        raise NotImplementedError

    def run_layers(
        self, x: F32, start: int, cache: KVCache, recorder: Recorder | None, which: range
    ) -> F32:  # pragma: no cover - abstract
        """The residual stream (T, dim) at positions [start, +T) after the layers `which` (the GPU runner runs a prefix here)."""
        raise NotImplementedError

    def head(self, x: F32, all_logits: bool) -> F32:  # pragma: no cover - abstract
        """Final norm and output matrix: logits for every row, or for the last one."""
        raise NotImplementedError

    def norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        """RMSNorm over the last axis times the weight, as the numerics compute it."""
        return self.ops.norm(x, weight, self.args.norm_eps)

    def attention_spec(self, layer: int) -> LayerAttentionSpec:
        """Layer `layer`'s attention: scale, sliding window, KV group, RoPE base."""
        return self.specs[layer]

    def linears(self) -> dict[str, Linear]:
        """Every quantized matrix by tensor name (for the Quantization lens and requantizing): each layer's, then the output."""
        out: dict[str, Linear] = {}
        for layer in getattr(self, "layers", []):
            for lin in layer.linears():
                out[lin.weight.name] = lin
        output = getattr(self, "output", None)
        if isinstance(output, Linear):
            out[output.weight.name] = output
        return out

    def warm(self, progress: Progress | None = None) -> None:
        """Get ready for the first token: compile the CPU kernels (ggml numerics) or build the float32 weight
        copies (float32 numerics); see engine.runtime.warmup."""
        self.ops.warm(self, progress)

    def weight_bytes(self) -> int:
        return sum(info.nbytes for info in self.weights.gguf.tensors.values())

    def check_tokens(self, ids: np.ndarray) -> None:
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= self.args.n_vocab):
            bad = int(ids[(ids < 0) | (ids >= self.args.n_vocab)][0])
            raise ModelFormatError("token id", f"out of range for a vocabulary of {self.args.n_vocab}", bad)
