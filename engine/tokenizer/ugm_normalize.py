"""SentencePiece normalisation for UGM (T5) vocabularies, byte for byte as llama.cpp's llm_tokenizer_ugm_session.

`tokenizer.ggml.precompiled_charsmap` is SentencePiece's compiled normaliser: a little-endian uint32 size, that
many bytes of XOR-compressed compact double array (XCDA, a darts-clone trie over UTF-8 bytes), then NUL-terminated
replacement strings. The child of a node for byte c is `node ^ BASE[node] ^ c`, and a leaf's value unit (its
child for byte 0) holds the offset of its replacement. `CharsMap` visits every node reachable from the root once
at load (darts-clone shares common suffixes, so the trie is a DAG), checking every index and offset a lookup
could read (llama.cpp checks them only when an input reaches them, and throws). `Normalizer` then takes, at each
position: the longest prefix of a user-defined token's text (passed through as is), else the longest charsmap key
(replaced), else one UTF-8 character (an invalid byte becomes U+FFFD), and last applies llama.cpp's whitespace
rules.
"""
from __future__ import annotations

import bisect
import os
import re
import struct

import numpy as np

from engine.errors import ModelFormatError

CHARSMAP_KEY = "tokenizer.ggml.precompiled_charsmap"
REPLACEMENT = "\ufffd".encode("utf-8")
# one packed XCDA unit (xcda_array_view in llama-vocab.cpp):
#   bit 31     set on value units, so their LCHECK never equals a byte
#   bits 10-30 BASE, shifted left by 8 more when bit 9 is set
#   bit 8      LEAF: the node ends a key (its value unit is at node ^ BASE[node])
#   bits 0-7   LCHECK: the byte that leads from the parent
#   value unit: bits 0-30 are the replacement's offset
_LCHECK_MASK = (1 << 31) | 0xFF
_CHUNK = 4096  # nodes checked at once at load (a (4096, 255) index array)


def _base(units: np.ndarray) -> np.ndarray:
    """BASE of packed XCDA units (xcda_array_view::get_base)."""
    return (units >> 10) << ((units & (1 << 9)) >> 6)


