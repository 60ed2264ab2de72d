"""The compiled merge of very long words gives exactly the Python loops' symbols (llama.cpp's order), BPE and SPM."""
from __future__ import annotations

import random

import numpy as np
import pytest

from engine.tokenizer import long_words
from engine.tokenizer.bpe import merge_word
from engine.tokenizer.spm import merge_by_score

pytestmark = pytest.mark.skipif(not long_words.available(), reason="numba is not available")


def _random_bpe(rng: random.Random, alphabet: str, n_merges: int) -> dict[tuple[str, str], int]:
    """Merges over growing strings, ranks shuffled now and then (a merge may outrank the ones it builds on)."""
    pieces = list(alphabet)
    ranks: dict[tuple[str, str], int] = {}
    while len(ranks) < n_merges:
        a, b = rng.choice(pieces), rng.choice(pieces)
        if (a, b) in ranks or len(a + b) > 12:
            continue
        ranks[(a, b)] = len(ranks)
        pieces.append(a + b)
    items = list(ranks)
    for _ in range(n_merges // 5):  # out-of-order ranks
        i, j = rng.randrange(len(items)), rng.randrange(len(items))
        items[i], items[j] = items[j], items[i]
    return {pair: rank for rank, pair in enumerate(items)}


def _words(rng: random.Random, alphabet: str) -> list[str]:
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(2, 400))) for _ in range(40)]
    return words + [alphabet[0] * 5000, (alphabet[:2] * 3000), ""]


@pytest.mark.parametrize("seed", range(6))
def test_compiled_bpe_merge_equals_python(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "abcĠ" if seed % 2 else "ab"
    ranks = _random_bpe(rng, alphabet, 60)
    vocab = {t: i for i, t in enumerate(dict.fromkeys([*alphabet[1:], *(a + b for a, b in ranks)]))}
    merger = long_words.Merger.for_bpe(ranks, vocab)
    for word in _words(rng, alphabet):
        want = merge_word(list(word), ranks)
        got = [word[a:b] for a, b in merger.merge(word)]
        assert got == want, word[:60]
        ids, rest = merger.merge_ids(word, vocab)
        assert ids == [vocab.get(s) for s in want]  # the first letter is no token: byte fallback material
        assert rest == [s for s in want if s not in vocab]


@pytest.mark.parametrize("seed", range(6))
def test_compiled_spm_merge_equals_python(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab▁c"
    vocab = list(alphabet) + ["".join(rng.choice(alphabet) for _ in range(rng.randrange(2, 9))) for _ in range(300)]
    token_to_id = {t: i for i, t in enumerate(vocab)}
    scores = [float(rng.randrange(-20, 0)) for _ in vocab]  # many ties: the leftmost pair wins
    merger = long_words.Merger.for_spm(token_to_id, scores)
    for word in _words(rng, alphabet):
        want = merge_by_score(word, token_to_id, scores)
        got = [word[a:b] for a, b in merger.merge(word)]
        assert got == want, word[:60]
        assert merger.merge_ids(word, token_to_id)[0] == [token_to_id.get(s) for s in want]


def test_long_words_take_the_compiled_path_in_the_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the threshold lowered, a tokenizer's ids are unchanged (real SmolLM2 / Gemma 3 ids are in the corpus)."""
    from engine.tokenizer.vocab import Tokenizer  # noqa: PLC0415
    from tests.engine.tokenizer.test_tokenizer import _bpe_metadata, _spm_metadata  # noqa: PLC0415

    texts = ["hello world " * 50, "hhhhhhhhhhhhhhhhhhhhhhhh" * 40, "héllo" * 100]
    for metadata in (_bpe_metadata(), _spm_metadata()):
        want = [Tokenizer.from_metadata(metadata).encode(t) for t in texts]
        monkeypatch.setattr(long_words, "LONG_WORD", 8)
        got = [Tokenizer.from_metadata(metadata).encode(t) for t in texts]
        monkeypatch.setattr(long_words, "LONG_WORD", 4096)
        assert got == want


def test_nan_scores_keep_long_fragments_in_python() -> None:
    """With a NaN score only the Python loop's order is defined; a long fragment must still tokenize."""
    from tests.engine.tokenizer.test_tokenizer import _spm_metadata  # noqa: PLC0415
    from engine.tokenizer.vocab import Tokenizer  # noqa: PLC0415

    md = _spm_metadata()
    scores = md["tokenizer.ggml.scores"].copy()
    scores[-1] = np.nan
    md["tokenizer.ggml.scores"] = scores
    tok = Tokenizer.from_metadata(md)
    text = "he hé " * 2000
    ids = tok.encode(text)
    assert tok.decode(ids) == text and tok._model._merger is None
