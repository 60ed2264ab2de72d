"""Which token a user means: `#id`, or a text that is one token of the model's vocabulary, and the prompt it reads.

A target or contrast is given as `#1234` (the id) or as text. Text is looked up first as a vocabulary string exactly
as the file stores it (`Ġmat` in a byte-level BPE vocabulary), then as what the tokenizer makes of it (` mat` is one
token in most BPE vocabularies); text the tokenizer splits into several tokens is refused with the pieces named, since
a logit belongs to one token. Every refusal is a SettingError with a message a user can act on.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.errors import SettingError

if TYPE_CHECKING:
    from engine.model import Model
    from engine.tokenizer.vocab import Tokenizer

MAX_SHOWN = 6  # pieces named in a refusal


@dataclass(frozen=True)
class Token:
    """One vocabulary entry: its id and its text as the reply would show it."""

    id: int
    text: str


def resolve_token(tokenizer: Tokenizer, spec: str | int, what: str = "target") -> Token:
    """The token `spec` names: an int or '#id', else a vocabulary string or a text that tokenizes to one token."""
    n_vocab = tokenizer.n_vocab
    if isinstance(spec, bool):
        raise SettingError(f"{what}: {spec!r} is not a token (give its text or #id)")
    if isinstance(spec, int):
        return _by_id(tokenizer, spec, what)
    text = str(spec)
    if text.startswith("#") and len(text) > 1:
        digits = text[1:]
        if not digits.lstrip("-").isdigit():
            raise SettingError(f"{what} {text!r}: '#' must be followed by a token id (0..{n_vocab - 1})")
        return _by_id(tokenizer, int(digits), what)
    if not text:
        raise SettingError(f"{what}: an empty text is no token (give its text or #id)")
    exact = tokenizer.token_id(text)
    if exact is not None:
        return Token(exact, tokenizer.token_text(exact))
    ids = tokenizer.encode(text, add_special=False, parse_special=True)
    if len(ids) == 1:
        return Token(ids[0], tokenizer.token_text(ids[0]))
    if not ids:
        raise SettingError(f"{what} {text!r}: the tokenizer makes no token of it")
    pieces = ", ".join(f"{tokenizer.token_text(i)!r} (#{i})" for i in ids[:MAX_SHOWN])
    more = f" and {len(ids) - MAX_SHOWN} more" if len(ids) > MAX_SHOWN else ""
    raise SettingError(f"{what} {text!r} is not one token of the vocabulary: it tokenizes to {len(ids)} tokens "
                       f"({pieces}{more}); give one of them, as its text or #id")


def _by_id(tokenizer: Tokenizer, token_id: int, what: str) -> Token:
    if not 0 <= token_id < tokenizer.n_vocab:
        raise SettingError(f"{what} #{token_id}: not in the vocabulary (ids 0..{tokenizer.n_vocab - 1})")
    return Token(token_id, tokenizer.token_text(token_id))


def prompt_ids(model: Model, prompt: str | Sequence[int]) -> list[int]:
    """The prompt's token ids: a text as the model's tokenizer makes it for a document (BOS where the metadata adds
    one), or ids as given (each checked against the vocabulary); refused when empty or longer than the context."""
    if isinstance(prompt, str):
        ids = model.tokenizer.encode(prompt, add_special=True, parse_special=False)
    else:
        ids = [int(i) for i in prompt]
        bad = [i for i in ids if not 0 <= i < model.args.n_vocab]
        if bad:
            raise SettingError(f"prompt token #{bad[0]} is not in the vocabulary (ids 0..{model.args.n_vocab - 1})")
    if not ids:
        raise SettingError("the prompt has no tokens: there is no position to attribute")
    if len(ids) > model.args.n_ctx:
        raise SettingError(f"the prompt is {len(ids)} tokens, longer than the model's context {model.args.n_ctx}")
    return ids


def decoder_ids(model: Model, decoder: str | Sequence[int] | None) -> list[int]:
    """An encoder-decoder's decoder tokens after its start token: a text as its tokenizer makes it without special
    tokens (what a reply's text reads as), or ids as given (checked); none by default."""
    if decoder is None:
        return []
    if isinstance(decoder, str):
        ids = model.tokenizer.encode(decoder, add_special=False, parse_special=False)
    else:
        ids = [int(i) for i in decoder]
        bad = [i for i in ids if not 0 <= i < model.args.n_vocab]
        if bad:
            raise SettingError(f"decoder token #{bad[0]} is not in the vocabulary (ids 0..{model.args.n_vocab - 1})")
    if len(ids) + 1 > model.args.n_ctx:
        raise SettingError(f"the decoder's {len(ids) + 1} tokens are longer than the model's context {model.args.n_ctx}")
    return ids


def resolve_position(position: int | None, n_tokens: int) -> int:
    """The position whose next-token logits are attributed: the last by default; -k counts from the end."""
    if position is None:
        return n_tokens - 1
    p = int(position)
    if not -n_tokens <= p < n_tokens:
        raise SettingError(f"position {p} is past the prompt's {n_tokens} tokens (positions 0..{n_tokens - 1}, "
                           f"or -1..-{n_tokens} from the end)")
    return p % n_tokens
