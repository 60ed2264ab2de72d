"""Preflight memory estimate (weights, KV cache, scratch) against free memory, and a load-time NaN scan.

RELIABILITY.md case 28: a model that cannot fit is refused before it is loaded, with "needs X GiB,
Y GiB available", instead of failing on the first message. Case 30 (load-time part): small tensors
(norms, F16/F32 tensors under a cap) are scanned for NaN/Inf so a broken file is named at load.
"""
from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import InferenceError
from engine.gguf import GGUFFile, TensorInfo
from engine.models.args import BaseArgs
from engine.runtime.numerics import TILED_MIN_KEYS
from engine.quant import dequantize_rows
from engine.quant.types import TYPES, GGMLType

log = logging.getLogger(__name__)

GIB = 1 << 30
TIGHT_FRACTION = 0.9        # using more than this share of free memory is 'tight' (page cache, the GUI, other apps)
SCORE_COPIES = 4            # scores, masked scores, exp, normalised weights alive at once in base.attention
UNLIMITED = 1 << 62         # cgroup v1 reports 'no limit' as a page-rounded 2^63-1

# bytes of one head_dim row of the KV cache, by cache type (as KVCache: quantized rows are whole blocks)
_CACHE_TYPES = {"F32": GGMLType.F32, "F16": GGMLType.F16, "Q8_0": GGMLType.Q8_0, "Q4_0": GGMLType.Q4_0}


@dataclass(frozen=True)
class MemoryEstimate:
    """What a model at a given context needs, in bytes, and how that compares with free memory."""

    n_ctx: int
    weights_mapped: int    # every tensor's GGUF bytes (memory-mapped; the source of truth)
    weights_dense: int     # float32 copies of matrices that fit in the dense budget (a cache, optional)
    kv_cache: int          # 2 x n_layers x n_ctx x n_kv_heads x (bytes of a head_dim row)
    scratch: int           # one prefill chunk: attention scores, activations, a dequantized matrix, KV growth
    available: int | None  # free memory now (MemAvailable, capped by the cgroup limit); None if unknown
    max_ctx_that_fits: int | None = None  # the largest context that fits without the dense cache

    @property
    def required(self) -> int:
        """Bytes the model cannot run without (the dense copies are a cache that can shrink)."""
        return self.weights_mapped + self.kv_cache + self.scratch

    @property
    def total(self) -> int:
        """Bytes with the full float32 cache the budget allows."""
        return self.required + self.weights_dense

    @property
    def verdict(self) -> str:
        """'ok', 'tight' (fits only with a smaller float32 cache, or nearly all free memory), 'too_big' or 'unknown'."""
        if self.available is None:
            return "unknown"
        if self.required > self.available:
            return "too_big"
        if self.total > TIGHT_FRACTION * self.available:
            return "tight"
        return "ok"

    @property
    def fits(self) -> bool:
        """False only when the model cannot run at this context in the memory there is."""
        return self.verdict != "too_big"

    def breakdown(self) -> str:
        """One line: where the bytes go."""
        return (
            f"weights {gib(self.weights_mapped)} mapped + {gib(self.weights_dense)} float32 copies, "
            f"KV cache for {self.n_ctx} tokens {gib(self.kv_cache)}, scratch {gib(self.scratch)}"
        )

    def message(self) -> str:
        """The user-facing sentence for a refusal (or a warning when tight)."""
        avail = "an unknown amount" if self.available is None else gib(self.available)
        text = (f"needs {gib(self.required)}, {avail} available; "
                "choose a smaller context or a smaller model")
        hint = f" ({self.breakdown()}"
        if self.max_ctx_that_fits == 0:
            hint += "; it does not fit even with a 1-token context"
        elif self.max_ctx_that_fits is not None and self.max_ctx_that_fits < self.n_ctx:
            hint += f"; a context of {self.max_ctx_that_fits} tokens would fit"
        return text + hint + ")"


