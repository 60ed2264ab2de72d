"""What the lenses show of an encoder-decoder (T5) model: its three kinds of attention, and its position bias.

T5 attends three ways, and each is a map per layer and head:

- encoder self-attention, (Te x Te), bidirectional: every input token sees every other;
- decoder self-attention, (Td x Td), causal: each output position sees itself and the ones before;
- cross-attention, (Td x Te): each output position's look at the input, what a translation's alignment is.

T5 has no RoPE: where a head looks by distance is a learned bias per head, looked up by the *bucket* of the
distance (engine.models.encoder_decoder.relative_bucket). `position_tables` lays it out against distance for the
encoder (bidirectional buckets, distances both ways) and the decoder (causal: keys at or before the query) for
the Positions lens. Everything here is computed on request (the maps by running the model with a probe, which the
forward pass calls with each attention's softmax weights); numpy in, frozen records of numpy out.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.models.encoder_decoder import relative_bucket
from engine.models.seq2seq import EncoderDecoderModel

F32 = npt.NDArray[np.float32]
KINDS = ("encoder", "decoder", "cross")


@dataclass(frozen=True)
class T5AttentionMaps:
    """Attention weights of one encoder input and one decoder sequence: layer -> (H, Tq, Tk) per kind."""

    enc_ids: tuple[int, ...]
    dec_ids: tuple[int, ...]
    encoder: dict[int, F32]  # (H, Te, Te), each row sums to 1
    decoder: dict[int, F32]  # (H, Td, Td), lower-triangular
    cross: dict[int, F32]  # (H, Td, Te)

    def of(self, kind: str) -> dict[int, F32]:
        """The maps of one kind: 'encoder', 'decoder' or 'cross'."""
        if kind not in KINDS:
            raise ValueError(f"attention kind {kind!r} is not one of {', '.join(KINDS)}")
        return getattr(self, kind)


@dataclass(frozen=True)
class PositionTable:
    """One stack's learned position bias against distance (key position - query position)."""

    distance: npt.NDArray[np.int64]  # (n,) the distances laid out, ascending
    bucket: npt.NDArray[np.int32]  # (n,) the bucket of each distance
    bias: F32  # (n_layers, H, n): the bias each layer's heads add at each distance
    table: F32  # (n_layers, n_buckets, H): each layer's attn_rel_b rows (layer 0's where a layer has none)
    bidirectional: bool


@dataclass(frozen=True)
class T5PositionTables:
    """The Positions lens of a T5 model: the encoder's table and the decoder's."""

    n_buckets: int
    encoder: PositionTable
    decoder: PositionTable


def attention_maps(net: EncoderDecoderModel, enc_ids: Sequence[int], dec_ids: Sequence[int],
                   layers: Sequence[int] | None = None) -> T5AttentionMaps:
    """Run `enc_ids` through the encoder and `dec_ids` (the decoder start token first) through the decoder on a
    cache of their own, keeping every attention's weights (only `layers`' when given), as the numerics compute them."""
    enc = np.asarray(enc_ids, np.int64).reshape(-1)
    dec = np.asarray(dec_ids, np.int64).reshape(-1)
    if enc.size == 0 or dec.size == 0:
        raise ValueError("attention maps need at least one encoder and one decoder token")
    keep = None if layers is None else {int(i) for i in layers}
    maps: dict[str, dict[int, F32]] = {k: {} for k in KINDS}

    def probe(kind: str, layer: int, weights: F32) -> None:
        if keep is None or layer in keep:
            maps[kind][layer] = np.array(weights, np.float32)  # a copy: the caller's buffers are reused

    cache = net.new_cache(max(dec.size, 1))
    net.encode(enc, cache, probe=probe)
    net.forward(dec, cache, all_logits=False, probe=probe)
    return T5AttentionMaps(tuple(int(t) for t in enc), tuple(int(t) for t in dec), maps["encoder"], maps["decoder"],
                           maps["cross"])


def position_tables(net: EncoderDecoderModel, max_distance: int = 160) -> T5PositionTables:
    """The learned bias per head against distance, up to `max_distance` either way (the encoder) or back (the
    decoder); past llama.cpp's MAX_DISTANCE (128) every distance shares the last bucket."""
    if max_distance < 1:
        raise ValueError(f"max_distance = {max_distance}: must be at least 1")
    n = net.args.n_buckets
    both = np.arange(-max_distance, max_distance + 1, dtype=np.int64)
    back = np.arange(-max_distance, 1, dtype=np.int64)
    enc = _table(np.stack([layer.rel_bias for layer in net.enc_layers]), both, n, True)
    dec = _table(np.stack([layer.rel_bias for layer in net.dec_layers]), back, n, False)
    return T5PositionTables(n, enc, dec)


def _table(tables: F32, distance: npt.NDArray[np.int64], n_buckets: int, bidirectional: bool) -> PositionTable:
    """tables (L, n_buckets, H) looked up at each distance: bias (L, H, n)."""
    bucket = relative_bucket(distance, n_buckets, bidirectional)
    bias = np.ascontiguousarray(tables[:, bucket, :].transpose(0, 2, 1), np.float32)  # (L, H, n)
    return PositionTable(distance, bucket, bias, np.asarray(tables, np.float32), bidirectional)


def bucket_edges(n_buckets: int, bidirectional: bool, max_distance: int = 160) -> list[tuple[int, int, int]]:
    """(bucket, first distance, last distance) of each bucket over |distance| <= max_distance, for a legend:
    which distances share a bias. Distances are key - query, so the decoder's are <= 0."""
    lo = -max_distance
    distance = np.arange(lo, (max_distance if bidirectional else 0) + 1, dtype=np.int64)
    bucket = relative_bucket(distance, n_buckets, bidirectional)
    out: list[tuple[int, int, int]] = []
    for b in np.unique(bucket):
        d = distance[bucket == b]
        out.append((int(b), int(d.min()), int(d.max())))
    return out
