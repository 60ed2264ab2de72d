"""The t5 architecture (T5, flan-T5) as llama.cpp runs it: an encoder stack and a decoder stack.

As llama_model_t5 (src/models/t5.cpp): the encoder (enc.blk.*) is pre-norm RMSNorm blocks without biases whose
bidirectional self-attention adds a learned bias per head, looked up by the relative position bucket of each
key (engine.models.encoder_decoder); no RoPE, no scaling of the scores (kq_scale 1); enc.output_norm closes it.
The decoder (dec.blk.*) adds a causal bias the same way, then cross-attention (queries from the decoder, keys and
values from the encoder output), then the FFN; dec.output_norm and output.weight (else the tied token
embeddings) give the logits. A layer without its own attn_rel_b uses layer 0's. The FFN is GELU-gated when
ffn_gate is there (flan-T5), up-ReLU-down when not (T5), per layer as build_ffn decides.

This file reads the metadata and loads the tensors; the graph is engine.models.seq2seq's: `encode(ids, cache)`
runs the encoder once and keeps its output, and every decoder layer's cross K/V, on the cache; `forward(ids,
cache)` runs decoder tokens against it. The decoder starts from `decoder_start_token_id`, else BOS (as llama.cpp's
examples fall back).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from engine.errors import ModelFormatError
from engine.models.args import BaseArgs, MetadataView
from engine.models.decoder import Numerics
from engine.models.encoder_decoder import (
    MAX_BUCKETS,
    MIN_BUCKETS,
    T5FFN,
    AttentionWeights,
    DecoderLayer,
    EncoderLayer,
)
from engine.models.registry import register
from engine.models.seq2seq import EncoderDecoderArgs, EncoderDecoderModel
from engine.models.weights import Weights

F32 = npt.NDArray[np.float32]


@dataclass
class T5Args(EncoderDecoderArgs):
    """The encoder-decoder's hyper-parameters as llama_model_t5 reads them."""

    @classmethod
    def read(cls, md: dict[str, Any], n_vocab: int, arch: str) -> T5Args:
        """The keys llama_model_t5::load_arch_hparams reads, checked (each error names its key)."""
        m = MetadataView(md, arch)
        args = cls(**BaseArgs.common_fields(m, n_vocab, 10000.0))  # no RoPE: its fields keep their defaults
        args.check()
        args.n_dec_layers = m.int("decoder_block_count", args.n_layers)
        if not (1 <= args.n_dec_layers <= 512):
            raise ModelFormatError(f"{arch}.decoder_block_count", "must be between 1 and 512", args.n_dec_layers)
        args.n_buckets = m.int("attention.relative_buckets_count")
        if not (MIN_BUCKETS <= args.n_buckets <= MAX_BUCKETS):
            raise ModelFormatError(f"{arch}.attention.relative_buckets_count",
                                   f"must be between {MIN_BUCKETS} and {MAX_BUCKETS}", args.n_buckets)
        start = m.optional_int("decoder_start_token_id")
        key = f"{arch}.decoder_start_token_id"
        if start is None:
            start, key = m.optional_int("tokenizer.ggml.bos_token_id"), "tokenizer.ggml.bos_token_id"
        if start is not None and not (0 <= start < n_vocab):
            raise ModelFormatError(key, f"is not a token of a vocabulary of {n_vocab}", start)
        args.dec_start = start
        return args


@register("t5")
class T5(EncoderDecoderModel):
    """T5's encoder and decoder over one token embedding; see the module docstring."""

    Args: ClassVar[type[T5Args]] = T5Args
    args: T5Args

    @classmethod
    def args_from_metadata(cls, md: dict[str, Any], n_vocab: int) -> T5Args:
        return cls.Args.read(md, n_vocab, cls.arch_name)

    def __init__(self, args: T5Args, w: Weights, ops: Numerics):
        super().__init__(args, w, ops)
        a = args
        self.tok_embd = w.qtensor("token_embd.weight", (a.dim, a.n_vocab))
        enc_bias = self.rel_bias(w, "enc", 0, None)
        self.enc_layers = [self.load_encoder_layer(w, i, enc_bias) for i in range(a.n_layers)]
        self.enc_out_norm = w.vector("enc.output_norm.weight", a.dim)
        dec_bias = self.rel_bias(w, "dec", 0, None)
        self.dec_layers = [self.load_decoder_layer(w, i, dec_bias) for i in range(a.n_dec_layers)]
        self.out_norm = w.vector("dec.output_norm.weight", a.dim)
        name = "output.weight" if w.has("output.weight") else "token_embd.weight"
        self.output = w.linear(name, a.dim, a.n_vocab)
        self.output.column_major = True
        for i in range(a.n_dec_layers):  # loaded and never used by llama.cpp's graph (nor HF's): not a warning
            cross_bias = f"dec.blk.{i}.cross_attn_rel_b.weight"
            if w.has(cross_bias):
                w.qtensor(cross_bias, (a.n_heads, a.n_buckets))

    def rel_bias(self, w: Weights, stack: str, i: int, shared: F32 | None) -> F32:
        """Block i's attn_rel_b as (n_buckets, n_head) rows; layer 0's when the block has none (layer 0 must)."""
        a = self.args
        name = f"{stack}.blk.{i}.attn_rel_b.weight"
        if shared is not None and (i == 0 or not w.has(name)):
            return shared
        if not w.has(name):
            raise ModelFormatError(name, "required tensor is missing from the file (the relative position bias)")
        t = w.qtensor(name, (a.n_heads, a.n_buckets))
        return t.dequantize().reshape(a.n_buckets, a.n_heads)

    def attention_weights(self, w: Weights, prefix: str) -> AttentionWeights:
        """{prefix}_q/_k/_v/_o matrices (q/k/v: dim -> heads x head_dim)."""
        a = self.args
        q_dim, kv_dim = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        return AttentionWeights(w.linear(prefix + "_q.weight", a.dim, q_dim),
                                w.linear(prefix + "_k.weight", a.dim, kv_dim),
                                w.linear(prefix + "_v.weight", a.dim, kv_dim),
                                w.linear(prefix + "_o.weight", q_dim, a.dim))

    def ffn(self, w: Weights, b: str) -> T5FFN:
        a = self.args
        gate = w.linear(b + "ffn_gate.weight", a.dim, a.hidden_dim) if w.has(b + "ffn_gate.weight") else None
        up = w.linear(b + "ffn_up.weight", a.dim, a.hidden_dim)
        return T5FFN(up, w.linear(b + "ffn_down.weight", a.hidden_dim, a.dim), gate)

    def load_encoder_layer(self, w: Weights, i: int, shared: F32) -> EncoderLayer:
        b, d = f"enc.blk.{i}.", self.args.dim
        return EncoderLayer(w.vector(b + "attn_norm.weight", d), self.attention_weights(w, b + "attn"),
                            w.vector(b + "ffn_norm.weight", d), self.ffn(w, b), self.rel_bias(w, "enc", i, shared))

    def load_decoder_layer(self, w: Weights, i: int, shared: F32) -> DecoderLayer:
        b, d = f"dec.blk.{i}.", self.args.dim
        return DecoderLayer(w.vector(b + "attn_norm.weight", d), self.attention_weights(w, b + "attn"),
                            w.vector(b + "cross_attn_norm.weight", d), self.attention_weights(w, b + "cross_attn"),
                            w.vector(b + "ffn_norm.weight", d), self.ffn(w, b), self.rel_bias(w, "dec", i, shared))
