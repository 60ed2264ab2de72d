"""What every architecture reads from its metadata: the shared hyper-parameters (`BaseArgs`), typed metadata access
with errors that name the key (`MetadataView`), and how a layer's attention is computed (`LayerAttentionSpec`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from engine.errors import ModelFormatError

MAX_LAYERS = 512
MAX_HEADS = 1024
MAX_CONTEXT = 1 << 24
MAX_EXPERTS = 512  # llama-hparams.h LLAMA_MAX_EXPERTS


@dataclass(frozen=True)
class LayerAttentionSpec:
    """How a layer's attention is computed: scale, sliding window (None = full), query heads per KV head."""

    scale: float
    window: int | None
    group: int
    rope_base: float
    softcap: float | None = None  # Gemma 2: raw scores -> cap * tanh(score / cap) before the scale and softmax
    sinks: tuple[float, ...] | None = None  # gpt-oss: one learned logit per query head in every softmax row


@dataclass
class BaseArgs:
    """Hyper-parameters every decoder shares; each architecture subclasses it and reads its own keys."""

    arch: str
    dim: int  # embedding_length
    hidden_dim: int  # feed_forward_length
    n_layers: int  # block_count
    n_heads: int  # attention.head_count
    n_kv_heads: int  # attention.head_count_kv
    head_dim: int  # attention.key_length, else dim // n_heads
    n_vocab: int
    n_ctx: int  # context_length the model was trained for
    norm_eps: float
    rope_base: float
    rope_dim: int  # rope.dimension_count, else head_dim

    def check(self) -> None:
        """Reject out-of-range hyper-parameters before anything is allocated (RELIABILITY case 18)."""
        a = self.arch
        _in_range(f"{a}.block_count", self.n_layers, 1, MAX_LAYERS)
        _in_range(f"{a}.attention.head_count", self.n_heads, 1, MAX_HEADS)
        _in_range(f"{a}.attention.head_count_kv", self.n_kv_heads, 1, self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ModelFormatError(f"{a}.attention.head_count_kv", f"does not divide head_count {self.n_heads}", self.n_kv_heads)
        _in_range(f"{a}.embedding_length", self.dim, 1, 1 << 16)
        _in_range(f"{a}.feed_forward_length", self.hidden_dim, 1, 1 << 18)
        _in_range(f"{a}.attention.key_length", self.head_dim, 2, 1 << 12)
        if self.head_dim % 2:
            raise ModelFormatError(f"{a}.attention.key_length", "must be even for RoPE", self.head_dim)
        _in_range(f"{a}.rope.dimension_count", self.rope_dim, 2, self.head_dim)
        _in_range(f"{a}.context_length", self.n_ctx, 1, MAX_CONTEXT)
        _in_range("vocab size", self.n_vocab, 1, 1 << 24)
        if not (0.0 < self.norm_eps < 1.0):
            raise ModelFormatError(f"{a}.attention.layer_norm_rms_epsilon", "must be in (0, 1)", self.norm_eps)
        if not (1.0 <= self.rope_base < 1e12):
            raise ModelFormatError(f"{a}.rope.freq_base", "must be in [1, 1e12)", self.rope_base)

    @staticmethod
    def common_fields(m: MetadataView, n_vocab: int, rope_base: float, experts: bool = False) -> dict[str, Any]:
        """The fields every architecture reads the same way from `<arch>.*` metadata (keys named in errors);
        `experts`: the architecture runs Mixture-of-Experts layers (its caller reads their keys)."""
        if not experts:
            m.reject_experts()
        dim = m.int("embedding_length")
        n_heads = m.int("attention.head_count")
        if n_heads > 0 and dim % n_heads and m.optional_int("attention.key_length") is None:
            raise ModelFormatError(f"{m.arch}.attention.head_count", f"does not divide embedding_length {dim}", n_heads)
        head_dim = m.int("attention.key_length", dim // n_heads if n_heads > 0 else 0)  # check() names a bad count
        return dict(
            arch=m.arch,
            dim=dim,
            hidden_dim=m.int("feed_forward_length"),
            n_layers=m.int("block_count"),
            n_heads=n_heads,
            n_kv_heads=m.int("attention.head_count_kv", n_heads),
            head_dim=head_dim,
            n_vocab=n_vocab,
            n_ctx=m.int("context_length"),
            norm_eps=m.float("attention.layer_norm_rms_epsilon"),
            rope_base=m.float("rope.freq_base", rope_base),
            rope_dim=m.int("rope.dimension_count", head_dim),
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (for display and JSON)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _in_range(key: str, value: int, lo: int, hi: int) -> None:
    if not (lo <= value <= hi):
        raise ModelFormatError(key, f"must be between {lo} and {hi}", value)


class MetadataView:
    """Typed access to `<arch>.<key>` metadata with errors that name the key."""

    def __init__(self, metadata: dict[str, Any], arch: str):
        self.md = metadata
        self.arch = arch

    def _get(self, key: str, default: Any) -> tuple[str, Any]:
        full = key if key.startswith(("general.", "tokenizer.")) else f"{self.arch}.{key}"
        if full in self.md:
            return full, self.md[full]
        if default is _REQUIRED:
            raise ModelFormatError(full, "required metadata key is missing")
        return full, default

    def int(self, key: str, default: Any = None) -> Any:
        full, v = self._get(key, _REQUIRED if default is None else default)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ModelFormatError(full, f"must be an integer, got {type(v).__name__}", v)
        return int(v)

    def float(self, key: str, default: Any = None) -> float:
        full, v = self._get(key, _REQUIRED if default is None else default)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ModelFormatError(full, f"must be a number, got {type(v).__name__}", v)
        v = float(v)
        if not math.isfinite(v):
            raise ModelFormatError(full, "must be finite", v)
        return v

    def string(self, key: str, default: str) -> str:
        full, v = self._get(key, default)
        if not isinstance(v, str):
            raise ModelFormatError(full, f"must be a string, got {type(v).__name__}", v)
        return v

    def reject_experts(self) -> None:
        """An architecture without experts whose file says it has some: refused by name, never run as dense."""
        n = self.optional_int("expert_count")
        if n is not None and n > 1:
            why = (f"{self.arch} has no Mixture-of-Experts layers in GGUF Lens (experts run in llama, qwen2moe and "
                   f"qwen3moe files)")
            raise ModelFormatError(f"{self.arch}.expert_count", why, n)

    def experts(self, hidden: int, required: bool, width_default: int | None = None) -> dict[str, int]:
        """The Mixture-of-Experts keys as llama_model::load_hparams reads them, checked: expert_count,
        expert_used_count, expert_feed_forward_length (else hidden // used, as qwen2moe.cpp and qwen3moe.cpp; an
        architecture that does not read the key gives `width_default`: llama's experts are n_ff wide),
        expert_shared_feed_forward_length. Not required and no expert_count: a dense model."""
        n = self.optional_int("expert_count")
        if n is None or (n == 0 and not required):
            if required:
                raise ModelFormatError(f"{self.arch}.expert_count", "required metadata key is missing")
            return {}
        _in_range(f"{self.arch}.expert_count", n, 1, MAX_EXPERTS)
        full, used = self._get("expert_used_count", None)
        if isinstance(used, (list, tuple, np.ndarray)):
            raise ModelFormatError(full, "a per-layer expert count is not supported by GGUF Lens", "array")
        used = self.int("expert_used_count")
        _in_range(f"{self.arch}.expert_used_count", used, 1, n)
        groups = self.optional_int("expert_group_count")
        if groups is not None and groups > 1:
            raise ModelFormatError(f"{self.arch}.expert_group_count", "expert groups (DeepSeek-style group routing) are "
                                   "not supported by GGUF Lens", groups)
        width = self.optional_int("expert_feed_forward_length") if width_default is None else None
        if width is None or width == 0:
            width = width_default if width_default is not None else hidden // used
        _in_range(f"{self.arch}.expert_feed_forward_length", width, 1, 1 << 18)
        shared = self.optional_int("expert_shared_feed_forward_length") or 0
        _in_range(f"{self.arch}.expert_shared_feed_forward_length", shared, 0, 1 << 18)
        return {"n_expert": n, "n_expert_used": used, "expert_hidden": width, "shared_hidden": shared}

    def optional_int(self, key: str) -> int | None:
        full, v = self._get(key, None)
        return None if v is None else self.int(key)


_REQUIRED = object()
