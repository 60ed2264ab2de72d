"""SentencePiece-style BPE (tokenizer.ggml.model = 'llama'): merges by token score with byte fallback."""
from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence

from engine.tokenizer import long_words

SPACE = "\u2581"  # '▁', SentencePiece's escaped space


def merge_by_score(text: str, token_to_id: Mapping[str, int], scores: Sequence[float]) -> list[str]:
    """Merge adjacent pieces whose union is a token, highest score first, leftmost on ties (llm_tokenizer_spm)."""
    n = len(text)
    if n < 2:
        return list(text)
    sym = list(text)  # one piece per code point, as llama.cpp's split into UTF-8 characters
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    heap: list[tuple[float, int, int, str]] = []
    get, push, pop = token_to_id.get, heapq.heappush, heapq.heappop  # locals: this loop is the hot path
    for i in range(n - 1):
        merged = sym[i] + sym[i + 1]
        tid = get(merged)
        if tid is not None:
            push(heap, (-scores[tid], i, i + 1, merged))
    while heap:
        _, left, right, merged = pop(heap)
        lt, rt = sym[left], sym[right]
        if not lt or not rt or lt + rt != merged:
            continue  # one side was merged since this pair was queued
        sym[left] = merged
        sym[right] = ""
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
        before = prv[left]
        if before >= 0:
            pair = sym[before] + merged
            tid = get(pair)
            if tid is not None:
                push(heap, (-scores[tid], before, left, pair))
        if after >= 0:
            pair = merged + sym[after]
            tid = get(pair)
            if tid is not None:
                push(heap, (-scores[tid], left, after, pair))
    return [s for s in sym if s]


class SpmModel:
    """Encodes raw text fragments the way llama.cpp's SPM tokenizer does; decodes normal tokens to bytes."""

    def __init__(
        self,
        token_to_id: Mapping[str, int],
        scores: Sequence[float],
        byte_ids: Sequence[int | None],
        unk_id: int | None,
    ):
        self.token_to_id = token_to_id
        self.scores = scores
        self.byte_ids = byte_ids  # byte value -> id of '<0xXX>' (or of the 1-character token), None if absent
        self.unk_id = unk_id
        self._merger: long_words.Merger | None = None  # built on the first very long fragment
        self._can_compile = True

    def encode(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment whose spaces are already escaped to '▁'."""
        pieces = self._pieces(text)
        if isinstance(pieces, list) and pieces and isinstance(pieces[0], int):
            return pieces  # type: ignore[return-value]  # every piece a token: the compiled merge's ids
        out: list[int] = []
        for tid, piece in pieces:
            if tid is not None:
                out.append(tid)
                continue
            # byte fallback: one <0xXX> token per UTF-8 byte (llama.cpp throws when one is missing; we use unk)
            for b in piece.encode("utf-8"):
                bid = self.byte_ids[b]
                if bid is None:
                    bid = self.unk_id
                if bid is not None:
                    out.append(bid)
        return out

    def _pieces(self, text: str) -> list[tuple[int | None, str]] | list[int]:
        """(token id or None, text) of the fragment's pieces after merging; a very long one merges in compiled
        code, in the same order, and brings its ids from there (just the ids when every piece is a token)."""
        vocab = self.token_to_id
        if len(text) >= long_words.LONG_WORD and self._merger is None and self._can_compile:
            # NaN scores: only the Python loop's order is defined
            self._can_compile = long_words.available() and all(math.isfinite(s) for s in self.scores)
            if self._can_compile:
                self._merger = long_words.Merger.for_spm(dict(vocab), list(self.scores))
        if len(text) < long_words.LONG_WORD or self._merger is None:
            return [(vocab.get(p), p) for p in merge_by_score(text, vocab, self.scores)]
        ids, strings = self._merger.merge_ids(text, vocab)
        if not strings:
            return ids  # type: ignore[return-value]
        rest = iter(strings)
        return [(tid, "") if tid is not None else (None, next(rest)) for tid in ids]

    @staticmethod
    def normal_piece(text: str) -> bytes:
        """Bytes of a normal token: '▁' back to a space (llama_unescape_whitespace)."""
        return text.replace(SPACE, " ").encode("utf-8")