def gib(n: int) -> str:
    """Bytes as 'X.Y GiB' (two decimals below 1 GiB so small models do not all read 0.0)."""
    value = n / GIB
    return f"{value:.2f} GiB" if value < 1 else f"{value:.1f} GiB"


# -- free memory ------------------------------------------------------------------------------------

def read_meminfo_available(path: str | Path = "/proc/meminfo") -> int | None:
    """MemAvailable in bytes, or None where the kernel does not say."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = re.search(r"^MemAvailable:\s+(\d+)\s*kB", text, re.MULTILINE)
    return int(m.group(1)) * 1024 if m else None


def _read_int(path: Path) -> int | None:
    try:
        raw = path.read_text().strip()
    except OSError:
        return None
    if raw == "max":
        return UNLIMITED
    try:
        return int(raw)
    except ValueError:
        return None


def read_cgroup_available(root: str | Path = "/sys/fs/cgroup", self_cgroup: str | Path = "/proc/self/cgroup") -> int | None:
    """Bytes left under this process's cgroup memory limit (v2 memory.max or v1 limit_in_bytes), None if unlimited."""
    root = Path(root)
    try:
        lines = Path(self_cgroup).read_text().splitlines()
    except OSError:
        lines = []
    candidates: list[tuple[Path, str, str]] = []  # (folder, limit file, usage file)
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        rel = rel.lstrip("/")
        if controllers == "":
            base, limit, usage = root, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit, usage = root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        folder = base / rel if rel else base
        # the limits of every ancestor apply; inside a container the path may not exist, the root does
        for f in [folder, *folder.parents]:
            candidates.append((f, limit, usage))
            if f == base:
                break
    if not candidates:
        candidates = [(root, "memory.max", "memory.current"),
                      (root / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes")]
    best: int | None = None
    for folder, limit_name, usage_name in candidates:
        limit = _read_int(folder / limit_name)
        if limit is None or limit >= UNLIMITED:
            continue
        usage = _read_int(folder / usage_name) or 0
        left = max(0, limit - usage)
        best = left if best is None else min(best, left)
    return best


def available_memory() -> int | None:
    """Free memory for a new model: MemAvailable, capped by what the cgroup limit leaves; None if unknown."""
    values = [v for v in (read_meminfo_available(), read_cgroup_available()) if v is not None]
    return min(values) if values else None


# -- the estimate -----------------------------------------------------------------------------------

# matrices a layer multiplies as one stacked product (FusedLinear): the budget takes each group at once
_FUSED_GROUPS = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"))
_LAYER_MATRIX = re.compile(r"blk\.(\d+)\.(\w+)\.weight$")


def _dense_units(tensors: Mapping[str, TensorInfo]) -> list[int]:
    """float32 bytes of each copy a warm load asks the budget for, in its order: fused groups, other matrices, output."""
    layers: dict[int, dict[str, TensorInfo]] = {}
    for name, t in tensors.items():
        m = _LAYER_MATRIX.match(name)
        if m and t.n_rows > 1:
            layers.setdefault(int(m.group(1)), {})[m.group(2)] = t
    fused, single = [], []
    for i in sorted(layers):
        mats = dict(layers[i])
        for group in _FUSED_GROUPS:
            if all(g in mats for g in group):
                fused.append(sum(4 * mats.pop(g).n_elements for g in group))
        single.extend(4 * t.n_elements for t in mats.values())
    out = "output.weight" if "output.weight" in tensors else "token_embd.weight"  # tied embeddings
    if out in tensors and tensors[out].n_rows > 1:
        single.append(4 * tensors[out].n_elements)
    return fused + single


def _dense_bytes(units: list[int], budget: int) -> tuple[int, int]:
    """(float32 bytes cached, largest copy left uncached) simulating DenseBudget.take's first-come rule."""
    used, largest_uncached = 0, 0
    for nbytes in units:
        if used + nbytes <= budget:
            used += nbytes
        else:
            largest_uncached = max(largest_uncached, nbytes)
    return used, largest_uncached


def kv_cache_bytes(args: BaseArgs, n_ctx: int, cache_type: str = "F32") -> int:
    """2 x attention layers x n_ctx x n_kv_heads x bytes of one head_dim row in the cache type, plus a hybrid's
    recurrent layers' constant state (engine.hybrid_cache: conv rows and one matrix per value head, float32). Where
    the blocks differ (Gemma 4's `kinds`: sliding and global head sizes and KV heads, the last blocks sharing an
    earlier block's rows), each computing block's own shape counts, the sharing ones nothing: what
    engine.cache.KVCache allocates."""
    qtype = _CACHE_TYPES.get(cache_type.strip().upper(), GGMLType.F32)

    def row(d: int) -> int:
        return TYPES[qtype].row_bytes(d) if d % TYPES[qtype].block_size == 0 else 4 * d

    kinds = getattr(args, "kinds", None)
    if kinds is not None and hasattr(kinds, "head_dim_of"):
        per_token = sum(kinds.kv_heads[i] * row(kinds.head_dim_of(i)) for i in range(kinds.n_kv_layers))
        return 2 * n_ctx * per_token
    recurrent = sum(getattr(args, "recurrent", ()) or ())
    dims = getattr(args, "deltanet", None)
    state = 0
    if recurrent and dims is not None:
        state = recurrent * dims.recurrent_shape().nbytes
    return 2 * (args.n_layers - recurrent) * n_ctx * args.n_kv_heads * row(args.head_dim) + state


def scratch_bytes(args: BaseArgs, n_ctx: int, chunk_size: int = 512, all_logits: bool = False) -> int:
    """Peak temporaries of one prefill chunk: attention scores, activations and logits (float32)."""
    t = max(1, min(chunk_size, n_ctx))
    # a prefill chunk takes the plain path, (heads, T, S) scores, below TILED_MIN_KEYS keys and the tiled
    # one, (heads, T, 256 keys), above; one generated token attends to all n_ctx keys on the plain path
    scores = SCORE_COPIES * args.n_heads * max(t * min(n_ctx, TILED_MIN_KEYS - 1), n_ctx) * 4
    width = 4 * args.dim + 3 * args.hidden_dim + 2 * (args.n_heads + 2 * args.n_kv_heads) * args.head_dim
    activations = t * width * 4
    logits = (t if all_logits else 1) * args.n_vocab * 4
    return scores + activations + logits


def estimate_memory(
    gguf: GGUFFile,
    args: BaseArgs,
    *,
    n_ctx: int | None = None,
    dense_budget: int = 0,
    cache_type: str = "F32",
    chunk_size: int = 512,  # engine.generate.UBATCH (llama.cpp's n_ubatch)
    all_logits: bool = False,
    available: int | None = None,
) -> MemoryEstimate:
    """What running `args` from `gguf` at context n_ctx needs, against `available` bytes (None: measure now)."""
    n_ctx = args.n_ctx if n_ctx is None else n_ctx
    if n_ctx < 1:
        raise InferenceError(f"context of {n_ctx} tokens: must be at least 1")
    free = available_memory() if available is None else available
    mapped = sum(t.nbytes for t in gguf.tensors.values())
    dense, largest_uncached = _dense_bytes(_dense_units(gguf.tensors), max(0, dense_budget))

    def needs(ctx: int) -> tuple[int, int]:
        kv = kv_cache_bytes(args, ctx, cache_type)
        # KVCache.reserve copies into a buffer twice the size while the old one is alive: half a cache more
        # at the last growth; a matrix outside the budget is dequantized (float32 plus a block temporary)
        scratch = scratch_bytes(args, ctx, chunk_size, all_logits) + kv // 2 + 2 * largest_uncached
        return kv, scratch

    kv, scratch = needs(n_ctx)
    fit: int | None = None
    if free is not None:
        fixed = mapped

        def ok(ctx: int) -> bool:
            k, s = needs(ctx)
            return fixed + k + s <= free

        if ok(n_ctx):
            fit = n_ctx
        elif ok(1):
            lo, hi = 1, n_ctx  # ok(lo) and not ok(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if ok(mid) else (lo, mid)
            fit = lo
        else:
            fit = 0
    return MemoryEstimate(n_ctx, mapped, dense, kv, scratch, free, fit)


def check_memory(
    gguf: GGUFFile,
    args: BaseArgs,
    *,
    n_ctx: int | None = None,
    dense_budget: int = 0,
    cache_type: str = "F32",
    chunk_size: int = 512,  # engine.generate.UBATCH (llama.cpp's n_ubatch)
    all_logits: bool = False,
    available: int | None = None,
) -> MemoryEstimate:
    """The estimate; InferenceError 'needs X GiB, Y GiB available; ...' when the model cannot fit."""
    est = estimate_memory(gguf, args, n_ctx=n_ctx, dense_budget=dense_budget, cache_type=cache_type,
                          chunk_size=chunk_size, all_logits=all_logits, available=available)
    if est.verdict == "too_big":
        raise InferenceError(est.message())
    if est.verdict == "tight":
        log.warning("memory is tight: %s; float32 weight copies may be skipped (slower)", est.message())
    elif est.verdict == "unknown":
        log.info("free memory unknown; %s", est.breakdown())
    return est


# -- load-time NaN / Inf scan ---------------------------------------------------------------------

MAX_SCAN_TENSOR_BYTES = 16 << 20   # 1-D tensors (norms) and F16/F32/BF16 tensors up to this size are scanned
MAX_SCAN_TOTAL_BYTES = 256 << 20   # and no more than this in all, so the scan stays well under a second
_FLOAT_VIEWS = {GGMLType.F32: np.dtype("<f4"), GGMLType.F16: np.dtype("<f2")}


def _as_float(gguf: GGUFFile, info: TensorInfo) -> np.ndarray:
    """The tensor's values as a float array, without a float32 copy where the type allows."""
    raw = gguf.raw(info.name)
    qtype = GGMLType(info.qtype)
    if qtype in _FLOAT_VIEWS:
        return np.frombuffer(raw, dtype=_FLOAT_VIEWS[qtype])
    if qtype == GGMLType.BF16:
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    return dequantize_rows(gguf.rows(info.name), qtype).reshape(-1)


def scan_small_tensors(
    gguf: GGUFFile, *, max_tensor_bytes: int = MAX_SCAN_TENSOR_BYTES, max_total_bytes: int = MAX_SCAN_TOTAL_BYTES
) -> list[str]:
    """Warnings naming every 1-D tensor (norms) and small F16/F32/BF16 tensor that holds NaN or Inf."""
    warnings: list[str] = []
    scanned = 0
    for info in gguf.tensors.values():
        if info.n_elements == 0:
            continue
        one_d = math.prod(info.shape[1:]) == 1
        is_float = info.qtype in (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
        if not (one_d or is_float) or info.nbytes > max_tensor_bytes:
            continue
        if scanned + info.nbytes > max_total_bytes:
            log.debug("NaN scan skipped %s: %d bytes already scanned", info.name, scanned)
            continue
        scanned += info.nbytes
        values = _as_float(gguf, info)
        finite = np.isfinite(values)
        if finite.all():
            continue
        n_nan = int(np.isnan(values).sum())
        n_inf = int(values.size - finite.sum()) - n_nan
        first = int(np.argmin(finite))
        warnings.append(
            f"tensor '{info.name}' holds {n_nan} NaN and {n_inf} Inf values (first at index {first}); "
            "the model will produce NaN output; re-download or re-convert it"
        )
    for w in warnings:
        log.warning("%s", w)
    return warnings
