"""An encoder-decoder model's (T5's) graph on traced values: the encoder and the decoder as the model runs them.

engine.models.seq2seq.EncoderDecoderModel runs its own `encode` and `forward`; during a traced pass they run
unchanged, with four things of the model's handed over for the pass (`seq2seq_pass`, put back after):

- `embed` returns the pass's input embeddings (the encoder's, then the decoder's: the leaves the gradient is taken
  with respect to) instead of looking the ids up again;
- `attend` is the float32 reference's biased attention (engine.ops.attention_bias.reference) spelled on traced values:
  q K^T, the learned position bias, the causal mask, a softmax shifted by its (constant) row maximum, V;
- `read_cache` reads the traced K/V the pass wrote (`Seq2SeqTapeCache`, which also holds the traced encoding);
- `head` returns the decoder's last residual row, which engine.grad.backward normalises and multiplies by the target's
  (and contrast's) head rows only.

The relative position buckets and the masks are constants of the pass, the weights are used as they are dequantized
(engine.grad.backward.traced), so the gradient is composed from the ops' VJPs as for every decoder-only model.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from engine.errors import SettingError
from engine.grad.fused import softmax


class Seq2SeqTapeCache:
    """The decoder's traced K/V of one pass, per decoder layer, and the traced encoding it decodes against."""

    def __init__(self, n_layers: int, n_ctx: int):
        self.n_ctx = n_ctx
        self.length = 0
        self.k: list[Any] = [None] * n_layers
        self.v: list[Any] = [None] * n_layers
        self.encoding: Any = None

    def reserve(self, n_total: int) -> None:
        """Nothing to allocate: the rows are the pass's own."""

    def put(self, layer: int, start: int, k: Any, v: Any) -> None:
        if start:
            raise AssertionError("a traced pass runs the decoder from position 0")
        self.k[layer], self.v[layer] = k, v


def traced_attend(q: Any, keys: Any, values: Any, bias: np.ndarray | None, mask: np.ndarray | None,
                  scale: float = 1.0, n_kv: int | None = None) -> tuple[Any, None]:
    """engine.ops.attention_bias.reference's maths on traced q, K, V: (Hq, T, d) out (no weights returned)."""
    hq, t, d = q.shape
    hkv = keys.shape[0]
    g = hq // hkv
    scores = (q.reshape(hkv, g * t, d) @ keys.transpose(0, 2, 1)).reshape(hq, t, -1)
    if bias is not None:
        scores = scores + bias
    if scale != 1.0:
        scores = scores * float(scale)
    if mask is not None:
        scores = np.where(mask[None], scores, -np.inf)
    w = softmax(scores)
    return (w.reshape(hkv, g * t, -1) @ values).reshape(hq, t, d), None


def _read(cache: Seq2SeqTapeCache, layer: int, end: int) -> tuple[Any, Any, None]:
    return cache.k[layer], cache.v[layer], None


@contextmanager
def _handed_over(net: Any, inputs: list[Any]) -> Iterator[None]:
    """The model's embed / attend / read_cache / head for one traced pass (instance attributes over its methods)."""
    before = net.attend, net.read_cache
    net.embed = lambda ids: inputs.pop(0)
    net.head = lambda x, all_logits: x[-1:]
    net.attend, net.read_cache = traced_attend, _read
    try:
        yield
    finally:
        del net.embed, net.head
        net.attend, net.read_cache = before


def decoder_ids(net: Any, decoder: Sequence[int] | None) -> list[int]:
    """The decoder's tokens: as given, or the start token alone (what the first reply token is read after)."""
    ids = [net.decoder_start_token] if decoder is None else [int(i) for i in decoder]
    if not ids:
        raise SettingError("the decoder needs at least its start token")
    return ids


def seq2seq_pass(net: Any, enc_ids: Sequence[int], dec_ids: Sequence[int], enc_x: Any, dec_x: Any) -> Any:
    """The decoder's last residual row (1, dim) before its output norm, for traced encoder and decoder inputs (the
    embeddings of enc_ids and dec_ids, or what stands for them)."""
    cache = Seq2SeqTapeCache(len(net.dec_layers), len(dec_ids))
    with _handed_over(net, [enc_x, dec_x]):
        cache.encoding = net.encode(np.asarray(enc_ids, np.int64))
        return net.forward(np.asarray(dec_ids, np.int64), cache)
