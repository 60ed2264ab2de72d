"""Records the lenses draw: frozen dataclasses of numpy arrays and plain values, made on the worker thread.

Nothing here imports Qt and no record holds a live engine object (no QTensor, no view into the KV
cache): every array is a copy, so a record may cross to the GUI thread while the model keeps running.
The make_* functions do the work (recompute attention from the recorded queries and the cache,
dequantize a tensor) and are meant to be called from app/workers.py.
"""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from app.summary import escape_text
from engine.observe import attention_maps as amaps
from engine.observe.positions import layer_rope_layout
from engine.quant import dequantize_rows
from engine.quant.blocks import DecodedBlock, block_scales, decode_block, histogram
from engine.quant.types import GGMLType, type_info

if TYPE_CHECKING:
    from engine.cache import KVCache
    from engine.gguf import GGUFFile
    from engine.model import Model
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]
Aggregate = Literal["mean", "max"]

_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(.+?)(?:\.weight|\.bias)?$")
_PLAIN_NAME = re.compile(r"^(.+?)(?:\.weight|\.bias)?$")
HIST_BINS = 128
MAX_HIST_WEIGHTS = 1 << 22  # past this many weights the histogram uses evenly spaced rows


# ---- model


@dataclass(frozen=True)
class LayerInfo:
    """How one layer attends: its RoPE base, sliding window (None = full) and score scale."""

    index: int
    rope_base: float
    window: int | None
    scale: float


@dataclass(frozen=True)
class TensorRow:
    """One row of the tensor table: a GGUF tensor with its type and size."""

    name: str
    layer: int | None  # blk.{layer}.*; None for token_embd, output, output_norm
    role: str  # attn_q, ffn_down, token_embd, ...
    type_name: str  # ggml's name: Q4_K, F32, ...
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    nbytes: int
    bpw: float  # bits per weight of the type
    n_elements: int


@dataclass(frozen=True)
class ModelRecord:
    """What the lenses need to know about a loaded model (or a GGUF file whose forward pass isn't written)."""

    name: str
    arch: str
    path: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_vocab: int
    n_ctx: int
    rope_dim: int
    rope_mode: str  # 'norm' (adjacent pairs) or 'neox' (halves)
    group: int  # query heads per KV head (GQA)
    layers: tuple[LayerInfo, ...]
    tensors: tuple[TensorRow, ...]
    file_bytes: int
    runnable: bool  # False when only the file could be read (no forward pass for this architecture)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def total_weights(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def average_bpw(self) -> float:
        return 8.0 * self.total_bytes / max(1, self.total_weights)

    @property
    def rope_bases(self) -> tuple[float, ...]:
        """The distinct RoPE bases of the layers, in order of first use."""
        return tuple(dict.fromkeys(layer.rope_base for layer in self.layers))

    def kv_head(self, head: int) -> int:
        """The KV head a query head reads (heads h = kv * group + i share it)."""
        return head // self.group

    def group_heads(self, kv: int) -> tuple[int, ...]:
        """The query heads that share KV head `kv`."""
        return tuple(range(kv * self.group, (kv + 1) * self.group))


