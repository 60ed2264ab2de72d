"""The CLI's encoder-decoder (T5) side: `logits` with --encoder-tokens-file.

`gguf-lens logits T5.gguf --encoder-tokens-file E.json --tokens-file D.json --out OUT.npy` encodes E once (as
llama_encode does) and writes the decoder's float32 logits [len(D), n_vocab] at every position of D, run exactly
as given (D starts with the decoder start token, as llama.cpp's decoder input does; `decoder_start_token` names it).
`generate` needs nothing from here: engine.generate encodes the prompt of an encoder-decoder model itself and
decodes from the start token. A decoder-only model given --encoder-tokens-file, or a T5 model without it, is
refused with one line that says what to give instead.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from engine.cli.options import read_text_file
from engine.errors import SettingError

ENCODER_FLAG = "--encoder-tokens-file"


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


def _start_token(model: Any) -> str:  # noqa: ANN401
    try:
        return str(model.net.decoder_start_token)
    except SettingError:
        return "(none in this file)"
