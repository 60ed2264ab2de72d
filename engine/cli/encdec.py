"""The CLI's encoder-decoder (T5) side: `logits` with --encoder-tokens-file, `perplexity` with --encoder-text.

`gguf-lens logits T5.gguf --encoder-tokens-file E.json --tokens-file D.json --out OUT.npy` encodes E once (as
llama_encode does) and writes the decoder's float32 logits [len(D), n_vocab] at every position of D, run exactly
as given (D starts with the decoder start token, as llama.cpp's decoder input does; `decoder_start_token` names it).
`gguf-lens perplexity T5.gguf --encoder-text E --text T` is the perplexity of T's tokens given E: each predicted
from the start token and the tokens before it (teacher forcing, as a seq2seq model's loss is taken), both texts
tokenized as `generate` tokenizes a prompt (with the EOS that T5's vocabulary adds). llama-perplexity has no such
mode: it runs a T5 decoder alone, against an encoder output never computed, so a T5 file without an encoder text
is refused rather than given that number.
`generate` needs nothing from here: engine.generate encodes the prompt of an encoder-decoder model itself and
decodes from the start token. A decoder-only model given an encoder input, or a T5 model without one, is
refused with one line that says what to give instead.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import numpy as np

from engine.cli.options import read_text_file
from engine.errors import SettingError

ENCODER_FLAG = "--encoder-tokens-file"
ENCODER_TEXT_FLAGS = "--encoder-text or --encoder-text-file"


def is_encoder_decoder(model: Any) -> bool:  # noqa: ANN401 - a loaded engine.model.Model
    """True for a model with an encoder (T5)."""
    return bool(getattr(model.net, "is_encoder_decoder", False))


def wants(args: argparse.Namespace, model: Any) -> bool:  # noqa: ANN401
    """True when `logits` runs the encoder-decoder way; SettingError when the options and the model disagree."""
    given = getattr(args, "encoder_tokens_file", None) is not None
    if given and not is_encoder_decoder(model):
        raise SettingError(f"{ENCODER_FLAG}: {model.arch} is a decoder-only model and has no encoder; "
                           "give its tokens with --tokens-file alone")
    if is_encoder_decoder(model) and not given:
        raise SettingError(f"{model.arch} is an encoder-decoder model: give the encoder's input with {ENCODER_FLAG} "
                           f"and the decoder's tokens with --tokens-file (starting with the decoder start token "
                           f"{_start_token(model)})")
    return given


def read_ids(path: str, flag: str) -> list[int]:
    """A JSON list of integers from `path`; SettingError naming the flag otherwise."""
    try:
        ids = json.loads(read_text_file(path, flag))
    except ValueError as exc:
        raise SettingError(f"{flag} {path}: not JSON ({exc})") from None
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise SettingError(f"{flag} {path}: must be a JSON list of integers")
    if not ids:
        raise SettingError(f"{flag} {path}: the list is empty")
    return ids


def decoder_logits(model: Any, enc_ids: list[int], dec_ids: list[int], chunk: int = 256) -> np.ndarray:  # noqa: ANN401
    """The decoder's logits (len(dec_ids), n_vocab) at every position of dec_ids, given the encoder input enc_ids."""
    from engine.generate import prefill  # noqa: PLC0415 - the CLI's modules load the engine on demand

    if len(dec_ids) > model.args.n_ctx:
        raise SettingError(f"--tokens-file: {len(dec_ids)} decoder tokens, more than the model's context {model.args.n_ctx}")
    if len(enc_ids) > model.args.n_ctx:  # llama_encode reads its whole input in one ubatch, at most n_ctx tokens
        raise SettingError(f"the encoder input is {len(enc_ids)} tokens, more than the model's context "
                           f"{model.args.n_ctx} (the encoder reads it all at once)")
    model.gguf.check_unchanged()
    cache = model.new_cache()
    model.net.encode(enc_ids, cache)
    logits = prefill(model, dec_ids, cache, all_logits=True, chunk_size=chunk)
    assert logits is not None  # no cancel event was given
    return logits


def cmd_logits(args: argparse.Namespace, model: Any) -> int:  # noqa: ANN401
    """`logits` of an encoder-decoder model: the decoder's logits at every position of --tokens-file."""
    if not getattr(args, "tokens_file", None):
        raise SettingError(f"{ENCODER_FLAG} needs the decoder's tokens as --tokens-file (not --text-file)")
    enc = read_ids(args.encoder_tokens_file, ENCODER_FLAG)
    dec = read_ids(args.tokens_file, "--tokens-file")
    logits = decoder_logits(model, enc, dec, getattr(args, "chunk", 256))
    np.save(args.out, logits.astype(np.float32))
    print(f"wrote {args.out}: {logits.shape[0]} x {logits.shape[1]} float32 (decoder positions, given "
          f"{len(enc)} encoder tokens)", file=sys.stderr)
    return 0


def perplexity_encoder_text(args: argparse.Namespace, model: Any) -> str | None:  # noqa: ANN401
    """The encoder text `perplexity` runs against (None: a decoder-only run); SettingError when options and model
    disagree."""
    text = None
    if getattr(args, "encoder_text", None) is not None:
        text = args.encoder_text
    elif getattr(args, "encoder_text_file", None):
        text = read_text_file(args.encoder_text_file, "--encoder-text-file")
    if text is not None and not is_encoder_decoder(model):
        raise SettingError(f"{ENCODER_TEXT_FLAGS}: {model.arch} is a decoder-only model and has no encoder; "
                           "its perplexity is of --text or --text-file alone")
    if is_encoder_decoder(model) and text is None:
        raise SettingError(f"{model.arch} is an encoder-decoder model: its perplexity is of a decoder text given an "
                           f"encoder input; give the input with {ENCODER_TEXT_FLAGS} (llama-perplexity would run the "
                           "decoder alone, against an encoder output it never computed)")
    return text


def perplexity(model: Any, enc_ids: list[int], dec_ids: list[int], chunk: int = 256) -> dict[str, Any]:  # noqa: ANN401
    """exp(mean NLL) of every token of dec_ids given the encoder input enc_ids, each predicted from the decoder
    start token and the tokens of dec_ids before it."""
    from engine.generate import log_softmax  # noqa: PLC0415

    if not enc_ids or not dec_ids:
        raise SettingError("perplexity needs at least one encoder token and one decoder token")
    logits = decoder_logits(model, enc_ids, [model.net.decoder_start_token, *dec_ids[:-1]], chunk)
    nll = -log_softmax(logits)[np.arange(len(dec_ids)), np.asarray(dec_ids)]
    return {"ppl": float(math.exp(float(np.mean(nll, dtype=np.float64)))), "tokens": len(dec_ids),
            "encoder_tokens": len(enc_ids)}


def cmd_perplexity(args: argparse.Namespace, model: Any, encoder_text: str, text: str) -> int:  # noqa: ANN401
    """`perplexity` of an encoder-decoder model: the decoder text's perplexity given the encoder text."""
    tok = model.tokenizer
    enc = tok.encode(encoder_text, add_special=True, parse_special=False)
    dec = tok.encode(text, add_special=True, parse_special=False)
    out = perplexity(model, enc, dec, getattr(args, "chunk", 256))
    if args.json:
        print(json.dumps(out))
    else:
        print(f"perplexity {out['ppl']:.4f} over {out['tokens']} decoder tokens given {out['encoder_tokens']} "
              "encoder tokens")
    return 0


def _start_token(model: Any) -> str:  # noqa: ANN401
    try:
        return str(model.net.decoder_start_token)
    except SettingError:
        return "(none in this file)"
