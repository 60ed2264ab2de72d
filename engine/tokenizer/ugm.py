"""Unigram (UGM, tokenizer.ggml.model = 't5'): the best-scoring segmentation, id for id with llama.cpp.

As llm_tokenizer_ugm / llm_tokenizer_ugm_session in llama-vocab.cpp: a fragment is normalised (`ugm_normalize`),
then a Viterbi pass walks it one UTF-8 character at a time; from each character every vocabulary token that
starts there (normal, user-defined and unused tokens, matched byte by byte) offers its end position the path
score so far plus its score (0 for a user-defined token), kept only when strictly better; a character no token
covers alone offers the unknown token at the lowest normal score minus 10. Scores add up in double precision
from float32 token scores, as llama.cpp does, so ties break the same way. Backtracking from the end gives the
tokens, consecutive unknowns merged into one.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import numpy as np

from engine.tokenizer.specials import NORMAL, UNUSED, USER_DEFINED
from engine.tokenizer.ugm_normalize import CharsMap, Normalizer

log = logging.getLogger(__name__)

SPACE = "\u2581"  # '▁', the escaped space
UNKNOWN_PENALTY = np.float32(10.0)  # llm_tokenizer_ugm::unknown_token_score_penalty
MAX_PREFIX_BYTES = 1 << 24  # token bytes up to which the prefix set is built (~16 MB; mT5's 250k tokens: ~2 MB)
_NOT_REACHED = -sys.float_info.max  # -DBL_MAX: lower than any sum of scores
_UTF8_LEN = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)  # unicode_len_utf8, by the lead byte's high nibble


class UgmModel:
    """Encodes raw text fragments the way llama.cpp's UGM tokenizer does; decodes normal tokens to bytes."""

    def __init__(self, texts: Sequence[str], scores: Sequence[float], attrs: Sequence[int],
                 charsmap: CharsMap | None, *, add_space_prefix: bool, remove_extra_whitespaces: bool):
        """texts, float32 scores and the attributes the token types give (before any special-token marking:
        llama.cpp builds its tries from those), and the parsed charsmap (None when the file has none)."""
        self._scores = [float(s) for s in np.asarray(scores, dtype=np.float32)]
        # token_matcher: normal, user-defined and unused tokens by their UTF-8 text; a later id wins a duplicate
        self._matcher: dict[bytes, int] = {}
        user_defined: list[bytes] = []
        min_score = float(np.finfo(np.float32).max)  # FLT_MAX; a NaN score never replaces it, as std::min
        for tid, (text, attr) in enumerate(zip(texts, attrs)):
            if attr & NORMAL and self._scores[tid] < min_score:
                min_score = self._scores[tid]
            if attr & (NORMAL | USER_DEFINED | UNUSED):
                raw = text.encode("utf-8", errors="surrogatepass")
                self._matcher[raw] = tid
            if attr & USER_DEFINED:
                user_defined.append(text.encode("utf-8", errors="surrogatepass"))
        # every proper prefix of a token, so a walk stops where llama.cpp's trie walk does; a vocabulary too large
        # for that (hostile: a million long self-similar tokens) tries every token length at each character
        self._lengths = sorted({len(t) for t in self._matcher})
        self._prefixes: set[bytes] | None = None
        if sum(len(t) for t in self._matcher) <= MAX_PREFIX_BYTES:
            self._prefixes = {t[:k] for t in self._matcher for k in range(1, len(t))}
        # the penalty is subtracted in float32, as the C++ members are floats
        self.unknown_score = float(np.float32(min_score) - UNKNOWN_PENALTY)
        self.normalize = Normalizer(charsmap, user_defined, add_space_prefix=add_space_prefix,
                                    remove_extra_whitespaces=remove_extra_whitespaces)
        self.unk_id: int | None = None
        self._path_scores: list[float] | None = None
        self._final_attrs: Sequence[int] = attrs

    def bind(self, attrs: Sequence[int], unk_id: int | None) -> None:
        """The final attributes (a user-defined token scores 0) and unknown id, once special tokens are known."""
        self._final_attrs = attrs
        self._path_scores = None
        self.unk_id = unk_id

    def encode(self, text: str) -> list[int]:
        """Token ids of one raw-text fragment (llm_tokenizer_ugm_session::tokenize)."""
        data = self.normalize(text.encode("utf-8"))
        n = len(data)
        if n == 0:
            return []
        if self._path_scores is None:
            attrs = self._final_attrs
            self._path_scores = [0.0 if attrs[t] & USER_DEFINED else s for t, s in enumerate(self._scores)]
        token_score, matcher, prefixes, lengths = self._path_scores, self._matcher, self._prefixes, self._lengths
        unk, unk_score = self.unk_id, self.unknown_score
        best = [_NOT_REACHED] * (n + 1)  # best path score ending at each byte offset
        best_token: list[int | None] = [unk] * (n + 1)
        best_start = [0] * (n + 1)
        best[0] = 0.0
        pos = 0
        while pos < n:
            char_len = _UTF8_LEN[data[pos] >> 4]
            if pos + char_len > n:  # a truncated last character counts as what is left
                char_len = n - pos
            here = best[pos]
            whole_char = False
            if prefixes is not None:  # walk while the bytes so far begin some token (the trie walk)
                end = pos + 1
                while end <= n:
                    piece = data[pos:end]
                    tid = matcher.get(piece)
                    if tid is not None:
                        whole_char = whole_char or end - pos == char_len
                        score = here + token_score[tid]
                        if score > best[end]:
                            best[end], best_token[end], best_start[end] = score, tid, pos
                    elif piece not in prefixes:
                        break
                    end += 1
            else:  # every token length that fits
                for k in lengths:
                    end = pos + k
                    if end > n:
                        break
                    tid = matcher.get(data[pos:end])
                    if tid is not None:
                        whole_char = whole_char or k == char_len
                        score = here + token_score[tid]
                        if score > best[end]:
                            best[end], best_token[end], best_start[end] = score, tid, pos
            if not whole_char:
                end = pos + char_len
                score = here + unk_score
                if score > best[end]:
                    best[end], best_token[end], best_start[end] = score, unk, pos
            pos += char_len
        return self._backtrack(best_token, best_start, n)

    def _backtrack(self, best_token: list[int | None], best_start: list[int], n: int) -> list[int]:
        """The best path's tokens from the start, runs of unknown tokens merged into one."""
        out: list[int | None] = []
        pos, prev_unknown = n, False
        while True:
            tid = best_token[pos]
            is_unknown = tid == self.unk_id
            if not (prev_unknown and is_unknown):
                out.append(tid)
            if best_start[pos] == 0:
                break
            prev_unknown = is_unknown
            pos = best_start[pos]
        out.reverse()
        if None in out:  # llama.cpp would emit LLAMA_TOKEN_NULL (-1) for a vocabulary without an unknown token
            log.warning("text has characters no token covers and the vocabulary has no unknown token; dropping them")
            return [t for t in out if t is not None]
        return out  # type: ignore[return-value]

    @staticmethod
    def normal_piece(text: str) -> bytes:
        """Bytes of a normal token: '▁' back to a space (llama_unescape_whitespace)."""
        return text.replace(SPACE, " ").encode("utf-8")