class CharsMap:
    """A precompiled charsmap, checked once: every unit a lookup can read is inside the array, every replacement
    it can reach inside the strings and NUL-terminated. Lookups walk the XCDA itself (its keys, over 200,000 for
    SentencePiece's nfkc map, are not worth listing)."""

    def __init__(self, blob: bytes):
        if len(blob) < 4:
            raise ModelFormatError(CHARSMAP_KEY, f"holds {len(blob)} bytes, too few for its 4-byte size header")
        (size,) = struct.unpack_from("<I", blob, 0)
        if size + 4 >= len(blob):
            raise ModelFormatError(CHARSMAP_KEY, f"declares a {size}-byte XCDA array but holds only {len(blob)} "
                                                 "bytes with its header and replacement strings")
        units = np.frombuffer(blob, dtype="<u4", count=size // 4, offset=4).astype(np.int64)
        self.replacements = blob[4 + size:]
        # per unit: LCHECK, BASE and LEAF unpacked (xcda_array_view), as lists for the per-byte walk
        self._check: list[int] = (units & _LCHECK_MASK).tolist()
        self._base: list[int] = _base(units).tolist()
        self._leaf: list[bool] = ((units >> 8) & 1).astype(bool).tolist()
        self._value: list[int] = (units & ((1 << 31) - 1)).tolist()  # a value unit's replacement offset
        self._strings: dict[int, bytes] = {}  # value unit index -> its replacement, as lookups find them
        self.root = int(_base(units[:1])[0]) if len(units) else -1
        self.first_bytes: frozenset[int] = frozenset()
        if len(units):
            self._check_reachable(units)

    def _check_reachable(self, units: np.ndarray) -> None:
        """Visit every node reachable from the root once (in breadth), checking what a lookup would read there."""
        n = len(units)
        if self.root >= n:
            raise ModelFormatError(CHARSMAP_KEY, f"XCDA root points to unit {self.root}, outside the {n}-unit array")
        last_nul = self.replacements.rfind(b"\0")
        visited = np.zeros(n, dtype=bool)
        visited[self.root] = True
        frontier = np.array([self.root], dtype=np.int64)  # node_index = BASE[0]
        first = True
        while len(frontier):
            found = [self._children(units, frontier[k:k + _CHUNK], last_nul) for k in range(0, len(frontier), _CHUNK)]
            if first:
                self.first_bytes = frozenset(found[0][1])
                first = False
            nxt = np.unique(np.concatenate([f[0] for f in found]))
            frontier = nxt[~visited[nxt]]
            visited[frontier] = True

    def _children(self, units: np.ndarray, nodes: np.ndarray, last_nul: int) -> tuple[np.ndarray, list[int]]:
        """The next nodes below nodes and the bytes that lead there, every index and offset read checked."""
        n = len(units)
        labels = np.arange(1, 256, dtype=np.int64)  # a walk stops at byte 0
        idx = nodes[:, None] ^ labels[None, :]  # (nodes, 255): where the child for each byte would be
        if (idx >= n).any():
            raise ModelFormatError(CHARSMAP_KEY, f"XCDA node {int(nodes[np.nonzero(idx >= n)[0][0]])} has "
                                                 f"children outside the {n}-unit array")
        rows, cols = np.nonzero((units[idx] & _LCHECK_MASK) == labels[None, :])
        child = idx[rows, cols]
        nxt = child ^ _base(units[child])
        if (nxt >= n).any():
            raise ModelFormatError(CHARSMAP_KEY, f"XCDA node {int(child[np.argmax(nxt >= n)])} points outside "
                                                 f"the {n}-unit array")
        leaf = ((units[child] >> 8) & 1).astype(bool)
        offsets = units[nxt[leaf]] & ((1 << 31) - 1)
        if (offsets > last_nul).any():
            bad = int(offsets[np.argmax(offsets > last_nul)])
            if bad >= len(self.replacements):
                raise ModelFormatError(CHARSMAP_KEY, f"a replacement offset ({bad}) is past the "
                                                     f"{len(self.replacements)} bytes of replacement strings")
            raise ModelFormatError(CHARSMAP_KEY, f"the replacement at offset {bad} has no terminating NUL")
        return nxt, (cols + 1).tolist()

    def _replacement(self, value_unit: int) -> bytes:
        """The NUL-terminated replacement string a leaf's value unit points to (checked at load)."""
        repl = self._strings.get(value_unit)
        if repl is None:
            offset = self._value[value_unit]
            repl = self._strings[value_unit] = self.replacements[offset:self.replacements.find(b"\0", offset)]
        return repl

    def longest(self, data: bytes, pos: int) -> tuple[int, bytes] | None:
        """(length, replacement) of the longest key that data[pos:] starts with, or None (the XCDA walk)."""
        if self.root < 0:  # an empty XCDA array: llama.cpp skips the walk
            return None
        check, base, leaf = self._check, self._base, self._leaf
        node, found = self.root, None
        for end in range(pos, len(data)):
            c = data[end]
            if c == 0:
                break
            node ^= c
            if check[node] != c:
                break
            is_leaf = leaf[node]
            node ^= base[node]
            if is_leaf:
                found = (end - pos + 1, self._replacement(node))
        return found


def _utf8_length(data: bytes, pos: int) -> int:
    """Bytes of the UTF-8 character at pos as unicode_cpt_from_utf8 accepts it (lead and continuation bits only),
    or 0 when it throws."""
    lead, n = data[pos], len(data)
    if lead < 0x80:
        return 1
    need = 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 0
    if not need or pos + need > n:
        return 0
    return need if all(b & 0xC0 == 0x80 for b in data[pos + 1:pos + need]) else 0


def _plain_run(skip: frozenset[int]) -> re.Pattern[bytes]:
    """A run of complete UTF-8 characters whose first byte starts neither a charsmap key nor a user-defined
    token: normalize_prefix copies each unchanged, so the whole run is copied at once."""
    def cls(lo: int, hi: int) -> str:
        return "".join(f"\\x{b:02x}" for b in range(lo, hi + 1) if b not in skip)
    cont = "[\\x80-\\xbf]"
    alts = []
    for lo, hi, n_cont in ((0x00, 0x7F, 0), (0xC0, 0xDF, 1), (0xE0, 0xEF, 2), (0xF0, 0xF7, 3)):
        chars = cls(lo, hi)
        if chars:
            alts.append(f"[{chars}]" + (f"{cont}{{{n_cont}}}" if n_cont else ""))
    return re.compile(("(?:" + "|".join(alts) + ")+").encode("ascii") if alts else b"(?!)")


class Normalizer:
    """llama.cpp's UGM normalize(): charsmap, user-defined pass-through, spaces escaped, merged and prefixed."""

    def __init__(self, charsmap: CharsMap | None, user_defined: list[bytes], *, add_space_prefix: bool,
                 remove_extra_whitespaces: bool, escape_whitespaces: bool = True,
                 treat_whitespace_as_suffix: bool = False):
        self.charsmap = charsmap
        # user_defined_token_matcher.get_longest_prefix: the deepest trie node reached, whether or not a token
        # ends there, i.e. the longest common prefix with any user-defined text (found next to the input in order)
        self.user_defined = sorted(set(t for t in user_defined if t))
        self._user_longest = max((len(t) for t in self.user_defined), default=0)
        self._user_first = frozenset(t[0] for t in self.user_defined)
        starts = self._user_first | (charsmap.first_bytes if charsmap else set())
        self._plain = _plain_run(frozenset(starts))
        self.space = "\u2581".encode("utf-8") if escape_whitespaces else b" "
        # llama.cpp never sets treat_whitespace_as_suffix for UGM (no metadata key): the prefix is prepended
        self.prepend = add_space_prefix and not treat_whitespace_as_suffix
        self.append = add_space_prefix and treat_whitespace_as_suffix
        self.merge = remove_extra_whitespaces

    def __call__(self, data: bytes) -> bytes:
        """The normalised bytes of one raw-text fragment (UTF-8), ready for the Viterbi search."""
        pieces: list[bytes] = []
        pos, n, plain = 0, len(data), self._plain.match
        while pos < n:
            m = plain(data, pos)
            if m is not None:
                pieces.append(m.group())
                pos = m.end()
                continue
            step = self._user_prefix(data, pos)
            if step:
                pieces.append(data[pos:pos + step])
                pos += step
                continue
            hit = self.charsmap.longest(data, pos) if self.charsmap is not None else None
            if hit is not None:
                pieces.append(hit[1])
                pos += hit[0]
                continue
            step = _utf8_length(data, pos)
            pieces.append(data[pos:pos + step] if step else REPLACEMENT)
            pos += step or 1
        return self._spaces(b"".join(pieces))

    def _user_prefix(self, data: bytes, pos: int) -> int:
        """Length of the longest prefix of data[pos:] that is a prefix of a user-defined token's text."""
        if data[pos] not in self._user_first:
            return 0
        texts = self.user_defined
        query = data[pos:pos + self._user_longest]
        at = bisect.bisect_left(texts, query)
        return max(len(os.path.commonprefix([query, texts[k]])) for k in (at - 1, at) if 0 <= k < len(texts))

    def _spaces(self, text: bytes) -> bytes:
        """Whitespace as normalize() writes it: each ' ' escaped, or runs merged to one before each word."""
        if self.merge:
            # a space before every run of non-space bytes, none for the spaces themselves
            out = b"".join(self.space + word for word in text.split(b" ") if word)
        else:
            if self.prepend:
                k = len(text) - len(text.lstrip(b" "))
                if k < len(text):  # the prefix goes before the first non-space byte
                    text = text[:k] + b" " + text[k:]
            out = text.replace(b" ", self.space)
        return out + self.space if self.append else out
