"""Records of an encoder-decoder model's (T5's) lenses: its three kinds of attention over the last input and output,
one cross-attention cell step by step, and its learned position bias against distance.

The maps are of the conversation on screen when there is one (chat_run: a saved chat reads back the same after a
restart), else of what the session's cache ran (last_run: a reply being written).

Made on the worker from engine.observe.t5_maps / t5_cell (plain numpy); frozen, so they cross to the GUI as they are.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.observe.t5_cell import CrossCell
from engine.observe.t5_maps import T5PositionTables

F32 = npt.NDArray[np.float32]
KIND_TITLES = {"encoder": "Encoder self-attention", "decoder": "Decoder self-attention", "cross": "Cross-attention"}
MAX_TOKENS = 512  # each side: longer inputs or outputs are cut to their last MAX_TOKENS for the maps


@dataclass(frozen=True)
class Seq2SeqRecord:
    """The attention of one input (the encoder's tokens) and the output written for it (the decoder's tokens, the
    start token first): per kind an array (layers, heads, queries, keys)."""

    input_texts: tuple[str, ...]
    output_texts: tuple[str, ...]
    encoder: F32  # (L_enc, H, Te, Te): bidirectional
    decoder: F32  # (L_dec, H, Td, Td): causal
    cross: F32  # (L_dec, H, Td, Te): queries from the decoder, keys and values from the encoder
    elapsed_s: float

    def maps(self, kind: str) -> F32:
        return {"encoder": self.encoder, "decoder": self.decoder, "cross": self.cross}[kind]

    def axes(self, kind: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(query texts, key texts) of a kind's maps."""
        if kind == "encoder":
            return self.input_texts, self.input_texts
        return self.output_texts, (self.output_texts if kind == "decoder" else self.input_texts)


@dataclass(frozen=True)
class CrossStepRecord:
    """One cross-attention cell with the token texts it needs on screen."""

    cell: CrossCell
    input_texts: tuple[str, ...]
    output_texts: tuple[str, ...]
    n_heads: int
    n_kv_heads: int

    def top_keys(self, k: int = 6) -> list[int]:
        order = np.argsort(-self.cell.weights, kind="stable")[: min(k, self.cell.weights.size)]
        return [int(j) for j in order]


def _stack(maps: dict[int, F32], n_layers: int) -> F32:
    return np.stack([maps[i] for i in range(n_layers)]).astype(np.float32)


def last_run(cache: Any) -> tuple[list[int], list[int]] | None:
    """The encoder input and the decoder tokens the session's cache holds (its last reply), each cut to its last
    MAX_TOKENS; None before any encoding."""
    enc = getattr(cache, "encoder_ids", None) if cache is not None else None
    if not enc or cache.length == 0:
        return None
    return list(enc)[-MAX_TOKENS:], list(cache.tokens)[: cache.length][-MAX_TOKENS:]


def chat_run(model: Any, context: Any) -> tuple[list[int], list[int]] | None:
    """The encoder input and the decoder tokens of the conversation on screen (an app.records.reply
    GenerationRequest): its last user message as the tokenizer encodes it (EOS added, as app.jobs.chat reads it)
    and the start token then every token of the reply shown, each cut to its last MAX_TOKENS; None without a
    reply. A chat reopened after a restart reads the same as it did when it was written."""
    messages = tuple(context.messages)
    reply = tuple(context.continue_ids or ())
    if not messages or messages[-1][0] != "assistant" or not reply:
        return None
    text = next((c for r, c in reversed(messages) if r == "user"), "")
    enc = model.tokenizer.encode(text, add_special=True, parse_special=False)
    dec = [int(model.net.decoder_start_token), *(int(t) for t in reply)]
    return list(enc)[-MAX_TOKENS:], dec[-MAX_TOKENS:]


def make_seq2seq_record(model: Any, enc_ids: list[int], dec_ids: list[int]) -> Seq2SeqRecord:
    from engine.observe.t5_maps import attention_maps  # noqa: PLC0415

    t0 = time.perf_counter()
    net, tok = model.net, model.tokenizer
    m = attention_maps(net, enc_ids, dec_ids)
    return Seq2SeqRecord(tuple(tok.token_text(t) for t in enc_ids), tuple(tok.token_text(t) for t in dec_ids),
                         _stack(m.encoder, len(net.enc_layers)), _stack(m.decoder, len(net.dec_layers)),
                         _stack(m.cross, len(net.dec_layers)), time.perf_counter() - t0)


def make_cross_step(model: Any, enc_ids: list[int], dec_ids: list[int], layer: int, head: int,
                    query: int) -> CrossStepRecord:
    from engine.observe.t5_cell import cross_cell  # noqa: PLC0415

    tok, a = model.tokenizer, model.args
    query = int(np.clip(query, 0, len(dec_ids) - 1))
    cell = cross_cell(model.net, enc_ids, dec_ids, layer, head, query)
    return CrossStepRecord(cell, tuple(tok.token_text(t) for t in enc_ids), tuple(tok.token_text(t) for t in dec_ids),
                           int(a.n_heads), int(a.n_kv_heads))


def make_position_tables(model: Any) -> T5PositionTables:
    from engine.observe.t5_maps import position_tables  # noqa: PLC0415

    return position_tables(model.net)
