"""Tokenizers against llama.cpp: pieces, special ids, EOG; streaming; hostile metadata (the corpus: test_llama_corpus).

The golden fixtures come from tools/make_tokenizer_fixtures.py (llama-cpp-python, vocab_only).
"""
from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.gguf.reader import open_gguf
from engine.tokenizer.vocab import StreamDecoder, Tokenizer
from engine.tokenizer.bpe import BYTE_TO_CHAR, clean_spaces, merge_word, parse_merges, pre_tokenizer, split_words
from tests.conftest import GEMMA3_FILE, SMOLLM2_FILE, model_path
from tests.engine.tokenizer import corpus

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MODELS = {"smollm2": SMOLLM2_FILE, "gemma3": GEMMA3_FILE}


@functools.lru_cache(maxsize=None)
def _metadata(short: str) -> dict[str, Any]:
    path = model_path(MODELS[short])
    if path is None:
        pytest.skip(f"model {MODELS[short]} not found (set GGUF_LENS_MODELS_DIR)")
    return open_gguf(path).metadata


@functools.lru_cache(maxsize=None)
def _tokenizer(short: str) -> Tokenizer:
    return Tokenizer.from_metadata(_metadata(short))


@functools.lru_cache(maxsize=None)
def _fixture(short: str) -> dict[str, Any]:
    path = FIXTURES / f"tokens_{short}.json"
    if not path.exists():
        pytest.skip(f"{path.name} missing (run tools/make_tokenizer_fixtures.py)")
    return json.loads(path.read_text(encoding="utf-8"))


# -- llama.cpp equality on the real vocabularies --------------------------------------------------


@pytest.mark.parametrize("short", list(MODELS))
def test_token_pieces_match_llama_cpp(short: str) -> None:
    tok, fx = _tokenizer(short), _fixture(short)
    bad = [tid for tid, (special, plain) in fx["pieces"].items()
           if tok.token_bytes(int(tid)).hex() != special or tok.token_bytes(int(tid), special=False).hex() != plain]
    assert not bad, f"{len(bad)} of {len(fx['pieces'])} pieces differ, e.g. {bad[:10]}"


