"""Tokenizers built from tokenizer.ggml.* metadata, matching llama.cpp's llama-vocab.cpp id for id."""
from __future__ import annotations

import codecs
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from engine.errors import ModelFormatError
from engine.tokenizer.bpe import BpeModel, clean_spaces, parse_merges, pre_tokenizer
from engine.tokenizer.specials import (
    BYTE, CONTROL, EOG_TEXTS, NORMAL, TOKENIZER_KEY as _K, UNDEFINED, UNKNOWN, UNUSED, USER_DEFINED, mark_by_text,
    mark_unused, special_ids,
)
from engine.tokenizer.spm import SPACE, SpmModel
from engine.tokenizer.ugm import UgmModel
from engine.tokenizer.ugm_normalize import CHARSMAP_KEY, CharsMap

log = logging.getLogger(__name__)

MAX_VOCAB = 1 << 23  # well above any real vocabulary (the largest are ~260k)
MAX_MERGES = 1 << 23
# GGUF token_type (llama_token_type: 0 undefined .. 6 byte) -> attribute
_TYPE_TO_ATTR = np.array([UNDEFINED, NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE], dtype=np.int64)
_NUMBER = (int, float, np.integer, np.floating)
_PREFIX = 8  # special tokens are first looked for by their first _PREFIX characters
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _describe(value: Any) -> str:
    """A short type-and-length description of a metadata value, for error messages."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype}[{','.join(str(d) for d in value.shape)}]"
    if isinstance(value, (list, tuple)):
        inner = type(value[0]).__name__ if value else "empty"
        return f"{type(value).__name__}[{len(value)}] of {inner}"
    return type(value).__name__


def _numeric_array(metadata: Mapping[str, Any], key: str, n: int, dtypes: tuple[str, ...]) -> np.ndarray | None:
    """A 1-D array of exactly n items of one of dtypes (the first is the one named in errors), or None if absent."""
    value = metadata.get(key)
    if value is None:
        return None
    want = f"{dtypes[0]}[{n}]"
    if isinstance(value, (list, tuple)):
        kind = float if dtypes[0].startswith("float") else int
        if len(value) == n and all(isinstance(v, _NUMBER) and not isinstance(v, bool) for v in value):
            if kind is int and not all(isinstance(v, (int, np.integer)) for v in value):
                raise ModelFormatError(key, f"must be {want}, got {_describe(value)}")
            return np.asarray(value, dtype=dtypes[0])
        raise ModelFormatError(key, f"must be {want}, got {_describe(value)}")
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.name not in dtypes or len(value) != n:
        raise ModelFormatError(key, f"must be {want}, got {_describe(value)}")
    return value


def _token_list(metadata: Mapping[str, Any]) -> list[str]:
    """tokenizer.ggml.tokens, checked to be a non-empty list of strings."""
    key = _K + "tokens"
    tokens = metadata.get(key)
    if tokens is None:
        raise ModelFormatError(key, "missing: this file has no vocabulary")
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, str) for t in tokens):
        raise ModelFormatError(key, f"must be an array of strings, got {_describe(tokens)}")
    if not tokens or len(tokens) > MAX_VOCAB:
        raise ModelFormatError(key, f"must hold 1 to {MAX_VOCAB} tokens, holds {len(tokens)}")
    return list(tokens)


class Tokenizer:
    """A GGUF vocabulary with llama.cpp's tokenize / token_to_piece / detokenize behaviour."""

    def __init__(self, model_name: str, texts: list[str], token_to_id: dict[str, int], attrs: list[int],
                 byte_value: dict[int, int], ids: dict[str, int | None], flags: dict[str, bool],
                 model: BpeModel | SpmModel | UgmModel):
        self.model_name = model_name  # tokenizer.ggml.model: 'gpt2', 'llama' or 't5'
        self.n_vocab = len(texts)
        self._texts = texts
        self._token_to_id = token_to_id
        self._attrs = attrs
        self._byte_value = byte_value  # id of a <0xXX> byte token -> its byte
        self._model = model
        self._ids = ids
        self.bos_id: int | None = ids["bos"]
        self.eos_id: int | None = ids["eos"]
        self.add_bos: bool = flags["add_bos"]
        self.add_eos: bool = flags["add_eos"]
        self._add_space_prefix = flags["add_space_prefix"]
        self._clean_spaces = flags["clean_spaces"]
        self.eog_ids: frozenset[int] = self._find_eog()
        self._pieces: list[bytes | None] = [None] * self.n_vocab
        # special tokens in the order llama.cpp partitions text: longest (in bytes) first
        special = [i for i, a in enumerate(attrs) if a & (CONTROL | USER_DEFINED | UNKNOWN)]
        special.sort(key=lambda i: -len(texts[i].encode("utf-8")))
        self._special_order = [(i, texts[i], bool(attrs[i] & (CONTROL | UNKNOWN))) for i in special]
        # looking for a few distinct prefixes first keeps partitioning fast with thousands of <unusedN> tokens
        self._special_prefixes = frozenset(texts[i][:_PREFIX] for i in special)

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Tokenizer:
        """Build the tokenizer that tokenizer.ggml.model names ('gpt2' byte-level BPE, 'llama' SPM, 't5' UGM)."""
        key = _K + "model"
        model_name = metadata.get(key)
        if model_name is None:
            raise ModelFormatError(key, "missing: this file has no tokenizer")
        if not isinstance(model_name, str) or model_name not in ("gpt2", "llama", "t5"):
            raise ModelFormatError(key, "unsupported tokenizer (GGUF Lens supports 'gpt2', 'llama' and 't5')",
                                   model_name)
        texts = _token_list(metadata)
        n = len(texts)
        for i, t in enumerate(texts):
            if not t:
                log.warning("empty token at index %d", i)
                texts[i] = f"[EMPTY_{i}]"
        token_to_id: dict[str, int] = {}
        for i, t in enumerate(texts):
            token_to_id[t] = i  # a duplicate string keeps its last id, as llama_vocab::impl::load
        if len(token_to_id) != n:
            log.warning("%s has %d duplicate strings; text lookups use the last id, as llama.cpp", _K + "tokens",
                        n - len(token_to_id))

        types = _numeric_array(metadata, _K + "token_type", n, ("int32",))
        if types is None:
            attrs_arr = np.full(n, NORMAL, dtype=np.int64)
        else:
            t64 = types.astype(np.int64)
            attrs_arr = np.where((t64 >= 0) & (t64 < len(_TYPE_TO_ATTR)), _TYPE_TO_ATTR[np.clip(t64, 0, 6)], UNDEFINED)
        attrs: list[int] = attrs_arr.tolist()

        # llama_vocab::impl::load's defaults: SPM adds BOS and a space prefix, UGM (t5) adds EOS only
        flags = {"add_bos": model_name == "llama", "add_eos": model_name == "t5",
                 "add_space_prefix": model_name == "llama", "clean_spaces": False, "remove_extra_whitespaces": False}
        if model_name == "gpt2":
            pre = pre_tokenizer(metadata.get(_K + "pre"))
            flags["add_bos"] = pre.add_bos
            flags["clean_spaces"] = pre.clean_spaces
        _read_flags(metadata, flags)
        scores = _numeric_array(metadata, _K + "scores", n, ("float32", "int32"))
        if model_name == "gpt2":
            merges = metadata.get(_K + "merges")
            if not isinstance(merges, (list, tuple)) or not all(isinstance(m, str) for m in merges):
                raise ModelFormatError(_K + "merges", f"must be an array of strings, got {_describe(merges)}")
            if len(merges) > MAX_MERGES:
                raise ModelFormatError(_K + "merges", f"holds {len(merges)} merges, more than {MAX_MERGES}")
            ranks, n_bad = parse_merges(list(merges))
            if n_bad:
                log.warning("%s: ignored %d entries that are not 'left right'", _K + "merges", n_bad)
            model: BpeModel | SpmModel | UgmModel = BpeModel(token_to_id, ranks, pre)
        elif model_name == "t5":
            # llama.cpp builds the UGM tries from the token types alone, before special tokens are marked
            model = UgmModel(texts, [0.0] * n if scores is None else scores, list(attrs), _charsmap(metadata),
                             add_space_prefix=flags["add_space_prefix"],
                             remove_extra_whitespaces=flags["remove_extra_whitespaces"])
        else:
            score_list = [0.0] * n if scores is None else scores.astype(np.float64).tolist()
            byte_ids: list[int | None] = []
            for b in range(256):
                tid = token_to_id.get(f"<0x{b:02X}>")
                if tid is None and b < 0x80:
                    tid = token_to_id.get(chr(b))
                byte_ids.append(tid)
            model = SpmModel(token_to_id, score_list, byte_ids, None)

        # byte tokens must read <0xXX>; others are ignored (rendered as nothing)
        byte_value: dict[int, int] = {}
        for i in np.nonzero(attrs_arr & BYTE)[0].tolist():
            m = _BYTE_TOKEN.fullmatch(texts[i])
            if m is None:
                log.warning("byte token %d %r is not of the form <0xXX>; ignoring it", i, texts[i][:20])
                attrs[i] = UNDEFINED
            else:
                byte_value[i] = int(m.group(1), 16)

        ids = special_ids(metadata, model_name, n)
        if isinstance(model, SpmModel):
            model.unk_id = ids["unk"]
        mark_by_text(token_to_id, attrs, ids)
        mark_unused(texts, attrs)
        for role, want in (("bos", "add_bos"), ("eos", "add_eos")):
            if flags[want] and ids[role] is None:
                log.warning("%s is set but the model has no valid %s token; not adding it", want, role.upper())
                flags[want] = False
        tokenizer = cls(model_name, texts, token_to_id, attrs, byte_value, ids, flags, model)
        if isinstance(model, UgmModel):
            model.bind(tokenizer._attrs, ids["unk"])  # scores read user-defined-ness from the final attributes
        return tokenizer

    # -- encoding ---------------------------------------------------------------------------------

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of text, as llama_tokenize(text, add_special, parse_special)."""
        text = _valid_text(text)
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self.bos_id)  # type: ignore[arg-type]
        fragments = self._partition(text, parse_special) if text else []
        if isinstance(self._model, SpmModel):
            prev_special = True  # a space is added before the first fragment and after each special token
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                else:
                    if self._add_space_prefix and prev_special:
                        frag = " " + frag
                    out.extend(self._model.encode(frag.replace(" ", SPACE)))
                    prev_special = False
        else:
            for frag in fragments:  # BPE, and UGM (which adds its space prefix to each fragment as it normalises)
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    out.extend(self._model.encode(frag))
        if add_special and self.add_eos:
            out.append(self.eos_id)  # type: ignore[arg-type]
        return out

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split text around special tokens, longest first (tokenizer_st_partition)."""
        present = {p for p in self._special_prefixes if p in text}
        if not present:
            return [text]
        frags: list[str | int] = [text]
        for tid, tok, control in self._special_order:
            if (control and not parse_special) or tok[:_PREFIX] not in present or tok not in text:
                continue
            new: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or tok not in frag:
                    new.append(frag)
                    continue
                parts = frag.split(tok)
                for k, part in enumerate(parts):
                    if k:
                        new.append(tid)
                    if part:
                        new.append(part)
            frags = new
        return frags

    # -- decoding ---------------------------------------------------------------------------------

    def token_bytes(self, token_id: int, *, special: bool = True) -> bytes:
        """The bytes llama_token_to_piece gives; special tokens render as their text unless special=False."""
        if not 0 <= token_id < self.n_vocab:
            log.debug("token id %d is outside the vocabulary (%d)", token_id, self.n_vocab)
            return b""
        attr = self._attrs[token_id]
        if not special and attr & (UNKNOWN | CONTROL):
            return b""
        piece = self._pieces[token_id]
        if piece is None:
            text = self._texts[token_id]
            if attr & (UNKNOWN | CONTROL | USER_DEFINED):
                piece = text.encode("utf-8")
            elif attr & NORMAL:
                piece = self._model.normal_piece(text)
            elif attr & BYTE:
                piece = bytes((self._byte_value[token_id],))
            else:
                piece = b""
            self._pieces[token_id] = piece
        return piece

    def detokenize(self, ids: Sequence[int], *, remove_special: bool = False, unparse_special: bool = True) -> bytes:
        """Bytes of a token sequence, as llama_detokenize(ids, remove_special, unparse_special)."""
        ids = list(ids)
        remove_space = self._add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for tid in ids:
            piece = self.token_bytes(tid, special=unparse_special)
            if remove_space and piece.startswith(b" "):
                piece = piece[1:]
            remove_space = False
            parts.append(piece)
        out = b"".join(parts)
        return clean_spaces(out) if self._clean_spaces else out

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of a token sequence; invalid UTF-8 becomes U+FFFD."""
        raw = self.detokenize(ids, remove_special=skip_special, unparse_special=not skip_special)
        return raw.decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """A display string for one token (undecodable bytes shown as \\xNN); never raises."""
        try:
            if not 0 <= int(token_id) < self.n_vocab:
                return f"<invalid token {token_id}>"
            piece = self.token_bytes(int(token_id))
            if not piece:
                return self._texts[token_id]
            return piece.decode("utf-8", errors="backslashreplace")
        except Exception:  # display must never fail
            return f"<token {token_id!r}>"

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary string is exactly text, or None."""
        return self._token_to_id.get(text)

    def is_special(self, token_id: int) -> bool:
        """Whether the token is a control or unknown token (what decode(skip_special=True) drops)."""
        return 0 <= token_id < self.n_vocab and bool(self._attrs[token_id] & (CONTROL | UNKNOWN))

    def _find_eog(self) -> frozenset[int]:
        """End-of-generation ids: eos, eot, eom, FIM pad/repo/sep and known end-of-turn texts (as llama.cpp)."""
        ids = self._ids
        eog = {ids[r] for r in ("fim_pad", "fim_rep", "fim_sep", "eos", "eot", "eom") if ids[r] is not None}
        eog |= {self._token_to_id[t] for t in EOG_TEXTS if t in self._token_to_id}
        texts = {self._texts[i]: i for i in eog}
        # gpt-oss / solar-open: <|end|> is not an end of generation when these are present
        if "<|end|>" in texts and (("<|return|>" in texts and "<|call|>" in texts) or
                                   ("<|calls|>" in texts and "<|flush|>" in texts)):
            eog.discard(texts["<|end|>"])
            self._attrs[texts["<|end|>"]] = USER_DEFINED
        if "<|tool_response>" in texts and "</s>" in texts:  # gemma 4
            eog.discard(texts["</s>"])
            self._attrs[texts["</s>"]] = NORMAL
        return frozenset(eog)


