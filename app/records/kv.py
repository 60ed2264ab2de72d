"""What the KV cache costs: its type, the bytes it holds now and at the full context, and the attention path.

`KVInfo` is made on the worker after each prefill and crosses to the GUI as a plain record; `kv_bytes_for`
answers the same question on the GUI side from a ModelRecord-like object, using the engine's own formula
(KVCache.bytes_for: 2 x layers x tokens x kv_heads x bytes of one head_dim row in the cache type). In a hybrid
(Qwen3.5) only the attention layers hold KV rows; each recurrent layer holds a state of constant size instead,
counted in both (it is part of what the cache holds, as HybridCache.nbytes counts it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CACHE_TYPES = ("F32", "F16", "Q8_0", "Q4_0")  # as llama.cpp's --cache-type-k / --cache-type-v
DEFAULT_CACHE_TYPE = "F16"  # llama.cpp's default, and the one the compiled decode step runs on
SETTING_KEY = "cache_type"  # where the choice lives in Settings.extra
BACKENDS = ("auto", "numpy", "cupy")  # engine.backend's choices; the model loaded next uses it
BACKEND_KEY = "backend"  # where the backend choice lives in Settings.extra
NUMERICS = ("ggml", "float32")  # engine.model.load_model's numerics; the model loaded next uses it
NUMERICS_KEY = "numerics"  # where the numerics choice lives in Settings.extra


def backend_setting(settings: Any) -> str:
    """The backend chosen in the settings, 'auto' when unset or unknown."""
    value = getattr(settings, "extra", {}).get(BACKEND_KEY, "auto") if settings is not None else "auto"
    return value if value in BACKENDS else "auto"


def numerics_setting(settings: Any) -> str:
    """The numerics chosen in the settings, 'ggml' (llama.cpp's numbers) when unset or unknown."""
    value = getattr(settings, "extra", {}).get(NUMERICS_KEY, "ggml") if settings is not None else "ggml"
    return value if value in NUMERICS else "ggml"


@dataclass(frozen=True)
class KVInfo:
    """The KV cache after a prefill (or at the end of a reply) and which attention path the prefill took."""

    cache_type: str  # 'F32' | 'F16' | 'Q8_0' | 'Q4_0'
    kv_bytes: int  # bytes held for the tokens in the cache now
    full_bytes: int  # bytes it would hold at n_ctx tokens
    n_tokens: int
    n_ctx: int
    attention_paths: tuple[str, ...]  # the path each prefill chunk took: 'plain' or 'tiled'
    state_bytes: int = 0  # of kv_bytes and full_bytes: the recurrent layers' states (a hybrid), constant

    @property
    def attention_path(self) -> str:
        """'tiled', 'plain', 'plain + tiled' (chunks differed) or '' when nothing was prefilled."""
        seen = tuple(dict.fromkeys(self.attention_paths))
        return " + ".join(sorted(seen, key=lambda p: p != "plain"))


def cache_type_setting(settings: Any) -> str:
    """The cache type a Settings record asks for (Settings.extra['cache_type']), F16 when unset or unknown."""
    extra = getattr(settings, "extra", None) or {}
    name = str(extra.get(SETTING_KEY, DEFAULT_CACHE_TYPE)).upper()
    return name if name in CACHE_TYPES else DEFAULT_CACHE_TYPE


def kv_bytes_for(record: Any, n_tokens: int, cache_type: str = DEFAULT_CACHE_TYPE) -> int | None:
    """Bytes a cache of `cache_type` holds for n_tokens of a model (None if the record or type cannot tell): the
    attention layers' KV rows, and the recurrent layers' states of a hybrid."""
    from engine.cache import KVCache  # noqa: PLC0415 - numpy only; builds no arrays until reserve()
    from engine.errors import SettingError  # noqa: PLC0415

    try:
        n_layers = int(record.n_layers)
        recurrent = frozenset(int(i) for i in getattr(record, "recurrent", ()) or ())
        cache = KVCache(n_layers, int(record.n_kv_heads), int(record.head_dim), max(1, int(n_tokens)), cache_type,
                        kv_layers=frozenset(range(n_layers)) - recurrent)
        states = int(getattr(record, "state_bytes", 0) or 0) * len(recurrent)
    except (AttributeError, TypeError, ValueError, SettingError):
        return None
    return cache.bytes_for(int(n_tokens)) + states


def kv_layers(record: Any) -> int:
    """How many layers hold KV rows (all of them but a hybrid's recurrent ones)."""
    return int(record.n_layers) - len(getattr(record, "recurrent", ()) or ())


def kv_formula(record: Any, n_tokens: int, cache_type: str) -> str:
    """'2 × 30 layers × 4,096 tokens × 3 KV heads × 64 head_dim × 2 B (F16)' for tooltips and the Model lens (a
    hybrid's attention layers only, '+ 3 recurrent states × 1.0 MiB' after them)."""
    per = {"F32": "4 B", "F16": "2 B", "Q8_0": "34/32 B", "Q4_0": "18/32 B"}.get(cache_type, "?")
    recurrent = len(getattr(record, "recurrent", ()) or ())
    layers = f"{kv_layers(record)} attention layers" if recurrent else f"{record.n_layers} layers"
    text = (f"2 × {layers} × {n_tokens:,} tokens × {record.n_kv_heads} KV heads × "
            f"{record.head_dim} head_dim × {per} ({cache_type})")
    if recurrent:
        each = int(getattr(record, "state_bytes", 0) or 0)
        text += f" + {recurrent} recurrent states × {each / 1024:,.1f} KiB (the same at any length)"
    return text

