"""One forward pass of the prompt with every block's activations kept: what the decomposition takes as the truth.

The pass is the engine's own (`DecoderModel.forward` over the whole prompt, the numerics the model was loaded with,
every intervention set on it applied) with TransformerLens-named hooks that only copy (engine.intervene.hooks) and a
Recorder that keeps the Mixture-of-Experts routing (which experts each token used, with which weights). A hook that
returns nothing changes no bit, so the logits are those of the normal forward. Kept per block: the residual stream
entering and leaving it, each head's output before the output product (`attn.hook_z`), and what attention and the FFN
add to the residual stream (after Gemma's post-norms), and the logits before and after any soft-cap.

The model is causal, so the prompt is run up to the attributed position and the position is the pass's last: only
that row of each activation is kept (Gemma 4's per-layer inputs are recomputed from whole batches, so there every row
is), and the head runs on that row alone, as a forward without all_logits runs it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from engine.errors import SettingError
from engine.intervene.hooks import hooked
from engine.observe.recorder import Recorder

if TYPE_CHECKING:
    from engine.model import Model

F32 = npt.NDArray[np.float32]
POINTS = ("hook_resid_pre", "attn.hook_z", "hook_attn_out", "hook_mlp_out", "hook_resid_post")


@dataclass
class Capture:
    """A prompt's pass, attributed at its last position: per block i and hook point (e.g. acts[i]['hook_attn_out'])
    a float32 copy of the last row, (1, ...), or of every row, (T, ...), where `full`."""

    ids: list[int]
    acts: list[dict[str, F32]]
    full: bool  # every row kept (Gemma 4's per-layer inputs)
    logits: F32  # (n_vocab,) what the model outputs at the last position (soft-capped where the architecture caps)
    pre_cap: F32  # (n_vocab,) the logits before the soft-cap (the same where there is none)
    routing: dict[int, tuple[np.ndarray, np.ndarray]]  # MoE layer -> the last token's (experts (k,), weights (k,))

    def at(self, layer: int, point: str) -> F32:
        """The last position's row of a block's activation."""
        return self.acts[layer][point][-1]


def check_supported(model: Model) -> None:
    """Refuse, with a message that says why, a model the decomposition does not handle yet."""
    net = model.net
    if getattr(net, "is_encoder_decoder", False):
        raise SettingError(f"{model.arch} (encoder-decoder) models have no hook points: their attribution runs "
                           "without them (engine.attribute.seq2seq), and their parts cannot be switched off to confirm it")
    if model.backend.is_device:
        raise SettingError("attribution runs on the CPU path only: load the model with --backend numpy")
    if not hasattr(net, "hooks") or not hasattr(net, "layers") or not hasattr(net, "out_norm"):
        raise SettingError(f"attribution for the {model.arch} architecture is not built yet")


def run(model: Model, ids: Sequence[int]) -> Capture:
    """The prompt's forward pass with every block's activations at its last position and the routing kept."""
    check_supported(model)
    net = model.net
    n = net.args.n_layers
    full = getattr(net, "per_layer", None) is not None
    acts: list[dict[str, F32]] = [{} for _ in range(n)]

    def keep(layer: int, point: str):  # noqa: ANN202 - a hook
        def fn(value: np.ndarray, name: str) -> None:
            acts[layer][point] = np.array(value if full else value[-1:], np.float32, copy=True)
        return fn

    hooks = [(f"blocks.{i}.{p}", keep(i, p)) for i in range(n) for p in POINTS]
    rec = Recorder(capture_q=False)
    cache = model.new_cache(max(1, len(ids)))
    model.gguf.check_unchanged()
    with hooked(model, hooks):
        logits = net.forward(list(ids), cache, rec, all_logits=False)[-1]
    rec.commit()
    routing = {}
    for layer in range(n):
        got = rec.routing_of(layer)
        if got is not None:
            routing[layer] = (got[0][-1].astype(np.int64), got[1][-1].astype(np.float32))
    pre_cap = logits
    if getattr(net.args, "final_softcap", None) is not None:  # the head's own ops on the same row, before its cap
        pre_cap = net.output(net.norm(acts[n - 1]["hook_resid_post"][-1:], net.out_norm))[-1]
    return Capture(list(ids), acts, full, np.asarray(logits, np.float32), np.asarray(pre_cap, np.float32), routing)