class StreamDecoder:
    """Incremental detokenizer that never splits a UTF-8 character across outputs."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._special = not skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, token_id: int) -> str:
        """Text completed by this token (possibly empty while a character is still partial)."""
        return self._decoder.decode(self._tokenizer.token_bytes(token_id, special=self._special))

    def flush(self) -> str:
        """Text still buffered; a trailing partial character becomes U+FFFD."""
        out = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return out


def _read_flags(metadata: Mapping[str, Any], flags: dict[str, bool]) -> None:
    """Override the default flags with the tokenizer.ggml.* booleans the file sets."""
    keys = {"add_bos": _K + "add_bos_token", "add_eos": _K + "add_eos_token",
            "add_space_prefix": _K + "add_space_prefix", "remove_extra_whitespaces": _K + "remove_extra_whitespaces"}
    for name, full in keys.items():
        value = metadata.get(full)
        if value is not None:
            if isinstance(value, bool):
                flags[name] = value
            else:
                log.warning("%s should be a bool, got %s; ignoring it", full, _describe(value))


def _charsmap(metadata: Mapping[str, Any]) -> CharsMap | None:
    """The parsed tokenizer.ggml.precompiled_charsmap (an int8/uint8 array), or None when absent (no normalisation,
    as llama.cpp: the converter writes none for a SentencePiece model whose normaliser is the identity)."""
    value = metadata.get(CHARSMAP_KEY)
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.name in ("uint8", "int8"):
        return CharsMap(value.tobytes())
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                                                and -128 <= v < 256 for v in value):
        return CharsMap(bytes(int(v) & 0xFF for v in value))
    raise ModelFormatError(CHARSMAP_KEY, f"must be an array of uint8 or int8, got {_describe(value)}")


def _valid_text(text: str) -> str:
    """text with lone surrogates (not encodable as UTF-8) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", errors="surrogatepass").decode("utf-8", errors="replace")
