"""ModelInfo: what the Model lens shows, made on the worker from a loaded model; every string is display-safe."""
from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from engine.model import Model

VALUE_LIMIT = 400  # characters of a metadata value shown in the table
TEMPLATE_LIMIT = 200_000  # characters of chat-template source shown
ARRAY_HEAD = 8


@dataclass(frozen=True)
class MetadataRow:
    key: str
    type_name: str
    value: str  # escaped and elided


@dataclass(frozen=True)
class ModelInfo:
    """A loaded model described in plain, escaped strings and numbers."""

    name: str
    path: str
    file_bytes: int
    arch: str
    backend: str
    args: tuple[tuple[str, str], ...]  # the architecture's numbers, in declaration order
    n_ctx: int  # the context the KV cache was made with
    metadata: tuple[MetadataRow, ...]
    template_source: str
    template_origin: str  # where the template came from (the file, or the built-in fallback)
    tokenizer: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...]
    n_tensors: int
    model_name: str = ""  # general.name as the file says it, when `name` is not it (see display_name)
    layer_kinds: tuple[tuple[str, str], ...] = ()  # (kind, which layers and their sizes): how each layer mixes tokens
    recurrent: tuple[int, ...] = ()  # a hybrid's recurrent (gated DeltaNet) layers: no KV rows, a constant state
    state_bytes: int = 0  # one recurrent layer's state (float32)


def escape_text(text: str, limit: int = VALUE_LIMIT, keep_lines: bool = False) -> str:
    """Control, format (bidi overrides) and line-break characters shown as escapes; cut at `limit` with '…'."""
    out: list[str] = []
    n = 0
    for ch in text:
        if keep_lines and ch in "\n\t":
            piece = ch
        elif ch == "\n":
            piece = "\\n"
        elif ch == "\t":
            piece = "\\t"
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Zl", "Zp", "Co", "Cn"):
            code = ord(ch)
            piece = f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        else:
            piece = ch
        out.append(piece)
        n += len(piece)
        if n >= limit:
            return "".join(out)[: limit - 1] + "…"
    return "".join(out)


def format_value(value: Any, limit: int = VALUE_LIMIT) -> str:
    """A metadata value as one escaped line: strings as-is, arrays as their type, length and first items."""
    if isinstance(value, str):
        return escape_text(value, limit)
    if isinstance(value, np.ndarray):
        head = ", ".join(_scalar(v) for v in value.reshape(-1)[:ARRAY_HEAD])
        more = ", …" if value.size > ARRAY_HEAD else ""
        return escape_text(f"{value.dtype}[{value.size}] [{head}{more}]", limit)
    if isinstance(value, (list, tuple)):
        head = ", ".join(format_value(v, 60) if not isinstance(v, str) else repr(escape_text(v, 60)) for v in value[:ARRAY_HEAD])
        more = ", …" if len(value) > ARRAY_HEAD else ""
        return escape_text(f"[{len(value)} items] [{head}{more}]", limit)
    return escape_text(_scalar(value), limit)


def _scalar(v: Any) -> str:
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (float, np.floating)):
        return f"{float(v):.6g}"
    return str(v)


def _arg(v: Any) -> str:
    """An architecture number as the Model lens shows it: flags per layer as the layers set ('0–2, 4–6'), a nested
    dataclass (a hybrid's DeltaNet sizes) as its fields, anything else as a scalar."""
    import dataclasses  # noqa: PLC0415

    if isinstance(v, tuple) and v and all(isinstance(x, (bool, np.bool_)) for x in v):
        from app.records.logit_lens import layer_runs  # noqa: PLC0415 - plain Python

        on = [i for i, x in enumerate(v) if x]
        return f"layers {layer_runs(on)}" if on else "none"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return ", ".join(f"{f.name} {_scalar(getattr(v, f.name))}" for f in dataclasses.fields(v))
    return _scalar(v)


def _type_name(types: dict[str, Any], key: str, value: Any) -> str:
    t = types.get(key)
    if t:
        outer, inner = t
        name = getattr(outer, "name", str(outer)).lower()
        return f"{name}[{getattr(inner, 'name', inner).lower()}]" if inner is not None else name
    return type(value).__name__


