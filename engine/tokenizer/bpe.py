"""Byte-level BPE (tokenizer.ggml.model = 'gpt2'): pre-tokenizer regexes per tokenizer.ggml.pre and ranked merges."""
from __future__ import annotations

import heapq
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from engine.tokenizer import long_words
from engine.tokenizer.categories import GPT2_CUSTOM, SplitPattern, compile_pattern, split_offsets

log = logging.getLogger(__name__)

# Pre-tokenizer expressions, verbatim as llm_tokenizer_bpe in llama.cpp's src/llama-vocab.cpp. Each pattern in a
# list splits the pieces left by the one before; text between matches becomes a piece of its own. They are run
# as llama.cpp runs them (categories.py): on text collapsed to llama.cpp's own Unicode categories
# (src/unicode-data.cpp, older than the Unicode data of Python's `re` or the `regex` module), so a code point is
# a letter, a digit or whitespace exactly when llama.cpp says so.
_GPT2 = GPT2_CUSTOM
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_LLM = [
    r"[\r\n]",
    r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",  # noqa: E501 (\u: code points that NFC would fold)
    r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
    r"\s+$",
    r"[一-龥ࠀ-一가-퟿]+",
    r"\p{N}+",
]

_DEEPSEEK3 = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]

# tokenizer.ggml.pre -> (regex list, clean_spaces, ignore_merges, add_bos default), as llama_vocab::impl::load
_PRE_DEFAULT = ([r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"], True, False, False)
_PRE_TABLE: dict[str, tuple[list[str], bool, bool, bool]] = {
    "default": _PRE_DEFAULT,
    "deepseek-llm": (_DEEPSEEK_LLM, False, False, False),
    "deepseek-coder": ([r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
                       False, False, False),
    "deepseek-v3": (_DEEPSEEK3, False, False, False),
    "hunyuan-dense": (_DEEPSEEK3, False, False, False),
    "falcon": ([r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"], True, False, False),
    "qwen35": ([_QWEN35], False, False, False),
    "dbrx": ([_LLAMA3], True, False, False),
    "smaug-bpe": ([_LLAMA3], True, False, False),
    "glm4": ([_LLAMA3], True, False, False),
    "chatglm-bpe": ([_LLAMA3], True, False, False),
    "tekken": ([_TEKKEN], False, True, True),
    "poro-chat": ([r" ?[^(\s|.,!?…。，、।۔،)]+"], False, False, False),
    "bloom": ([r" ?[^(\s|.,!?…。，、।۔،)]+"], True, False, False),
    "gpt3-finnish": ([r" ?[^(\s|.,!?…。，、।۔،)]+"], True, False, False),
}
for _name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"):
    _PRE_TABLE[_name] = ([_LLAMA3], True, True, True)
for _name in ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
              "mellum", "modern-bert", "mpt", "olmo", "jais", "exaone4", "jina-v1-en", "jina-v2-code",
              "roberta-bpe"):
    _PRE_TABLE[_name] = ([_GPT2], True, False, False)
for _name in ("trillion", "granite-docling"):
    _PRE_TABLE[_name] = ([_GPT2], False, False, False)
for _name in ("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"):
    _PRE_TABLE[_name] = ([r"\p{N}", _GPT2], True, False, False)
for _name in ("smollm", "command-r"):
    _PRE_TABLE[_name] = ([r"\p{N}", _GPT2], False, False, False)
for _name in ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"):
    _PRE_TABLE[_name] = ([_QWEN2], False, False, False)
for _name in ("stablelm2", "megrez"):
    _PRE_TABLE[_name] = ([_QWEN2], True, False, False)
for _name in ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"):
    _PRE_TABLE[_name] = ([_GPT4O], False, False, False)

_WORD_CACHE_MAX = 50_000


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-in character for each byte value (as unicode_byte_to_utf8_map)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = [""] * 256
    n = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


BYTE_TO_CHAR: list[str] = _bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_BYTE_TRANS = {b: BYTE_TO_CHAR[b] for b in range(256)}


@dataclass(frozen=True)
class PreTokenizer:
    """The pre-tokenizer settings llama.cpp derives from tokenizer.ggml.pre."""

    name: str
    patterns: tuple[SplitPattern, ...]
    clean_spaces: bool
    ignore_merges: bool
    add_bos: bool


def pre_tokenizer(name: object) -> PreTokenizer:
    """The pre-tokenizer for a tokenizer.ggml.pre value; unknown, missing or non-string values get 'default' with a warning."""
    if not isinstance(name, str):
        if name is not None:
            log.warning("tokenizer.ggml.pre is a %s, not a string; using the 'default' pre-tokenizer", type(name).__name__)
        name = None
    if name is None or name == "":
        log.warning("tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer (quality may suffer)")
        name = "default"
    entry = _PRE_TABLE.get(name)
    if entry is None:
        log.warning("tokenizer.ggml.pre = %r is not known to GGUF Lens; using the 'default' pre-tokenizer", name)
        entry = _PRE_DEFAULT
    _, clean, ignore, add_bos = entry
    return PreTokenizer(name, _compiled(name if name in _PRE_TABLE else "default"), clean, ignore, add_bos)


_COMPILED: dict[str, tuple[SplitPattern, ...]] = {}


def _compiled(name: str) -> tuple[SplitPattern, ...]:
    """The split patterns of a known pre-tokenizer, compiled once."""
    patterns = _COMPILED.get(name)
    if patterns is None:
        patterns = _COMPILED[name] = tuple(compile_pattern(e) for e in _PRE_TABLE[name][0])
    return patterns


def split_words(text: str, patterns: tuple[SplitPattern, ...]) -> list[str]:
    """Split text with each pattern in turn; unmatched text between matches stays a piece (unicode_regex_split)."""
    return [text[a:b] for a, b in split_offsets(text, patterns)]


def byte_encode(word: str) -> str:
    """Map a word's UTF-8 bytes to GPT-2's byte characters (unicode_byte_encoding_process)."""
    return word.encode("utf-8").decode("latin-1").translate(_BYTE_TRANS)


class MergeRanks(Mapping[tuple[str, str], int]):
    """{(left, right): rank}, llama.cpp's bpe_ranks, held as {"left right": rank} on the GGUF's merge strings
    themselves: no pair tuple and no substrings per merge (~8 MiB less for a 49k-merge vocabulary). A merge's left
    part is what precedes its first space after index 0, so a pair whose left part has a space there is no merge."""

    __slots__ = ("_by_text",)

    def __init__(self, by_text: dict[str, int]):
        self._by_text = by_text

    def get(self, key: tuple[str, str], default: int | None = None) -> int | None:  # type: ignore[override]
        left, right = key
        if left.find(" ", 1) >= 0:
            return default
        return self._by_text.get(left + " " + right, default)

    def __getitem__(self, key: tuple[str, str]) -> int:
        rank = self.get(key)
        if rank is None:
            raise KeyError(key)
        return rank

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and len(key) == 2 and self.get(key) is not None

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for text in self._by_text:
            pos = text.find(" ", 1)
            yield text[:pos], text[pos + 1 :]

    def __len__(self) -> int:
        return len(self._by_text)


def parse_merges(merges: list[str]) -> tuple[MergeRanks, int]:
    """Rank table from 'left right' strings (split at the first space after index 0); returns (ranks, n_bad)."""
    by_text: dict[str, int] = {}
    n_bad = 0
    for rank, merge in enumerate(merges):
        if not isinstance(merge, str) or merge.find(" ", 1) < 0:
            n_bad += 1
            continue
        by_text.setdefault(merge, rank)
    return MergeRanks(by_text), n_bad


def merge_word(symbols: list[str], ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """Apply BPE merges lowest rank first, leftmost first on ties (llm_tokenizer_bpe_session::tokenize)."""
    n = len(symbols)
    if n < 2:
        return symbols
    text = list(symbols)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap: list[tuple[int, int, int, str]] = []
    for i in range(n - 1):
        rank = ranks.get((text[i], text[i + 1]))
        if rank is not None:
            heap.append((rank, i, i + 1, text[i] + text[i + 1]))
    heapq.heapify(heap)
    while heap:
        _, left, right, merged = heapq.heappop(heap)
        lt, rt = text[left], text[right]
        if not lt or not rt or lt + rt != merged:
            continue  # outdated pair
        text[left] = merged
        text[right] = ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prv[nxt[right]] = left
        for a, b in ((prv[left], left), (left, nxt[left])):
            if a >= 0 and b >= 0:
                rank = ranks.get((text[a], text[b]))
                if rank is not None:
                    heapq.heappush(heap, (rank, a, b, text[a] + text[b]))
    return [t for t in text if t]


class BpeModel:
    """Encodes raw text fragments with byte-level BPE; decodes normal tokens back to bytes."""

    def __init__(self, token_to_id: Mapping[str, int], ranks: Mapping[tuple[str, str], int], pre: PreTokenizer):
        self.token_to_id = token_to_id
        self.ranks = ranks
        self.pre = pre
        self._cache: dict[str, tuple[int, ...]] = {}
        self._merger: long_words.Merger | None = None  # built on the first very long word

    def encode(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment (no special tokens inside)."""
        out: list[int] = []
        for word in split_words(text, self.pre.patterns):
            ids = self._cache.get(word)
            if ids is None:
                ids = self._encode_word(byte_encode(word))
                if len(word) >= long_words.LONG_WORD:
                    out.extend(ids)
                    continue
                if len(self._cache) >= _WORD_CACHE_MAX:
                    self._cache.clear()
                self._cache[word] = ids
            out.extend(ids)
        return out

    def _encode_word(self, word: str) -> tuple[int, ...]:
        vocab = self.token_to_id
        if self.pre.ignore_merges and word in vocab:
            return (vocab[word],)
        if len(word) >= long_words.LONG_WORD and long_words.available():
            # a very long word merges in compiled code, in the same order, and brings its ids from there
            if self._merger is None:
                self._merger = long_words.Merger.for_bpe(self.ranks, vocab)
            found, rest = self._merger.merge_ids(word, vocab)
            if not rest:
                return tuple(found)  # type: ignore[arg-type]
            strings = iter(rest)
            symbols = [(tid, "") if tid is not None else (None, next(strings)) for tid in found]
        else:
            symbols = [(vocab.get(sym), sym) for sym in merge_word(list(word), self.ranks)]
        ids: list[int] = []
        for tid, sym in symbols:
            if tid is not None:
                ids.append(tid)
                continue
            # as llama.cpp: fall back to one token per raw byte whose 1-byte string is in the vocab
            for b in sym.encode("utf-8"):
                tid = vocab.get(chr(b)) if b < 0x80 else None
                if tid is not None:
                    ids.append(tid)
        return tuple(ids)

    @staticmethod
    def normal_piece(text: str) -> bytes:
        """Bytes of a normal token: GPT-2 byte characters back to bytes (llama_decode_text)."""
        out = bytearray()
        for ch in text:
            b = CHAR_TO_BYTE.get(ch)
            if b is not None:
                out.append(b)
            else:
                # llama_decode_text's marker for a character that is not a byte stand-in
                out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
        return bytes(out)


def clean_spaces(text: bytes) -> bytes:
    """llama.cpp's clean_up_tokenization_spaces, three in-place passes over the bytes as in detokenize()."""
    buf = bytearray(text)
    space, quote = 0x20, 0x27
    # pass 1: ' ?', ' !', ' .', ' ,' lose their space
    n, total = len(buf), min(len(buf), 1)
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == space and x in b"?!.,":
            total -= 1
        buf[total] = x
        total += 1
    # pass 2: a lone apostrophe between spaces loses both spaces
    n, total, i = total, min(total, 1), 1
    while i < n:
        x = buf[i]
        if x == quote and i + 1 < n and buf[i - 1] == space and buf[i + 1] == space:
            total -= 1
            i += 1
            buf[i] = 0
        buf[total] = x
        total += 1
        i += 1
    # pass 3: " 's", " 'm", " 're", " 've" lose their space
    n, total = total, min(total, 1)
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == space and x == quote and i + 1 < n:
            x1 = buf[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < n and (x1, buf[i + 2]) in ((0x72, 0x65), (0x76, 0x65)):
                total -= 1
        buf[total] = x
        total += 1
    return bytes(buf[:total])
