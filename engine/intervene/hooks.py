"""The hook API: read any named activation of a forward pass, or change it, by TransformerLens's names.

    from engine.model import load_model
    from engine.intervene.hooks import run_with_cache, run_with_hooks

    model = load_model("smollm2-135m-instruct")
    ids = model.tokenizer.encode("The Eiffel Tower is in")
    logits, acts = run_with_cache(model, ids)            # every hook point, or names=[...]
    acts["blocks.3.hook_resid_post"]                     # (T, d_model)
    acts["blocks.3.attn.hook_z"]                         # (T, n_heads, d_head): each head's output before W_O
    def no_head_4(z, name):
        z[:, 4] = 0.0
        return z
    patched = run_with_hooks(model, ids, [("blocks.3.attn.hook_z", no_head_4)])

Hook points, per block i: `blocks.{i}.hook_resid_pre` (the residual stream into the block), `blocks.{i}.attn.hook_z`
(the heads' outputs), `blocks.{i}.hook_attn_out` (what attention adds to the residual), `blocks.{i}.hook_mlp_out`
(what the FFN adds), `blocks.{i}.hook_resid_post` (the residual stream after the block, a control vector included).
Attention patterns are recomputed from the recorded queries and keys (`attention_pattern`), as the lenses do. A hook
is fn(value, name) returning None (keep) or an array of the same shape; values are float32 as the numerics computed
them (ggml numerics: llama.cpp's bits). While hooks are set the decode step runs op by op.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.errors import SettingError

if TYPE_CHECKING:
    from engine.model import Model

POINTS = ("hook_resid_pre", "attn.hook_z", "hook_attn_out", "hook_mlp_out", "hook_resid_post")
_NAME = re.compile(r"^blocks\.(\d+)\.(" + "|".join(re.escape(p) for p in POINTS) + r")$")
Hook = Callable[[np.ndarray, str], Any]


def hook_names(model: Model) -> list[str]:
    """Every hook point of the model, block by block."""
    return [f"blocks.{i}.{p}" for i in range(model.args.n_layers) for p in POINTS]


def check_name(model: Model, name: str) -> str:
    m = _NAME.match(name)
    if m is None or int(m.group(1)) >= model.args.n_layers:
        raise SettingError(f"no hook point {name!r} (they are blocks.<0..{model.args.n_layers - 1}>.{{{', '.join(POINTS)}}})")
    return name


@contextmanager
def hooked(model: Model, fwd_hooks: Sequence[tuple[str, Hook]]) -> Iterator[None]:
    """The hooks set on the model for the forward passes inside the block (several on one point run in order)."""
    net = model.net
    if not hasattr(net, "hooks"):
        raise SettingError(f"hooks are not available for the {net.arch_name} architecture")
    if model.backend.is_device and fwd_hooks:
        raise SettingError("hooks run on the CPU path only; load the model with --backend numpy")
    by_name: dict[str, list[Hook]] = {}
    for name, fn in fwd_hooks:
        by_name.setdefault(check_name(model, name), []).append(fn)

    def chain(fns: list[Hook]) -> Hook:
        def run(value: np.ndarray, name: str) -> np.ndarray:
            for fn in fns:
                got = fn(value, name)
                value = value if got is None else np.asarray(got, np.float32)
            return value
        return run

    before = net.hooks
    net.hooks = {name: chain(fns) for name, fns in by_name.items()}
    try:
        yield
    finally:
        net.hooks = before


def run_with_hooks(model: Model, tokens: Sequence[int], fwd_hooks: Sequence[tuple[str, Hook]]) -> np.ndarray:
    """Logits (T, n_vocab) of tokens from an empty cache with the hooks set."""
    with hooked(model, fwd_hooks):
        return model.net.forward(list(tokens), model.new_cache(max(1, len(tokens))), all_logits=True)


def run_with_cache(model: Model, tokens: Sequence[int], names: Sequence[str] | None = None,
                   ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Logits (T, n_vocab) and a copy of the activation at each hook point in `names` (default: all)."""
    acts: dict[str, np.ndarray] = {}

    def keep(value: np.ndarray, name: str) -> None:
        acts[name] = np.array(value, np.float32, copy=True)

    wanted = hook_names(model) if names is None else list(names)
    logits = run_with_hooks(model, tokens, [(n, keep) for n in wanted])
    return logits, acts


def attention_pattern(model: Model, tokens: Sequence[int], layer: int) -> np.ndarray:
    """(n_heads, T, T): layer's attention weights over tokens, recomputed from the recorded queries and the cache."""
    from engine.observe.attention_maps import attention_rows  # noqa: PLC0415
    from engine.observe.recorder import Recorder  # noqa: PLC0415

    if not 0 <= layer < model.args.n_layers:
        raise SettingError(f"layer {layer} out of range (the model has {model.args.n_layers})")
    rec, cache = Recorder(capture_q=True), model.new_cache(max(1, len(tokens)))
    rec.begin(0, len(tokens))
    model.net.forward(list(tokens), cache, rec)
    cache.commit(list(tokens))
    rec.commit()
    return attention_rows(rec, cache, layer, np.arange(len(tokens)))
