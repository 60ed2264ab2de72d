"""Merging one very long word (a megabyte of 'x' or of spaces) in compiled code, with llama.cpp's exact order.

Both tokenizers merge a word as llama.cpp does: a priority queue of adjacent symbol pairs, the best pair first
(BPE: lowest merge rank; SPM: highest score of the merged token), the leftmost on ties, skipping pairs that a
merge has outdated (llm_tokenizer_bpe_session / llm_tokenizer_spm_session in src/llama-vocab.cpp). In Python
that costs a few microseconds per merge, so a piece of a million symbols takes seconds; llama.cpp's C++ takes a
fraction of that. Here the same loop runs in numba on code points: a symbol is a span of the word (its start
never moves, only its length grows), a pair is looked up by hashing the span of both symbols (a polynomial
prefix hash of the word) in an open-addressing table of the merges (BPE: the merged string and where it
splits) or of the vocabulary (SPM: any token), and confirmed code point by code point; a small memo of recent
lookups spares the big table's cache misses on repetitive words. A popped pair counts when the pair now at its
left symbol has the priority it was queued with (BPE, one rank per merge: llama.cpp's "left + right ==
bigram.text"), or for SPM when the two symbols there still add up to its length (llama.cpp's own SPM test,
"left.n + right.n != bigram.size"; any split of one span is the same token).

`Merger.merge(word)` returns the final symbols as (start, end) spans; `merge_ids` their token ids straight
from the table (None for a symbol that is no token: the caller's byte fallback takes those).
Only words of at least LONG_WORD code points come here, so short text never imports numba; without numba
`available()` is False and the Python loops do all the work.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping

import numpy as np

log = logging.getLogger(__name__)

LONG_WORD = 4096  # code points; shorter words merge in Python (no compile, no table to build)
_MUL = np.uint64(0x100000001B3)  # the polynomial base of the span hash


@functools.cache
def _kernels():
    """The compiled kernels, or None when numba is missing or fails to compile them."""
    try:
        from engine.tokenizer import long_words_kernels  # noqa: PLC0415 - numba is imported only for long words
    except Exception as exc:  # noqa: BLE001 - any failure means: merge in Python
        log.warning("compiled merging of long words is unavailable (%s); using Python", exc)
        return None
    return long_words_kernels


def available() -> bool:
    """Whether the compiled merge can run here."""
    return _kernels() is not None


def _codepoints(text: str) -> np.ndarray:
    """The code points of text as uint32."""
    return np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)


class Merger:
    """A merge table (strings with a split tag and a priority) and the compiled merge loop over it."""

    def __init__(self, strings: list[str], tags: Iterable[int], priorities: Iterable[int], any_split: bool,
                 token_ids: Iterable[int]):
        k = _kernels()
        assert k is not None, "check available() first"
        lengths = np.fromiter((len(s) for s in strings), dtype=np.int64, count=len(strings))
        self.offsets = np.zeros(len(strings) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.offsets[1:])
        self.flat = _codepoints("".join(strings))
        self.tags = np.fromiter(tags, dtype=np.int64, count=len(strings))
        self.priorities = np.fromiter(priorities, dtype=np.int64, count=len(strings))
        self.token_ids = np.fromiter(token_ids, dtype=np.int64, count=len(strings))  # -1: not a token
        self.any_split = any_split  # SPM: any split of a token merges; BPE: only the split a merge names
        self.max_len = int(lengths.max()) if len(strings) else 0
        self.table = k.build_table(self.flat, self.offsets, self.tags, self.any_split, _MUL)

    @classmethod
    def for_bpe(cls, ranks: Mapping[tuple[str, str], int], token_to_id: Mapping[str, int]) -> Merger:
        """From BPE merge ranks: the merged string, split where the merge splits it, lowest rank first."""
        items = list(ranks.items())
        merged = [a + b for (a, b), _ in items]
        return cls(merged, (len(a) for (a, _), _ in items), (r for _, r in items), False,
                   (token_to_id.get(m, -1) for m in merged))

    @classmethod
    def for_spm(cls, token_to_id: dict[str, int], scores: list[float]) -> Merger:
        """From an SPM vocabulary: every token of two or more code points, highest score first."""
        items = [(t, i) for t, i in token_to_id.items() if len(t) > 1]
        order = sorted({scores[i] for _, i in items}, reverse=True)
        rank = {s: r for r, s in enumerate(order)}
        return cls([t for t, _ in items], (0 for _ in items), (rank[scores[i]] for _, i in items), True,
                   (i for _, i in items))

    def merge(self, word: str) -> list[tuple[int, int]]:
        """The final symbols of word as (start, end) code point spans, in order."""
        starts, lens, _ = self._run(_codepoints(word))
        return list(zip(starts.tolist(), (starts + lens).tolist()))

    def merge_ids(self, word: str, single: Mapping[str, int]) -> tuple[list[int | None], list[str]]:
        """The final symbols' token ids (None where the symbol is not a token) and their strings.

        A merged symbol's id comes from the table; a lone code point's from `single` (the vocabulary).
        """
        cps = _codepoints(word)
        starts, lens, entries = self._run(cps)
        ids = np.where(entries >= 0, self.token_ids[np.maximum(entries, 0)], -1)
        lone = entries < 0
        if lone.any():
            lone_cps = cps[starts[lone]]
            uniq, inverse = np.unique(lone_cps, return_inverse=True)
            table = np.array([single.get(chr(c), -1) for c in uniq.tolist()], dtype=np.int64)
            ids[lone] = table[inverse]
        strings = []
        out: list[int | None] = ids.tolist()
        for k in np.nonzero(ids < 0)[0].tolist():  # rare: the caller falls back to bytes for these
            out[k] = None
            strings.append(word[starts[k]:starts[k] + lens[k]])
        return out, strings

    def _run(self, cps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        k = _kernels()
        return k.merge_word(cps, self.table, self.flat, self.offsets, self.tags, self.priorities, self.any_split,
                            self.max_len, _MUL)