def _token(tok: Any, tid: int | None) -> str:
    if tid is None:
        return "none"
    return f"{tid} {escape_text(repr(tok.token_text(tid)), 60)}"


def compute_note(model: Any) -> str:
    """Where the products run, for the status bar: 'cupy', 'CPU (AVX2) · numba kernels' (llama.cpp's numbers, those of
    its build for that CPU; 'CPU (AVX2, AVX-512 bits) · …' where GGUF_LENS_BITS chose the other build's),
    'CPU · NumPy fallback (why)' or 'CPU · float32 BLAS' (the textbook numerics)."""
    name = str(getattr(model.backend, "name", "numpy"))
    if name != "numpy":
        return name
    if getattr(model, "numerics", "ggml") != "ggml":
        return "CPU · float32 BLAS"
    from engine.kernels.dispatch import compiled, kernel_note  # noqa: PLC0415 - numpy and numba only
    from engine.kernels.isa import BUILDS, describe  # noqa: PLC0415

    info = describe()
    names = {"avx512": "AVX-512", "avx2": "AVX2", "aarch64": "ARM"}
    shown = names.get(info.target, "")
    if shown and info.target in ("avx512", "avx2") and not info.matches_host_build:  # GGUF_LENS_BITS chose the other
        shown += f", {names[next(k for k, v in BUILDS.items() if v == info.bits_of)]} bits"
    return f"CPU{f' ({shown})' if shown and compiled() else ''} · {kernel_note()}"