def make_model_record(model: Model | GGUFFile) -> ModelRecord:
    """A ModelRecord from a loaded Model, or from an open GGUFFile alone (quant lens of an unrunnable model)."""
    net = getattr(model, "net", None)
    gguf = model.gguf if net is not None else model
    md = gguf.metadata
    arch = str(md.get("general.architecture", "?"))
    a = net.args if net is not None else _args_from_metadata(md, arch, gguf)
    ropes = layer_rope_layout(md, a.n_layers, a.rope_base, a.head_dim)
    specs = _net_specs(net, a.n_layers) or [None] * len(ropes)
    layers = tuple(
        LayerInfo(i, float(sp.rope_base), sp.window, float(sp.scale)) if sp else LayerInfo(i, r.base, r.window, r.scale)
        for i, (r, sp) in enumerate(zip(ropes, specs))
    )
    name = md.get("general.name")
    path = str(getattr(model, "path", getattr(gguf, "path", "")))
    name = name if isinstance(name, str) and name.strip() else path.rsplit("/", 1)[-1]
    return ModelRecord(
        name=escape_text(name, 120), arch=arch, path=path,  # from the file: control characters escaped, cut short
        dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
        n_vocab=a.n_vocab, n_ctx=a.n_ctx, rope_dim=a.rope_dim, rope_mode=getattr(net, "rope_mode", None) or ropes[0].mode,
        group=max(1, a.n_heads // max(1, a.n_kv_heads)), layers=layers,
        tensors=tuple(_tensor_row(info) for info in gguf.tensors.values()),
        file_bytes=int(getattr(gguf, "file_size", 0)), runnable=net is not None,
    )


def _net_specs(net: Any, n_layers: int) -> list[Any]:
    """Per-layer LayerAttentionSpec from the architecture, when it exposes them."""
    if net is None:
        return []
    for attr in ("layer_specs", "specs"):
        specs = getattr(net, attr, None)
        if callable(specs):
            specs = specs()
        if isinstance(specs, (list, tuple)) and len(specs) == n_layers:
            return list(specs)
    one = getattr(net, "spec", None)
    return [one] * n_layers if one is not None else []


def _args_from_metadata(md: dict[str, Any], arch: str, gguf: GGUFFile) -> Any:
    """BaseArgs-like hyper-parameters straight from `<arch>.*` metadata (no architecture class needed)."""
    from types import SimpleNamespace  # noqa: PLC0415

    def get(key: str, default: Any = None) -> Any:
        v = md.get(f"{arch}.{key}", default)
        return default if v is None else v

    dim = int(get("embedding_length", 0))
    n_heads = int(get("attention.head_count", 1))
    head_dim = int(get("attention.key_length", dim // max(1, n_heads)))
    embd = gguf.tensors.get("token_embd.weight")
    return SimpleNamespace(
        dim=dim,
        n_layers=int(get("block_count", 0)),
        n_heads=n_heads,
        n_kv_heads=int(get("attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        n_vocab=int(embd.shape[1]) if embd is not None and len(embd.shape) > 1 else 0,
        n_ctx=int(get("context_length", 0)),
        rope_base=float(get("rope.freq_base", 10000.0)),
        rope_dim=int(get("rope.dimension_count", head_dim)),
    )


def split_tensor_name(name: str) -> tuple[int | None, str]:
    """'blk.3.attn_q.weight' -> (3, 'attn_q'); 'token_embd.weight' -> (None, 'token_embd')."""
    m = _BLOCK_NAME.match(name)
    if m:
        return int(m.group(1)), m.group(2)
    m = _PLAIN_NAME.match(name)
    return None, m.group(1) if m else name


def _tensor_row(info: Any) -> TensorRow:
    layer, role = split_tensor_name(info.name)
    ti = type_info(int(info.qtype))
    return TensorRow(
        name=info.name,
        layer=layer,
        role=role,
        type_name=ti.name if ti else str(int(info.qtype)),
        shape=tuple(int(s) for s in info.shape),
        nbytes=int(info.nbytes),
        bpw=ti.bits_per_weight if ti else float("nan"),
        n_elements=int(math.prod(info.shape)),
    )


# ---- attention


@dataclass(frozen=True)
class AttentionRecord:
    """The layers x heads grid of small pooled attention maps (BertViz's model view)."""

    n_tokens: int
    n_layers: int
    n_heads: int
    thumbs: F32  # (L, H, T, T) max-pooled weights; NaN where every cell of the bin is masked
    thumbs_mean: F32  # (L, H, T, T) mean-pooled weights, same mask
    thumbs_nosink: F32  # (L, H, T, T) max-pooled over keys 1..N-1 (the BOS / sink column hidden)
    rows: npt.NDArray[np.int64]  # the query rows that were computed (all of them when `full`)
    full: bool  # every query row computed (else a strided sample that always has the last row)
    sink: F32  # (L, H) mean weight on key 0 over the computed rows
    prev: F32  # (L, H) mean weight on the previous token
    self_: F32  # (L, H) mean weight on the query's own position
    token_texts: tuple[str, ...]
    elapsed_s: float


def make_attention_record(
    model: Model,
    recorder: Recorder,
    cache: KVCache,
    token_texts: list[str],
    *,
    thumb: int = 32,
    max_rows: int | None = None,
) -> AttentionRecord:
    """Pool every head's attention to thumb x thumb; max_rows caps the query rows computed (None = all)."""
    t0 = time.perf_counter()
    n = min(recorder.length, cache.length)
    layers = sorted(recorder.specs)
    g = amaps.attention_grid(recorder, cache, layers, thumb=thumb, max_rows=max_rows)
    return AttentionRecord(
        n_tokens=n,
        n_layers=len(layers),
        n_heads=g.max_pooled.shape[1] if g.max_pooled.ndim == 4 else model.args.n_heads,
        thumbs=g.max_pooled,
        thumbs_mean=g.mean_pooled,
        thumbs_nosink=g.nosink_pooled,
        rows=g.rows,
        full=g.rows.size == n,
        sink=g.sink,
        prev=g.prev,
        self_=g.self_,
        token_texts=tuple(token_texts[:n]),
        elapsed_s=time.perf_counter() - t0,
    )


@dataclass(frozen=True)
class HeadRecord:
    """One head's attention (or an aggregate over heads and/or layers) for a window of query rows."""

    layer: int | str  # layer index, or 'mean' / 'max' over all layers
    head: int | str  # query head index, or 'mean' / 'max' over the heads
    weights: F32  # (R, C) attention of query rows [row_start, row_stop) to keys [0, row_stop) (later keys are all masked)
    allowed: npt.NDArray[np.bool_]  # (R, C) True where the causal (and window) mask lets the query see the key
    row_start: int
    row_stop: int
    row_step: int  # > 1 when rows were max-pooled to fit max_rows
    col_step: int
    n_tokens: int
    window: int | None  # sliding window of the layer (None = full attention)
    kv_head: int | None  # the KV head a single query head reads
    group_heads: tuple[int, ...]  # query heads sharing that KV head
    token_texts: tuple[str, ...]  # all N token texts (labels are picked by the view)
    elapsed_s: float

    @property
    def n_rows(self) -> int:
        return self.row_stop - self.row_start


def make_head_record(
    model: Model,
    recorder: Recorder,
    cache: KVCache,
    layer: int | Aggregate,
    head: int | Aggregate,
    rows: slice | None,
    token_texts: list[str],
    *,
    max_rows: int = 1024,
    max_cols: int = 4096,
) -> HeadRecord:
    """Attention of one head or an aggregate ('mean'/'max') across heads and/or layers for query rows `rows`.

    Keys stop at the last query row (causal); sides longer than max_rows / max_cols are max-pooled.
    """
    t0 = time.perf_counter()
    n = min(recorder.length, cache.length)
    start, stop, _ = (rows or slice(None)).indices(n)
    stop = max(stop, start)
    layers = sorted(recorder.specs) if isinstance(layer, str) else [int(layer)]
    how = layer if isinstance(layer, str) else "mean"
    w = amaps.aggregate_attention(recorder, cache, layers, head, np.arange(start, stop), layer_how=how)[:, :stop]
    windows = {recorder.specs[i].window for i in layers}
    window = windows.pop() if len(windows) == 1 else None
    allowed = amaps.allowed_mask(np.arange(start, stop), stop, window if len(layers) == 1 else None)
    w, allowed, row_step, col_step = amaps.fit_side(w, allowed, max_rows, max_cols)
    group = recorder.specs[layers[0]].group if layers else 1
    kv = int(head) // group if not isinstance(head, str) else None
    return HeadRecord(
        layer=layer if isinstance(layer, str) else int(layer),
        head=head if isinstance(head, str) else int(head),
        weights=w,
        allowed=allowed,
        row_start=start,
        row_stop=stop,
        row_step=row_step,
        col_step=col_step,
        n_tokens=n,
        window=window if len(layers) == 1 else None,
        kv_head=kv,
        group_heads=tuple(range(kv * group, (kv + 1) * group)) if kv is not None else (),
        token_texts=tuple(token_texts[:n]),
        elapsed_s=time.perf_counter() - t0,
    )


# ---- tensors


@dataclass(frozen=True)
class TensorRecord:
    """One tensor for the quant lens: weight and block-scale distributions and one block decoded."""

    name: str
    layer: int | None
    role: str
    type_name: str
    shape: tuple[int, ...]
    nbytes: int
    bpw: float
    n_elements: int
    weight_counts: npt.NDArray[np.int64]  # histogram of the dequantized weights
    weight_edges: F32
    weight_stats: dict[str, float]  # min, max, mean, std, absmax
    sampled_rows: int  # rows that went into the histogram (n_rows when all)
    n_rows: int
    scale_counts: dict[str, npt.NDArray[np.int64]]  # field name ('d', 'sub-block scale', ...) -> histogram
    scale_edges: dict[str, F32]
    block: DecodedBlock | None  # None when the type cannot be decoded
    block_index: int
    elapsed_s: float


def _live_blocks(model: Model | GGUFFile, name: str) -> tuple[np.ndarray, GGMLType]:
    """The tensor's current blocks (after any requantization), (n_rows, row_bytes) uint8, and type."""
    net = getattr(model, "net", None)
    if net is not None:
        lin = net.linears().get(name)
        if lin is not None:
            return lin.weight.blocks, lin.weight.qtype
    gguf = model.gguf if net is not None else model
    return gguf.rows(name), GGMLType(gguf.tensors[name].qtype)


def make_tensor_record(model: Model | GGUFFile, tensor_name: str, *, block_index: int = 0) -> TensorRecord:
    """Histograms of the tensor's dequantized weights and block scales, and block `block_index` decoded."""
    t0 = time.perf_counter()
    gguf = model.gguf if getattr(model, "net", None) is not None else model
    if tensor_name not in gguf.tensors:
        raise KeyError(f"no tensor named {tensor_name!r} in {getattr(gguf, 'path', 'the model')}")
    row = _tensor_row(gguf.tensors[tensor_name])
    blocks, qtype = _live_blocks(model, tensor_name)
    info = type_info(int(qtype))
    n_rows = blocks.shape[0]
    per_row = max(1, row.shape[0])
    keep = max(1, min(n_rows, MAX_HIST_WEIGHTS // per_row))
    ids = np.unique(np.linspace(0, n_rows - 1, keep).round().astype(np.int64))
    counts, edges, stats = histogram(np.zeros(0, np.float32), HIST_BINS)
    scale_counts: dict[str, np.ndarray] = {}
    scale_edges: dict[str, np.ndarray] = {}
    block = None
    flat_blocks = np.asarray(blocks[ids]).reshape(-1, info.type_size) if info else None
    if info is not None and info.supported:
        w = dequantize_rows(blocks, qtype, ids).reshape(-1)
        counts, edges, stats = histogram(w, HIST_BINS)
        for key, vals in block_scales(flat_blocks, qtype).items():
            scale_counts[key], scale_edges[key], _ = histogram(vals, HIST_BINS)
    if info is not None:
        all_blocks = np.asarray(blocks).reshape(-1, info.type_size)
        block_index = int(np.clip(block_index, 0, len(all_blocks) - 1))
        block = decode_block(np.array(all_blocks[block_index]), qtype)
    return TensorRecord(
        name=row.name, layer=row.layer, role=row.role, type_name=row.type_name, shape=row.shape, nbytes=row.nbytes,
        bpw=row.bpw, n_elements=row.n_elements, weight_counts=counts, weight_edges=edges, weight_stats=stats,
        sampled_rows=len(ids), n_rows=n_rows, scale_counts=scale_counts, scale_edges=scale_edges, block=block,
        block_index=block_index, elapsed_s=time.perf_counter() - t0,
    )