@pytest.mark.parametrize("short", list(MODELS))
def test_special_ids_and_eog_match_llama_cpp(short: str) -> None:
    tok, fx = _tokenizer(short), _fixture(short)
    assert tok.n_vocab == fx["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (fx["bos"], fx["eos"], fx["add_bos"], fx["add_eos"])
    assert sorted(tok.eog_ids) == fx["eog"]
    special = {int(t) for t, attr in fx["attrs_not_normal"].items() if attr & (1 | 8)}  # UNKNOWN | CONTROL
    assert {t for t in range(tok.n_vocab) if tok.is_special(t)} == special


def test_smollm2_known_ids() -> None:
    tok = _tokenizer("smollm2")
    assert tok.encode("<|im_start|>user\nHello<|im_end|>\n") == [1, 4093, 198, 19556, 2, 198]
    assert tok.encode("<|im_start|>", parse_special=False) != [1]
    assert tok.eog_ids == {0, 2, 4}  # <|endoftext|>, <|im_end|>, <reponame> (llama.cpp's FIM repo token)


def test_gemma3_known_ids_and_load_time() -> None:
    md = _metadata("gemma3")
    t0 = time.perf_counter()
    tok = Tokenizer.from_metadata(md)
    elapsed = time.perf_counter() - t0
    print(f"gemma3 vocabulary of {tok.n_vocab} tokens built in {elapsed:.3f} s")
    assert tok.n_vocab == 262_144
    assert tok.encode("<start_of_turn>user\nHi<end_of_turn>\n", add_special=True)[:4] == [2, 105, 2364, 107]
    assert {1, 106} <= tok.eog_ids  # <eos>, <end_of_turn>


# -- decoding -------------------------------------------------------------------------------------


def _manual_entries() -> list[dict[str, Any]]:
    """The hand-written corpus strings (the outside ones include bytes a vocabulary cannot spell)."""
    return [e for e in corpus.load()["entries"] if e["source"] == "manual"]


@pytest.mark.parametrize("short", list(MODELS))
def test_decode_round_trips_corpus(short: str) -> None:
    tok = _tokenizer(short)
    for entry in _manual_entries():
        text = entry["text"]
        if short == "gemma3":
            text = text.replace("\u2581", "_")  # SPM reads a literal '▁' as a space, as llama.cpp does
        assert tok.decode(tok.encode(text, parse_special=False)) == text, entry["name"]
        ids = tok.encode(text, add_special=True, parse_special=False)
        assert tok.decode(ids, skip_special=True) == text, entry["name"]


@pytest.mark.parametrize("short", list(MODELS))
def test_stream_decoder_matches_decode_and_never_splits_characters(short: str) -> None:
    tok = _tokenizer(short)
    for entry in _manual_entries():
        ids = tok.encode(entry["text"], parse_special=True)
        dec = StreamDecoder(tok)
        parts = [dec.feed(t) for t in ids] + [dec.flush()]
        assert "".join(parts) == tok.decode(ids), entry["name"]
        assert all("\ufffd" not in p for p in parts), entry["name"]


def test_stream_decoder_holds_split_multibyte_characters() -> None:
    tok = _tokenizer("smollm2")
    # byte-level BPE has one token per byte: feed '€' (E2 82 AC) and '🙂' (F0 9F 99 82) a byte at a time
    ids = [tok.token_id(BYTE_TO_CHAR[b]) for b in "€🙂".encode()]
    dec = StreamDecoder(tok)
    outs = [dec.feed(t) for t in ids]
    assert outs == ["", "", "€", "", "", "", "🙂"]
    assert dec.flush() == ""


def test_stream_decoder_byte_fallback_tokens() -> None:
    tok = _tokenizer("gemma3")
    ids = [tok.token_id(f"<0x{b:02X}>") for b in "€".encode()]
    dec = StreamDecoder(tok)
    assert [dec.feed(t) for t in ids] == ["", "", "€"]


@pytest.mark.parametrize("raw, want", [
    (b"\xe2\x82", "\ufffd"),  # cut short at the end (max tokens / cancel)
    (b"\xff", "\ufffd"),  # never valid
    (b"\xc0\x80", "\ufffd\ufffd"),  # overlong NUL
    (b"\xed\xa0\x80", "\ufffd\ufffd\ufffd"),  # UTF-16 surrogate
    (b"\xf4\x90\x80\x80", "\ufffd\ufffd\ufffd\ufffd"),  # above U+10FFFF
    (b"\xe2\x82A", "\ufffdA"),  # interrupted sequence
])
def test_stream_decoder_invalid_bytes_become_replacement_characters(raw: bytes, want: str) -> None:
    tok = _tokenizer("gemma3")
    dec = StreamDecoder(tok)
    text = "".join(dec.feed(tok.token_id(f"<0x{b:02X}>") if b >= 0x80 else tok.token_id(chr(b))) for b in raw)
    text += dec.flush()
    assert text == want
    text.encode("utf-8")  # what gets saved is valid UTF-8
    assert tok.decode([tok.token_id(f"<0x{b:02X}>") for b in raw if b >= 0x80]).encode("utf-8")


def test_token_text_never_raises() -> None:
    tok = _tokenizer("gemma3")
    assert tok.token_text(2) == "<bos>"
    assert tok.token_text(tok.token_id("<0xE2>")) == "\\xe2"
    for bad in (-1, tok.n_vocab, 2**63, "x", None):
        assert isinstance(tok.token_text(bad), str)  # type: ignore[arg-type]
    assert tok.token_bytes(-5) == b"" and tok.token_bytes(tok.n_vocab) == b""


# -- algorithms on their own ----------------------------------------------------------------------


def test_pre_tokenizer_splits() -> None:
    smollm = pre_tokenizer("smollm").patterns
    assert split_words("Hello world  123 I'm", smollm) == ["Hello", " world", "  ", "1", "2", "3", " I", "'m"]
    llama3 = pre_tokenizer("llama-bpe").patterns
    assert split_words("x  12345 I'M\n\n y", llama3) == ["x", " ", " ", "123", "45", " I", "'M", "\n\n", " y"]


def test_unknown_pre_tokenizer_falls_back_to_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        pre = pre_tokenizer("no-such-pre")
    assert pre.name == "no-such-pre" and len(pre.patterns) == 4
    assert "not known" in caplog.text


def test_merge_word_lowest_rank_first() -> None:
    ranks = {("a", "b"): 1, ("b", "c"): 0, ("a", "bc"): 2}
    assert merge_word(list("abc"), ranks) == ["abc"]
    assert merge_word(list("abab"), {("a", "b"): 0, ("ab", "ab"): 1}) == ["abab"]


def test_merge_ranks_are_llama_cpps_pairs() -> None:
    """llama.cpp splits each merge at its first space after index 0 and keeps the first rank of a repeated pair;
    the rank table answers for exactly those pairs, spaces inside either part included."""
    merges = ["a b", "  x", "ab c d", "a b", "x  y", "nospace", " ", "q r"]
    ranks, n_bad = parse_merges(merges)
    pairs = {}
    for rank, m in enumerate(merges):
        pos = m.find(" ", 1)
        if pos >= 0:
            pairs.setdefault((m[:pos], m[pos + 1 :]), rank)
    assert n_bad == 2 and dict(ranks.items()) == pairs and len(ranks) == len(pairs)
    assert ranks.get(("a", "b")) == 0 and ranks.get((" ", "x")) == 1 and ranks.get(("ab", "c d")) == 2
    assert ranks.get(("x", " y")) == 4
    assert ranks.get(("ab c", "d")) is None and ("ab c", "d") not in ranks  # "ab c d" splits after "ab" only
    assert ranks.get(("a", "c")) is None and ("a", "b") in ranks
    with pytest.raises(KeyError):
        ranks[("q", "x")]
    assert merge_word(list("abcq r"), ranks) == merge_word(list("abcq r"), pairs)


def test_clean_spaces_like_llama_cpp() -> None:
    got = clean_spaces(b"it ' s a test , isn ' t it ? I 'm sure they 're")
    assert got == b"it's a test, isn't it? I'm sure they're"


# -- hostile or odd metadata (RELIABILITY cases 16, 17, 20) ----------------------------------------


def _bpe_metadata(**overrides: Any) -> dict[str, Any]:
    """A tiny byte-level BPE vocabulary: 2 specials, 256 byte tokens, a few merges."""
    tokens = ["<|endoftext|>", "<|im_end|>"] + BYTE_TO_CHAR + ["he", "ll", "hell", "hello"]
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": np.array([3, 3] + [1] * (len(tokens) - 2), dtype=np.int32),
        "tokenizer.ggml.merges": ["h e", "l l", "he ll", "hell o"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }
    md.update(overrides)
    return {k: v for k, v in md.items() if v is not None}


def _spm_metadata(**overrides: Any) -> dict[str, Any]:
    """A tiny SPM vocabulary: <unk> <s> </s>, 256 byte tokens, a few pieces with scores."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "h", "e", "▁h", "he", "▁he"]
    types = [2, 3, 3] + [6] * 256 + [1] * 6
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.array([0.0] * 259 + [-1, -2, -3, -4, -5, -0.5], dtype=np.float32),
        "tokenizer.ggml.token_type": np.array(types, dtype=np.int32),
    }
    md.update(overrides)
    return {k: v for k, v in md.items() if v is not None}


def test_tiny_bpe_works() -> None:
    tok = Tokenizer.from_metadata(_bpe_metadata())
    ids = tok.encode("hello<|im_end|>")
    assert ids[0] == tok.token_id("hello") and ids[-1] == 1
    assert tok.decode(ids) == "hello<|im_end|>"
    assert tok.eog_ids == {0, 1}


def test_tiny_spm_works() -> None:
    tok = Tokenizer.from_metadata(_spm_metadata())
    assert (tok.bos_id, tok.eos_id, tok.add_bos) == (1, 2, True)  # llama.cpp's SPM defaults
    ids = tok.encode("he hé", add_special=True)
    assert ids[:2] == [1, tok.token_id("▁he")]
    assert tok.decode(ids[1:]) == "he hé"  # the space SPM added in front is dropped again
    assert tok.decode(ids, skip_special=True) == " he hé"  # as llama_detokenize: not after a removed BOS


@pytest.mark.parametrize("key, value, match", [
    ("tokenizer.ggml.scores", np.zeros(8, dtype=np.int8), r"tokenizer\.ggml\.scores.*float32\[265\], got int8\[8\]"),
    ("tokenizer.ggml.scores", np.zeros(265, dtype=np.uint8), r"tokenizer\.ggml\.scores.*got uint8\[265\]"),
    ("tokenizer.ggml.scores", np.zeros(264, dtype=np.float32), r"float32\[265\], got float32\[264\]"),
    ("tokenizer.ggml.scores", np.zeros((265, 2), dtype=np.float32), r"got float32\[265,2\]"),
    ("tokenizer.ggml.token_type", np.zeros(265, dtype=np.int8), r"tokenizer\.ggml\.token_type.*int32\[265\], got int8"),
    ("tokenizer.ggml.token_type", [1] * 3, r"token_type.*int32\[265\], got list\[3\]"),
    ("tokenizer.ggml.tokens", np.arange(5, dtype=np.int32), r"tokenizer\.ggml\.tokens.*array of strings, got int32"),
    ("tokenizer.ggml.tokens", ["a", 5, "b"], r"tokenizer\.ggml\.tokens.*array of strings"),
    ("tokenizer.ggml.tokens", [], r"tokenizer\.ggml\.tokens.*1 to"),
    ("tokenizer.ggml.model", None, r"tokenizer\.ggml\.model.*missing"),
    ("tokenizer.ggml.model", "bert", r"tokenizer\.ggml\.model = 'bert'.*unsupported"),
])
def test_type_confusion_is_rejected_naming_the_key(key: str, value: Any, match: str) -> None:
    md = _spm_metadata()
    if value is None:
        del md[key]
    else:
        md[key] = value
    with pytest.raises(ModelFormatError, match=match):
        Tokenizer.from_metadata(md)


def test_bpe_merges_must_be_strings() -> None:
    with pytest.raises(ModelFormatError, match=r"tokenizer\.ggml\.merges"):
        Tokenizer.from_metadata(_bpe_metadata(**{"tokenizer.ggml.merges": np.zeros(3, dtype=np.int32)}))
    with pytest.raises(ModelFormatError, match=r"tokenizer\.ggml\.merges"):
        Tokenizer.from_metadata(_bpe_metadata(**{"tokenizer.ggml.merges": None}))


@pytest.mark.parametrize("value", [2**32 - 1, 265, -1, True, "1", 1.0])
def test_bad_special_ids_are_disabled(value: Any, caplog: pytest.LogCaptureFixture) -> None:
    md = _spm_metadata(**{"tokenizer.ggml.eos_token_id": value, "tokenizer.ggml.bos_token_id": value,
                          "tokenizer.ggml.eot_token_id": value})
    with caplog.at_level(logging.WARNING):
        tok = Tokenizer.from_metadata(md)
    assert tok.bos_id is None and tok.eos_id is None and not tok.add_bos
    assert "disabling" in caplog.text
    assert all(0 <= t < tok.n_vocab for t in tok.eog_ids)
    assert tok.encode("he", add_special=True) == tok.encode("he")
    assert 2**32 - 1 not in tok.eog_ids


@pytest.mark.parametrize("n", [1, 2, 3])
def test_tiny_vocabularies_with_default_ids(n: int) -> None:
    for md in (
        {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b", "c"][:n]},
        {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "c"][:n], "tokenizer.ggml.merges": []},
    ):
        tok = Tokenizer.from_metadata(md)
        assert tok.bos_id is None or tok.bos_id < n
        assert all(t < n for t in tok.eog_ids)
        ids = tok.encode("abc xyz é", add_special=True)
        assert all(0 <= t < n for t in ids)
        tok.decode(ids + [n, -1, 10**9])


def test_malformed_byte_tokens_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    md = _spm_metadata()
    tokens = list(md["tokenizer.ggml.tokens"])
    tokens[3:6] = ["<0x-1>", "<0xZZ>", "<0x100>"]
    md["tokenizer.ggml.tokens"] = tokens
    with caplog.at_level(logging.WARNING):
        tok = Tokenizer.from_metadata(md)
    assert "not of the form <0xXX>" in caplog.text
    assert tok.token_bytes(3) == b"" and tok.token_bytes(4) == b""
    ids = tok.encode("\x00\x01 he")  # no byte token left for these bytes: <unk> (llama.cpp would throw)
    assert ids[1:3] == [0, 0] and tok.decode(ids, skip_special=True) == " he"


def test_malformed_merges_and_empty_tokens(caplog: pytest.LogCaptureFixture) -> None:
    md = _bpe_metadata(**{"tokenizer.ggml.merges": ["h e", "nospace", "", " ", "ll", 'l l', "x y z"]})
    tokens = list(md["tokenizer.ggml.tokens"])
    tokens[-1] = ""
    md["tokenizer.ggml.tokens"] = tokens
    with caplog.at_level(logging.WARNING):
        tok = Tokenizer.from_metadata(md)
    assert "empty token" in caplog.text and "not 'left right'" in caplog.text
    assert tok.decode(tok.encode("hello")) == "hello"


def test_scores_with_nan_and_int32_scores() -> None:
    md = _spm_metadata()
    scores = md["tokenizer.ggml.scores"].copy()
    scores[-3:] = np.nan
    Tokenizer.from_metadata({**md, "tokenizer.ggml.scores": scores}).encode("he he he")
    ints = np.arange(len(scores), dtype=np.int32)
    assert Tokenizer.from_metadata({**md, "tokenizer.ggml.scores": ints}).encode("he")


def test_eog_texts_absent_and_special_ids_absent() -> None:
    md = _bpe_metadata(**{"tokenizer.ggml.bos_token_id": None, "tokenizer.ggml.eos_token_id": None})
    tok = Tokenizer.from_metadata(md)
    assert tok.eos_id == 11  # llama.cpp's default EOS for BPE vocabularies
    assert tok.eog_ids == {0, 1, 11}  # and <|endoftext|>, <|im_end|>, found by their text
    assert tok.encode("", add_special=True) == []
    md = _bpe_metadata(**{"tokenizer.ggml.bos_token_id": None, "tokenizer.ggml.eos_token_id": 10**6})
    assert Tokenizer.from_metadata(md).eog_ids == {0, 1}


def test_huge_self_similar_vocabulary_builds_in_bounded_time() -> None:
    n = 300_000
    base = "ab" * 45
    tokens = [f"{base}{i:07d}"[-90:] for i in range(n)]
    md = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
          "tokenizer.ggml.token_type": np.full(n, 3, dtype=np.int32)}  # all control: the worst case for partition
    t0 = time.perf_counter()
    tok = Tokenizer.from_metadata(md)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    tok.encode(tokens[12345] + " and text", parse_special=True)
    encoded = time.perf_counter() - t0
    print(f"{n} tokens of 90 characters: built in {built:.2f} s, one encode in {encoded:.2f} s")
    assert built < 30 and encoded < 30


def test_lone_surrogates_in_text() -> None:
    tok = Tokenizer.from_metadata(_bpe_metadata())
    assert tok.decode(tok.encode("a\ud800b")) == "a\ufffd\ufffd\ufffdb"
