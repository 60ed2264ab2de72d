"""Direct logit attribution for an encoder-decoder model (T5): the decoder's logit split into its parts, exactly.

The decoder's residual stream at its last position is the decoder token's embedding plus, per decoder block, what
its causal self-attention, its cross-attention (the only way the encoder's input reaches the logits) and its FFN add.
`run_seq2seq` runs the model's own `encode` and `forward` (the numerics it was loaded with) and keeps, for the last
decoder position, each block's head outputs before the output products (self and cross) and what each sub-block
added; the residual stream is rebuilt from those with the run's own float32 adds, bit for bit. `decompose_seq2seq`
splits as engine.attribute.direct does for a decoder-only model: each self-attention head (kind 'head'), each
cross-attention head (kind 'cross_head'), the FFN ('ffn'), what the heads' recomputed products leave of each block's
update ('remainder', per layer) and the head's remainder (the run's logit minus the linear part). The parts sum to
the engine's own logit (difference).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from engine.attribute.direct import Decomposition, direction
from engine.attribute.parts import Part, head_vectors
from engine.errors import SettingError

if TYPE_CHECKING:
    from engine.model import Model

F32 = npt.NDArray[np.float32]
SUBLAYERS = ("self", "cross", "ffn")


@dataclass
class Seq2SeqCapture:
    """The last decoder position of one encoder-decoder pass: per decoder block, each sub-block's head outputs
    (`self_z` / `cross_z`: (heads, d)) and output rows (`self` / `cross` / `ffn`: (dim,)), all float32 as run."""

    enc_ids: list[int]
    dec_ids: list[int]
    embed: F32  # (dim,) the last decoder token's embedding: the stream before block 0
    blocks: list[dict[str, F32]]
    logits: F32  # (n_vocab,) the model's output at the last decoder position

    def stream(self) -> list[F32]:
        """The residual stream before each block and after the last, with the run's float32 adds."""
        x = self.embed.astype(np.float32)
        out = [x]
        for b in self.blocks:
            for key in SUBLAYERS:
                x = b[key] + x  # the graph's `sublayer(...) + x`
            out.append(x)
        return out


class _Kept:
    """A product (or FFN) standing in for the model's during a pass: runs it, keeps its input's and output's last
    row."""

    def __init__(self, inner: Any, store: dict[str, F32], key: str, keep_input: bool):
        self.inner, self.store, self.key, self.keep_input = inner, store, key, keep_input

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        y = self.inner(x, *args, **kwargs)
        if self.keep_input:
            self.store[self.key + "_in"] = np.array(x[-1], np.float32, copy=True)
        self.store[self.key] = np.array(y[-1], np.float32, copy=True)
        return y


@contextmanager
def _keeping(net: Any, blocks: list[dict[str, F32]]) -> Iterator[None]:
    """Every decoder block's output products and FFN kept into `blocks` for the passes inside; put back after."""
    before = [(layer.attn.wo, layer.cross.wo, layer.ffn) for layer in net.dec_layers]
    for layer, store in zip(net.dec_layers, blocks):
        layer.attn.wo = _Kept(layer.attn.wo, store, "self", True)
        layer.cross.wo = _Kept(layer.cross.wo, store, "cross", True)
        layer.ffn = _Kept(layer.ffn, store, "ffn", False)
    try:
        yield
    finally:
        for layer, (wo, cross_wo, ffn) in zip(net.dec_layers, before):
            layer.attn.wo, layer.cross.wo, layer.ffn = wo, cross_wo, ffn


def run_seq2seq(model: Model, enc_ids: Sequence[int], dec_ids: Sequence[int]) -> Seq2SeqCapture:
    """Encode enc_ids and decode dec_ids on a cache of their own, keeping the last decoder position's parts."""
    net = model.net
    enc, dec = [int(i) for i in enc_ids], [int(i) for i in dec_ids]
    if not enc or not dec:
        raise SettingError("an encoder-decoder attribution needs an encoder input and at least the decoder's start token")
    blocks: list[dict[str, F32]] = [{} for _ in net.dec_layers]
    cache = model.new_cache(len(dec))
    model.gguf.check_unchanged()
    with _keeping(net, blocks):
        net.encode(np.asarray(enc, np.int64), cache)
        logits = net.forward(np.asarray(dec, np.int64), cache)[-1]
    a = net.args
    for b in blocks:  # head outputs (heads, d) as the output product read them
        b["self_z"] = b.pop("self_in").reshape(a.n_heads, -1)
        b["cross_z"] = b.pop("cross_in").reshape(a.n_heads, -1)
    embed = np.asarray(net.embed(np.asarray(dec[-1:], np.int64))[0], np.float32)
    return Seq2SeqCapture(enc, dec, embed, blocks, np.asarray(logits, np.float32))


def decompose_seq2seq(model: Model, cap: Seq2SeqCapture, target: int, contrast: int | None) -> Decomposition:
    """The last decoder position's logit of `target` (minus `contrast`'s) split into the module docstring's parts."""
    net = model.net
    stream = [np.asarray(x, np.float64) for x in cap.stream()]
    parts = [Part("embed", None, None, stream[0])]
    updates = []
    for i, (layer, b) in enumerate(zip(net.dec_layers, cap.blocks)):
        new = [Part("head", i, h, v) for h, v in enumerate(head_vectors(layer.attn.wo, b["self_z"]))]
        new += [Part("cross_head", i, h, v) for h, v in enumerate(head_vectors(layer.cross.wo, b["cross_z"]))]
        new.append(Part("ffn", i, None, np.asarray(b["ffn"], np.float64)))
        update = stream[i + 1] - stream[i]
        parts += new
        parts.append(Part("remainder", i, None, update - np.sum([p.vec for p in new], axis=0)))
        updates.append(update)
    u = direction(model, stream[-1], target, contrast)
    row = cap.logits.astype(np.float64)
    diff = float(row[target] - (row[contrast] if contrast is not None else 0.0))
    values = np.array([float(p.vec @ u) for p in parts], np.float64)
    parts.append(Part("remainder", None, None, np.zeros_like(u)))  # the head's: the run's logit minus u . x_L
    values = np.append(values, diff - float(np.sum(values)))
    return Decomposition(parts, values, np.array([float(v @ u) for v in updates]), u, float(stream[-1] @ u), diff)
