"""ModelRecord: what the lenses need to know about a loaded model, or a GGUF file alone, and its tensor table."""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.records.model_info import display_name, escape_text
from engine.observe.positions import layer_rope_layout, scaling_profile
from engine.quant.types import type_info

if TYPE_CHECKING:
    from engine.gguf import GGUFFile
    from engine.model import Model

_BLOCK_NAME = re.compile(r"^blk\.(\d+)\.(.+?)(?:\.weight|\.bias)?$")
_PLAIN_NAME = re.compile(r"^(.+?)(?:\.weight|\.bias)?$")


RECURRENT = "recurrent"  # LayerInfo.kind of a gated DeltaNet layer (Qwen3.5 / Qwen3-Next linear attention)
ATTENTION = "attention"


@dataclass(frozen=True)
class LayerInfo:
    """How one layer mixes tokens: softmax attention (its RoPE base, sliding window (None = full) and score scale)
    or a recurrent gated DeltaNet layer (a state per value head, no positions, no KV rows)."""

    index: int
    rope_base: float
    window: int | None
    scale: float
    kind: str = ATTENTION  # ATTENTION | RECURRENT
    n_heads: int = 0  # query heads (attention) or value heads (recurrent); 0: the model's n_heads

    @property
    def recurrent(self) -> bool:
        return self.kind == RECURRENT


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
    rope_scaling: str = ""  # how the model scales RoPE (Llama 3's factors, linear, YaRN), "" for none
    rope_ratio: tuple[float, ...] = ()  # per pair: the frequency used / base^(-2i/d) (empty: 1 for every pair)
    # where the kinds of layers rotate differently (Gemma 4: sliding and global blocks of their own head sizes, the
    # global ones' proportional frequency factors): (base, rotated dims, ratio per pair) per base; empty: rope_dim
    # and rope_ratio for every base
    rope_kinds: tuple[tuple[float, int, tuple[float, ...]], ...] = ()
    n_expert: int = 0  # Mixture-of-Experts: experts per layer (0: a dense model) and how many a token uses
    n_expert_used: int = 0
    reasoning: tuple[str, ...] = ()  # the reasoning switches its chat template reads (engine.chat.reasoning)
    encoder_decoder: bool = False  # T5: an encoder reads the input, a decoder writes the output (app.records.seq2seq)
    n_dec_layers: int = 0  # the decoder's blocks (encoder-decoder models; n_layers counts the encoder's)
    n_buckets: int = 0  # T5's relative position buckets
    recurrent: tuple[int, ...] = ()  # the gated DeltaNet layers of a hybrid (Qwen3.5): no KV rows, a constant state
    n_v_heads: int = 0  # a recurrent layer's value heads (each keeps a state_size x state_size matrix)
    n_k_heads: int = 0  # its key heads (value head h reads key head h % n_k_heads)
    state_size: int = 0  # head dim of keys and values in a recurrent layer
    conv_kernel: int = 0  # the causal convolution's width (it keeps conv_kernel - 1 inputs)
    state_bytes: int = 0  # one recurrent layer's state (float32), the same at every context length

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that attend (and hold KV rows): every layer but the recurrent ones."""
        rec = set(self.recurrent)
        return tuple(i for i in range(self.n_layers) if i not in rec)

    @property
    def hybrid(self) -> bool:
        """Whether some layers are recurrent (gated DeltaNet) instead of attention."""
        return bool(self.recurrent)

    @property
    def state_total(self) -> int:
        """Bytes of every recurrent layer's state together."""
        return self.state_bytes * len(self.recurrent)

    def is_recurrent(self, layer: object) -> bool:
        return isinstance(layer, int) and layer in self.recurrent

    def heads_of(self, layer: int) -> int:
        """Heads of one layer: value heads of a recurrent layer, query heads of an attention layer."""
        return self.n_v_heads if self.is_recurrent(layer) else self.n_heads

    @property
    def max_heads(self) -> int:
        """The most heads any layer has (the overview grid's columns)."""
        return max(self.n_heads, self.n_v_heads if self.recurrent else 0)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def total_weights(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def average_bpw(self) -> float:
        return 8.0 * self.total_bytes / max(1, self.total_weights)

    def rope_of(self, base: float) -> tuple[int, tuple[float, ...]]:
        """(rotated dims, frequency ratio per pair) of the layers with this RoPE base."""
        for b, dims, ratio in self.rope_kinds:
            if b == base:
                return dims, ratio
        return self.rope_dim, self.rope_ratio

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
    mixers = _recurrent(net, a)
    rec_set = set(mixers.get("recurrent", ()))
    layers = tuple(
        LayerInfo(i, float(sp.rope_base), sp.window, float(sp.scale)) if sp else LayerInfo(i, r.base, r.window, r.scale)
        for i, (r, sp) in enumerate(zip(ropes, specs))
    )
    if rec_set:
        layers = tuple(
            dataclasses.replace(x, window=None, kind=RECURRENT, n_heads=mixers["n_v_heads"]) if x.index in rec_set
            else dataclasses.replace(x, n_heads=a.n_heads) for x in layers
        )
    path = str(getattr(model, "path", getattr(gguf, "path", "")))
    name = display_name(md, path)  # a copy of a catalog model goes by its file's name
    return ModelRecord(
        name=escape_text(name, 120), arch=arch, path=path,  # from the file: control characters escaped, cut short
        dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
        n_vocab=a.n_vocab, n_ctx=a.n_ctx, rope_dim=a.rope_dim, rope_mode=getattr(net, "rope_mode", None) or ropes[0].mode,
        group=max(1, a.n_heads // max(1, a.n_kv_heads)), layers=layers,
        tensors=tuple(tensor_row(info) for info in gguf.tensors.values()),
        file_bytes=int(getattr(gguf, "file_size", 0)), runnable=net is not None,
        n_expert=int(getattr(a, "n_expert", 0) or 0), n_expert_used=int(getattr(a, "n_expert_used", 0) or 0),
        reasoning=_reasoning_switches(model),
        encoder_decoder=bool(getattr(net, "is_encoder_decoder", False)),
        n_dec_layers=int(getattr(a, "n_dec_layers", 0) or 0), n_buckets=int(getattr(a, "n_buckets", 0) or 0)
        if getattr(net, "is_encoder_decoder", False) else 0,
        **{**_scaling(net, a), **_rope_kinds(net)},
        **mixers,
    )


def _rope_kinds(net: Any) -> dict[str, Any]:
    """The record's per-kind RoPE fields where the architecture keeps one RoPE per kind of block (Gemma 4's
    `ropes`: engine.models.layer_kinds.LayerRope by is-sliding), with a line on each kind's scaling."""
    ropes = getattr(net, "ropes", None)
    if not isinstance(ropes, dict) or not ropes:
        return {}
    kinds, lines = [], []
    for sliding, r in sorted(ropes.items(), key=lambda kv: not kv[0]):
        dims = int(r.args.rope_dim)
        prof = scaling_profile(r.rope_scaling, dims, float(r.base))
        plain = all(x == 1.0 for x in prof.ratio)  # a kind without factors (its RopeScaling is not NO_SCALING)
        kinds.append((float(r.base), dims, () if plain else prof.ratio))
        if prof.text and not plain:
            lines.append(f"{'sliding' if sliding else 'global'} layers' {prof.text}")
    return {"rope_kinds": tuple(kinds), **({"rope_scaling": "; ".join(lines)} if lines else {})}


def _recurrent(net: Any, a: Any) -> dict[str, Any]:
    """The record's recurrent-layer fields from a hybrid's DeltaNet sizes (engine.models.deltanet.DeltaNetDims)."""
    mixers = tuple(int(i) for i in getattr(net, "mixers", None) or ())
    dims = getattr(a, "deltanet", None)
    if not mixers or dims is None:
        return {}
    from engine.observe.recurrent_maps import state_bytes  # noqa: PLC0415

    conv_rows, channels = int(dims.conv_kernel) - 1, int(2 * dims.state * dims.k_heads + dims.state * dims.v_heads)
    return {"recurrent": mixers, "n_v_heads": int(dims.v_heads), "n_k_heads": int(dims.k_heads),
            "state_size": int(dims.state), "conv_kernel": int(dims.conv_kernel),
            "state_bytes": state_bytes(int(dims.v_heads), int(dims.state), conv_rows, channels)}


def _reasoning_switches(model: Any) -> tuple[str, ...]:
    """The names of the reasoning switches the model's own chat template reads (none for a built-in one)."""
    from engine.chat.reasoning import template_switches  # noqa: PLC0415

    chat = getattr(model, "chat", None)
    if chat is None or getattr(chat, "is_builtin", True):
        return ()
    return tuple(sw.name for sw in template_switches(str(getattr(chat, "source", ""))))


def _scaling(net: Any, a: Any) -> dict[str, Any]:
    """The record's RoPE scaling fields from the architecture's RopeScaling (engine.models.rope)."""
    scaling = getattr(net, "rope_scaling", None)
    if scaling is None:
        return {}
    prof = scaling_profile(scaling, a.rope_dim, a.rope_base)
    text = prof.text
    still = [i for i, r in enumerate(prof.ratio) if r == 0.0]  # factor inf: multi-section RoPE's fourth position
    if still and all(r in (0.0, 1.0) for r in prof.ratio):  # the only "scaling" is pairs that never turn
        text = (f"multi-section RoPE: pair{'s' if len(still) > 1 else ''} {', '.join(map(str, still))} never "
                "turn{} for text (their section reads position 0)".format("" if len(still) > 1 else "s"))
    return {"rope_scaling": text, "rope_ratio": prof.ratio}


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


def tensor_row(info: Any) -> TensorRow:
    """A GGUF tensor's row of the tensor table: its layer and role from the name, its type's size."""
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


