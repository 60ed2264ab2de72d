"""The encoder-decoder graph (T5's, as llama.cpp's t5.cpp builds it): `encode` once, then `forward` the decoder.

`EncoderDecoderModel.encode(ids, cache)` is llama_encode: the encoder stack (pre-norm blocks, bidirectional
self-attention with the learned position bias, the FFN), the encoder's output norm, then every decoder layer's
cross-attention keys and values from the output rows, all kept on the cache (engine.models.encoder_decoder).
`forward(ids, cache)` is llama_decode against that encoding: per decoder block, causal self-attention with the
position bias over the decoder's KV cache, cross-attention on the encoder output, the FFN; the output norm and
head give the logits. No RoPE and no score scaling (kq_scale 1): where a head looks by distance is the bias alone.
Attention and the cache read come from engine.ops.attention_bias by the numerics' name (llama.cpp's kernels and
padding for 'ggml', the textbook maths for 'float32'). An architecture file loads the tensors into the fields below.
`probe`, when given, sees each attention's softmax weights (engine.observe.t5_maps); a `recorder` (engine.observe)
given to `forward` sees what it sees of a decoder-only model: the residual stream after each decoder block (the
logit lens) and the input rows of each decoder product (record_input, where llama-imatrix's callback would look).
Nothing is kept otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import numpy.typing as npt

from engine.errors import SettingError
from engine.models.args import BaseArgs
from engine.models.decoder import DecoderModel, Numerics
from engine.models.encoder_decoder import (
    DecoderLayer,
    EncoderDecoderCache,
    EncoderLayer,
    EncoderOutput,
    Probe,
    position_bias,
)
from engine.models.weights import Weights
from engine.ops import attention_bias
from engine.ops.reference import causal_mask
from engine.tensor import Linear, QTensor

if TYPE_CHECKING:  # the recorder is passed in; models never build one
    from engine.observe.recorder import Recorder

F32 = npt.NDArray[np.float32]


@dataclass
class EncoderDecoderArgs(BaseArgs):
    """BaseArgs (n_layers: the encoder's blocks) plus the decoder's blocks, the buckets and the start token."""

    n_dec_layers: int = 0  # decoder_block_count, else block_count
    n_buckets: int = 32  # attention.relative_buckets_count
    dec_start: int | None = None  # decoder_start_token_id, else tokenizer.ggml.bos_token_id, else None


class EncoderDecoderModel(DecoderModel):
    """The graph; an architecture's __init__ fills the weights below (after calling this one's)."""

    is_encoder_decoder: ClassVar[bool] = True
    forward_hidden = None  # its forward runs the encoder and the decoder: no residual stream to stop at (Model says so)
    args: EncoderDecoderArgs
    tok_embd: QTensor
    enc_layers: list[EncoderLayer]
    enc_out_norm: F32
    dec_layers: list[DecoderLayer]
    out_norm: F32
    output: Linear

    def __init__(self, args: EncoderDecoderArgs, weights: Weights, ops: Numerics):
        super().__init__(args, weights, ops)
        self.attend, self.read_cache = attention_bias.NUMERICS[ops.name]

    def new_cache(self, n_ctx: int | None = None, cache_type: str | None = None) -> EncoderDecoderCache:
        """The decoder's KV cache (n_ctx decoder positions), which also keeps the encoding it decodes against."""
        a = self.args
        return EncoderDecoderCache(a.n_dec_layers, a.n_kv_heads, a.head_dim, n_ctx or a.n_ctx,
                                   cache_type or self.ops.cache_type)

    @property
    def decoder_start_token(self) -> int:
        """The decoder's first token: decoder_start_token_id, else BOS; SettingError when the file has neither."""
        if self.args.dec_start is None:
            raise SettingError(f"this {self.arch_name} file has no decoder_start_token_id and no BOS token to start decoding "
                               "from")
        return self.args.dec_start

    def embed(self, ids: npt.NDArray[np.int64]) -> F32:
        return self.ops.embed_rows(self, self.tok_embd, ids)  # (T, dim), unscaled

    def heads(self, y: F32, n: int) -> F32:
        """(T, n * d) product rows -> (n, T, d)."""
        return y.reshape(y.shape[0], n, self.args.head_dim).transpose(1, 0, 2).copy()  # made contiguous

    def encode(self, tokens: npt.ArrayLike, cache: EncoderDecoderCache | None = None,
               probe: Probe | None = None) -> EncoderOutput:
        """Run the encoder on `tokens` (llama_encode): its output rows and each decoder layer's cross K/V, kept on
        `cache` when given (which then decodes against it). `probe` sees each layer's attention weights."""
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise SettingError("the encoder input is empty")
        self.check_tokens(ids)
        a, ops = self.args, self.ops
        x = self.embed(ids)
        pos = np.arange(ids.size)
        for i, layer in enumerate(self.enc_layers):
            h = self.norm(x, layer.attn_norm)
            q, k, v = (self.heads(m(h), n) for m, n in ((layer.attn.wq, a.n_heads), (layer.attn.wk, a.n_kv_heads),
                                                        (layer.attn.wv, a.n_kv_heads)))
            o, weights = self.attend(q, k, v, position_bias(layer.rel_bias, pos, pos, True), None, 1.0)
            if probe is not None:
                probe("encoder", i, weights)
            x = layer.attn.wo(o.transpose(1, 0, 2).reshape(ids.size, -1)) + x
            x = layer.ffn(self.norm(x, layer.ffn_norm), ops) + x
        rows = self.norm(x, self.enc_out_norm)
        out = EncoderOutput(tuple(int(t) for t in ids), rows)
        for layer in self.dec_layers:  # build_attn's Kcur / Vcur of the cross-attention: wk_cross x embd_enc
            out.cross_k.append(self.heads(layer.cross.wk(rows), a.n_kv_heads))
            out.cross_v.append(self.heads(layer.cross.wv(rows), a.n_kv_heads))
        if cache is not None:
            cache.set_encoding(out)
        return out

    def forward(self, tokens: npt.ArrayLike, cache: EncoderDecoderCache, recorder: Recorder | None = None,
                all_logits: bool = False, probe: Probe | None = None) -> F32:
        """Decoder tokens at positions [cache.length, +T) against the cache's encoding; logits (T or 1, n_vocab).

        Writes the decoder's K/V for the new positions into the cache but does not commit them."""
        enc = getattr(cache, "encoding", None)
        if enc is None:
            raise SettingError(f"a {self.arch_name} model decodes against an encoder input: encode one first "
                               "(the CLI's --encoder-tokens-file, or the prompt with `generate`)")
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise SettingError("no decoder tokens to run")
        self.check_tokens(ids)
        t, start = ids.size, cache.length
        cache.reserve(start + t)
        if recorder is not None:
            recorder.begin(start, t)
        x = self.embed(ids)
        pos, end = np.arange(start, start + t), start + t
        mask = causal_mask(pos, end)
        for i, layer in enumerate(self.dec_layers):
            x = self.self_attention(i, layer, self.norm(x, layer.attn_norm), pos, cache, mask, probe, recorder) + x
            x = self.cross_attention(i, layer, self.norm(x, layer.cross_norm), enc, probe, recorder) + x
            x = layer.ffn(self.norm(x, layer.ffn_norm), self.ops, recorder) + x
            if recorder is not None:  # the residual stream after the block: what the logit lens reads
                recorder.record_hidden(i, start, x)
        return self.head(x, all_logits)

    def self_attention(self, i: int, layer: DecoderLayer, h: F32, pos: np.ndarray, cache: EncoderDecoderCache,
                       mask: npt.NDArray[np.bool_], probe: Probe | None, recorder: Recorder | None = None) -> F32:
        """Decoder layer i's causal self-attention with the position bias: the output product's rows (T, dim)."""
        a, t, end = self.args, h.shape[0], int(pos[-1]) + 1
        if recorder is not None:  # the inputs of the products, for an importance matrix
            recorder.record_input(layer.attn.names("wq", "wk", "wv"), h)
        q = self.heads(layer.attn.wq(h), a.n_heads)
        k = self.heads(layer.attn.wk(h), a.n_kv_heads)
        v = self.heads(layer.attn.wv(h), a.n_kv_heads)
        cache.put(i, int(pos[0]), k, v)
        keys, values, n_kv = self.read_cache(cache, i, end)
        bias = position_bias(layer.rel_bias, pos, np.arange(end), False)
        o, weights = self.attend(q, keys, values, bias, mask, 1.0, n_kv)
        if probe is not None:
            probe("decoder", i, weights)
        o = o.transpose(1, 0, 2).reshape(t, -1)
        if recorder is not None:
            recorder.record_input(layer.attn.names("wo"), o)
        return layer.attn.wo(o)

    def cross_attention(self, i: int, layer: DecoderLayer, h: F32, enc: EncoderOutput, probe: Probe | None,
                        recorder: Recorder | None = None) -> F32:
        """Decoder layer i's cross-attention: its queries over the encoder output's keys (no bias, no mask)."""
        if recorder is not None:  # llama.cpp's decoder graph multiplies the encoder output by wk/wv on every call
            recorder.record_input(layer.cross.names("wq"), h)
            recorder.record_input(layer.cross.names("wk", "wv"), enc.rows)
        q = self.heads(layer.cross.wq(h), self.args.n_heads)
        o, weights = self.attend(q, enc.cross_k[i], enc.cross_v[i], None, None, 1.0)
        if probe is not None:
            probe("cross", i, weights)
        o = o.transpose(1, 0, 2).reshape(h.shape[0], -1)
        if recorder is not None:
            recorder.record_input(layer.cross.names("wo"), o)
        return layer.cross.wo(o)

    def head(self, x: F32, all_logits: bool) -> F32:
        return self.output(self.norm(x if all_logits else x[-1:], self.out_norm))

    def linears(self) -> dict[str, Linear]:
        """Every matrix by tensor name: the encoder's blocks, the decoder's, then the output."""
        out = {lin.weight.name: lin for layer in [*self.enc_layers, *self.dec_layers] for lin in layer.linears()}
        out[self.output.weight.name] = self.output
        return out

    def warm_pass(self) -> None:
        """What a warm-up runs (engine.runtime.warmup): a two-token encoding, a two-token prompt, one step."""
        cache = self.new_cache(min(256, self.args.n_ctx))
        self.encode(np.zeros(2, np.int64), cache)
        self.forward(np.zeros(2, np.int64), cache)
        cache.commit([0, 0])
        self.forward(np.zeros(1, np.int64), cache)