def _letters(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def display_name(metadata: dict[str, Any], path: str) -> str:
    """The name a loaded file goes by: its general.name, except where the file is a copy of a catalog model (its
    general.name, or basename and size, name one) that is not the catalog's own file: a requantized copy keeps
    the catalog model's name and must not pass for it, so it goes by its file's name. No general.name: the file's
    name too."""
    file_name = str(path).replace("\\", "/").rsplit("/", 1)[-1]
    name = metadata.get("general.name")
    if not isinstance(name, str) or not name.strip():
        return file_name.removesuffix(".gguf") or file_name
    from engine.catalog import CATALOG, entry_for_file  # noqa: PLC0415

    said = {_letters(name), _letters(f"{metadata.get('general.basename', '')}{metadata.get('general.size_label', '')}")}
    said = {s for s in said if len(s) >= 4}
    copy = any(_letters(e.title).startswith(s) or _letters(e.filename).startswith(s) for e in CATALOG.values()
               for s in said)
    if copy and entry_for_file(path) is None:
        return file_name
    return name


def layer_kinds(model: Any) -> tuple[tuple[tuple[str, str], ...], tuple[int, ...], int]:
    """(rows of the Model lens's Layers box, the recurrent layers, one recurrent state's bytes) of a loaded model:
    which layers attend and which are recurrent (a hybrid such as Qwen3.5), with the sizes of each kind."""
    from app.records.logit_lens import layer_runs  # noqa: PLC0415 - plain Python
    from engine.observe.recurrent_maps import state_bytes  # noqa: PLC0415

    net = getattr(model, "net", None)
    a = model.args
    n_layers = int(getattr(a, "n_layers", 0) or 0)
    recurrent = tuple(int(i) for i in (getattr(net, "mixers", None) or ()))
    dims = getattr(a, "deltanet", None)
    attn = [i for i in range(n_layers) if i not in set(recurrent)]
    heads = f"{a.n_heads} heads, {a.n_kv_heads} KV heads, head_dim {a.head_dim}"
    if getattr(net, "is_encoder_decoder", False):
        return encoder_decoder_kinds(a, heads), (), 0
    if not recurrent or dims is None:
        return (("attention", f"all {n_layers} layers: {heads}; KV rows grow with the context"),), (), 0
    channels = 2 * dims.state * dims.k_heads + dims.state * dims.v_heads
    each = state_bytes(dims.v_heads, dims.state, dims.conv_kernel - 1, channels)
    rows = (
        ("recurrent (gated DeltaNet)",
         f"layers {layer_runs(recurrent)} ({len(recurrent)} of {n_layers}): {dims.v_heads} value heads reading "
         f"{dims.k_heads} key heads, a {dims.state}×{dims.state} state per value head and a causal convolution of "
         f"width {dims.conv_kernel}: {each / 1024:,.1f} KiB per layer, the same at any context length; no KV rows"),
        ("attention", f"layers {layer_runs(attn)} ({len(attn)} of {n_layers}): {heads}; KV rows grow with the context"
         if attn else "none"),
    )
    return rows, recurrent, each


def encoder_decoder_kinds(a: Any, heads: str) -> tuple[tuple[str, str], ...]:
    """The Layers box of an encoder-decoder model (T5): two stacks, positions by relative buckets, no RoPE."""
    n_dec = int(getattr(a, "n_dec_layers", 0) or 0) or int(a.n_layers)
    buckets = f"a learned bias per head by relative position bucket ({int(getattr(a, 'n_buckets', 0) or 0)} buckets), no RoPE"
    return (("encoder", f"{a.n_layers} layers: {heads}; bidirectional self-attention over the input; {buckets}"),
            ("decoder", f"{n_dec} layers: {heads}; causal self-attention over the output, then cross-attention over "
                        f"the encoder's output; KV rows grow with the output"))


def shown_args(model: Any) -> tuple[tuple[str, str], ...]:
    """The architecture's numbers for the Model lens; an encoder-decoder (T5, relative position buckets) has no
    RoPE, so the defaults its args carry for one are left out."""
    seq2seq = getattr(getattr(model, "net", None), "is_encoder_decoder", False)
    return tuple((k, _arg(v)) for k, v in model.args.as_dict().items() if not (seq2seq and k.startswith("rope")))


def make_model_info(model: Model, n_ctx: int) -> ModelInfo:
    """Describe a loaded model for the Model lens (runs on the worker thread)."""
    md = model.gguf.metadata
    types = getattr(model.gguf, "metadata_types", {}) or {}
    rows = tuple(MetadataRow(escape_text(k, 200), _type_name(types, k, v), format_value(v)) for k, v in md.items())
    tok = model.tokenizer
    eog = sorted(tok.eog_ids)
    tok_rows = (
        ("model", escape_text(str(tok.model_name), 60)),
        ("vocabulary", f"{tok.n_vocab:,} tokens"),
        ("BOS", _token(tok, tok.bos_id) + ("" if getattr(tok, "add_bos", True) else " (not added)")),
        ("EOS", _token(tok, getattr(tok, "eos_id", None))),
        ("end of generation", ", ".join(_token(tok, i) for i in eog[:8]) + (" …" if len(eog) > 8 else "") or "none"),
    )
    args = shown_args(model)
    source = getattr(model.chat, "source", "") or ""
    source = escape_text(source, TEMPLATE_LIMIT, keep_lines=True)
    builtin = bool(getattr(model.chat, "is_builtin", "tokenizer.chat_template" not in md))
    origin = "the app's built-in template (the file has none)" if builtin else "tokenizer.chat_template in the file"
    general = md.get("general.name")
    name = display_name(md, str(model.path))
    return ModelInfo(
        name=escape_text(name, 120),
        path=escape_text(str(model.path), 300),
        file_bytes=int(getattr(model.gguf, "file_size", 0)),
        arch=escape_text(model.arch, 60),
        backend=compute_note(model),
        args=args,
        n_ctx=int(n_ctx),
        metadata=rows,
        template_source=source,
        template_origin=escape_text(str(origin), 80),
        tokenizer=tok_rows,
        warnings=tuple(escape_text(w, 500) for w in model.warnings),
        n_tensors=len(model.gguf.tensors),
        model_name=escape_text(general, 120) if isinstance(general, str) and general != name else "",
        **dict(zip(("layer_kinds", "recurrent", "state_bytes"), layer_kinds(model))),
    )
