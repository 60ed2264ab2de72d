"""The UGM (T5) tokenizer against llama.cpp on real SentencePiece unigram vocabularies, and its bad-metadata errors.

The vocabularies (tests/fixtures/ugm/*.gguf) are SentencePiece 0.2.1's own test models converted as llama.cpp's
converter does (tools/make_ugm_vocab.py); the expected ids, llama_detokenize texts, token pieces and attributes
come from llama.cpp through tools/make_ugm_fixtures.py (tests/fixtures/ugm/tokens_ugm.json): the UGM strings and
sampled lines of SentencePiece's test text with every add_special x parse_special combination, the whole shared
corpus (tests/fixtures/tokenizer_corpus.json) with add_special true and false (parse_special true), and the
English vocabulary rebuilt without its charsmap and with the whitespace flags changed.
"""
from __future__ import annotations

import functools
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import ModelFormatError
from engine.gguf.reader import open_gguf
from engine.tokenizer.ugm_normalize import CHARSMAP_KEY, CharsMap
from engine.tokenizer.vocab import StreamDecoder, Tokenizer
from tests.engine.tokenizer import corpus

UGM = Path(__file__).resolve().parents[2] / "fixtures" / "ugm"
FIXTURE = UGM / "tokens_ugm.json"
SCORES_KEY = "tokenizer.ggml.scores"
# (add_special, parse_special) of the fixture's combos, by name
COMBOS = {"add_special+parse_special": (True, True), "add_special": (True, False),
          "parse_special": (False, True), "plain": (False, False)}
CORPUS_COMBOS = ("add_special+parse_special", "parse_special")  # on the whole shared corpus


@functools.lru_cache(maxsize=None)
def _fixture() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


@functools.lru_cache(maxsize=None)
def _metadata(name: str) -> dict[str, Any]:
    with open_gguf(UGM / f"{name}.gguf") as g:
        return dict(g.metadata)


@functools.lru_cache(maxsize=None)
def _tokenizer(name: str) -> Tokenizer:
    return Tokenizer.from_metadata(_metadata(name))


def _vocab_names() -> list[str]:
    return list(_fixture()["vocabs"])


def _extra() -> list[tuple[str, str]]:
    return [(e["name"], e["text"]) for e in _fixture()["extra"]]


def _check(tok: Tokenizer, items: list[tuple[str, str]], entries: dict[str, list],
           combos: tuple[str, ...]) -> list[str]:
    """Differences between our ids / detokenized bytes and llama.cpp's stored ones, one line each."""
    fx = _fixture()
    n_combos = len(fx["combos"])
    bad = []
    for name, text in items:
        stored = entries[name]
        ids: dict[str, list[int]] = {}
        for combo in combos:
            ids[combo] = got = tok.encode(text, add_special=COMBOS[combo][0], parse_special=COMBOS[combo][1])
            want = corpus.unpack(stored, fx["combos"].index(combo))
            if not corpus.matches(got, want):
                shown = want if isinstance(want, str) else want[:12]
                bad.append(f"{name} {text[:30]!r} {combo}: got {got[:12]} want {shown}")
        for j, key in enumerate(fx["detokenize"]):  # of llama.cpp's (and, when equal, our) first combo's ids
            got_bytes = tok.detokenize(ids[fx["combos"][0]], remove_special="remove_special=True" in key,
                                       unparse_special="unparse_special=True" in key)
            if corpus.bytes_digest(got_bytes) != corpus.unpack(stored, n_combos + j):
                bad.append(f"{name} {text[:30]!r} detokenize {key}: got {got_bytes[:40]!r}")
    return bad


@pytest.mark.parametrize("name", _vocab_names())
def test_ugm_strings_match_llama_cpp(name: str) -> None:
    """The UGM strings and SentencePiece's test lines: ids for all four combos and llama_detokenize's texts."""
    items = _extra()
    bad = _check(_tokenizer(name), items, _fixture()["vocabs"][name]["extra"], tuple(COMBOS))
    print(f"{name}: {len(items)} UGM strings x 4 combos + 4 detokenizations, {len(bad)} differ")
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:30])


@pytest.mark.parametrize("name", _vocab_names())
def test_shared_corpus_matches_llama_cpp(name: str) -> None:
    """Every literal and generated string of the shared corpus, then the Unicode sweep in groups."""
    fx, tok = _fixture(), _tokenizer(name)
    vocab = fx["vocabs"][name]
    items = list(corpus.expand(corpus.load()))
    rest = [it for it in items if not it[0].startswith("sweep")]
    bad = _check(tok, rest, vocab["corpus"], CORPUS_COMBOS)
    sweep = [text for n, text in items if n.startswith("sweep")]
    group, n_combos = fx["sweep_group"], len(fx["combos"])
    assert len(vocab["sweep"]) == -(-len(sweep) // group)
    for g, want in enumerate(vocab["sweep"]):
        texts = sweep[g * group:(g + 1) * group]
        ids = {}
        for combo in CORPUS_COMBOS:
            add_special, parse_special = COMBOS[combo]
            ids[combo] = [tok.encode(t, add_special=add_special, parse_special=parse_special) for t in texts]
            if corpus.group_digest(ids[combo]) != want[fx["combos"].index(combo)]:
                bad.append(f"sweep group {g} ({texts[0][:12]!r}...) {combo}")
        for j, key in enumerate(fx["detokenize"]):
            flags = {"remove_special": "remove_special=True" in key, "unparse_special": "unparse_special=True" in key}
            got = [list(tok.detokenize(i, **flags)) for i in ids[fx["combos"][0]]]
            if corpus.group_digest(got) != want[n_combos + j]:
                bad.append(f"sweep group {g} detokenize {key}")
    print(f"{name}: {len(rest)} strings + {len(sweep)} sweep chunks x {len(CORPUS_COMBOS)} combos, {len(bad)} differ")
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:30])


@pytest.mark.parametrize("variant", list(json.loads(FIXTURE.read_text(encoding="utf-8"))["variants"]))
def test_metadata_variants_match_llama_cpp(variant: str) -> None:
    """No charsmap (llama.cpp then copies characters unchanged), spaces kept, no space prefix."""
    spec = _fixture()["variants"][variant]
    metadata = dict(_metadata(spec["vocab"]))
    for key, value in spec["metadata"].items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    tok = Tokenizer.from_metadata(metadata)
    bad = _check(tok, _extra(), spec["extra"], tuple(COMBOS))
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:30])


@pytest.mark.parametrize("name", _vocab_names())
def test_specials_and_pieces_match_llama_cpp(name: str) -> None:
    """BOS/EOS, add_bos/add_eos, EOG ids, attributes and llama_token_to_piece of every token."""
    want, tok = _fixture()["vocabs"][name], _tokenizer(name)
    assert tok.n_vocab == want["n_vocab"]
    assert (tok.bos_id, tok.eos_id, tok.add_bos, tok.add_eos) == (want["bos"], want["eos"], want["add_bos"],
                                                                  want["add_eos"])
    assert sorted(tok.eog_ids) == want["eog"]
    assert {str(i): a for i, a in enumerate(tok._attrs) if a != 4} == want["attrs_not_normal"]
    group = _fixture()["piece_group"]
    for g, (special, plain) in enumerate(want["pieces"]):
        ids = range(g * group, min((g + 1) * group, tok.n_vocab))
        assert corpus.group_digest([list(tok.token_bytes(i, special=True)) for i in ids]) == special, g
        assert corpus.group_digest([list(tok.token_bytes(i, special=False)) for i in ids]) == plain, g


def test_stream_decoder_gives_the_pieces_and_never_splits_characters() -> None:
    """The streaming detokenizer gives llama_token_to_piece's bytes in order (the leading space that
    llama_detokenize strips for a space-prefixed vocabulary stays: it streams generated tokens) and never a
    partial character."""
    tok = _tokenizer("t5-sp-test-ja")
    for name, text in _extra():
        ids = tok.encode(text, add_special=True)
        stream = StreamDecoder(tok)
        parts = [stream.feed(i) for i in ids] + [stream.flush()]
        assert "".join(parts) == b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", errors="replace"), name
        assert "".join(parts).lstrip(" ") == tok.decode(ids).lstrip(" "), name
        assert all("\ufffd" not in p for p in parts) or "\ufffd" in text, name


# -- bad metadata -------------------------------------------------------------------------------------


def _charsmap_blob() -> bytes:
    return _metadata("t5-sp-test")[CHARSMAP_KEY].tobytes()


def _with_unit(blob: bytes, index: int, unit: int) -> bytes:
    """blob with XCDA unit index replaced."""
    return blob[:4 + 4 * index] + struct.pack("<I", unit) + blob[8 + 4 * index:]


def _load_with(key: str, value: Any) -> Tokenizer:
    metadata = dict(_metadata("t5-sp-test"))
    metadata[key] = value
    return Tokenizer.from_metadata(metadata)


def _bad_charsmaps() -> dict[str, bytes]:
    blob = _charsmap_blob()
    size = struct.unpack_from("<I", blob)[0]
    charsmap = CharsMap(blob)
    assert charsmap.longest("①".encode(), 0) == (3, b"1")
    value_unit = next(iter(charsmap._strings))  # that leaf's value unit: its low 31 bits are a replacement offset
    n_strings = len(blob) - 4 - size
    unterminated = _with_unit(blob[:-1] + b"x", value_unit, (1 << 31) | (n_strings - 1))
    return {
        "empty": b"",
        "shorter than its header": blob[:3],
        "truncated inside the XCDA array": blob[:size // 2],
        "header only": blob[:4 + size],
        "root outside the array": _with_unit(blob, 0, (size // 4 + 5) << 10),
        "children outside the array": struct.pack("<II", 4, 0) + b"\0",
        "replacement offset past the strings": _with_unit(blob, value_unit, (1 << 31) | (n_strings + 7)),
        "replacement without its NUL": unterminated,
    }


@pytest.mark.parametrize("case", list(_bad_charsmaps()))
def test_bad_charsmap_is_a_model_format_error(case: str) -> None:
    blob = _bad_charsmaps()[case]
    with pytest.raises(ModelFormatError) as err:
        _load_with(CHARSMAP_KEY, np.frombuffer(blob, dtype=np.uint8))
    assert err.value.field == CHARSMAP_KEY and CHARSMAP_KEY in str(err.value)


@pytest.mark.parametrize("value", [np.zeros(8, dtype=np.float32), "charsmap", 7, [1.5, 2.5],
                                   np.zeros((2, 2), np.uint8)])
def test_charsmap_of_the_wrong_type_is_a_model_format_error(value: Any) -> None:
    with pytest.raises(ModelFormatError) as err:
        _load_with(CHARSMAP_KEY, value)
    assert err.value.field == CHARSMAP_KEY


@pytest.mark.parametrize("cut", [1, 500])
def test_scores_of_the_wrong_length_are_a_model_format_error(cut: int) -> None:
    scores = _metadata("t5-sp-test")[SCORES_KEY]
    for value in (scores[:-cut], np.concatenate([scores, scores[:cut]])):
        with pytest.raises(ModelFormatError) as err:
            _load_with(SCORES_KEY, value)
        assert err.value.field == SCORES_KEY


def test_charsmap_as_int8_or_list_loads_the_same() -> None:
    """llama.cpp accepts an int8 or uint8 array; a list of small ints (a writer's choice) reads the same."""
    blob = _charsmap_blob()
    want = _tokenizer("t5-sp-test").encode("ｈｅｌｌｏ ①ﬁ")
    assert _load_with(CHARSMAP_KEY, np.frombuffer(blob, dtype=np.int8)).encode("ｈｅｌｌｏ ①ﬁ") == want
    assert _load_with(CHARSMAP_KEY, list(blob)).encode("ｈｅｌｌｏ ①ﬁ") == want


def test_large_vocabulary_fallback_matches_llama_cpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the prefix set (a vocabulary past MAX_PREFIX_BYTES tries every token length) the ids are the same."""
    monkeypatch.setattr("engine.tokenizer.ugm.MAX_PREFIX_BYTES", 0)
    for name in _vocab_names():
        tok = Tokenizer.from_metadata(_metadata(name))
        assert tok._model._prefixes is None
        bad = _check(tok, _extra(), _fixture()["vocabs"][name]["extra"], tuple(COMBOS))
        assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:30])


def test_huge_self_similar_vocabulary_is_bounded() -> None:
    """200,000 tokens of 90 code points (36 MB of token text) build and encode without a prefix set."""
    n = 200_000
    stem = "\u0101" * 83
    tokens = ["<unk>", "</s>", "<pad>"] + [stem + f"{i:07d}" for i in range(n)]
    types = np.ones(len(tokens), np.int32)
    types[:3] = (2, 3, 3)
    tok = Tokenizer.from_metadata({"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": tokens,
                                   "tokenizer.ggml.scores": np.linspace(0, -1, len(tokens), dtype=np.float32),
                                   "tokenizer.ggml.token_type": types, "tokenizer.ggml.unknown_token_id": 0,
                                   "tokenizer.ggml.eos_token_id": 1, "tokenizer.ggml.padding_token_id": 2})
    assert tok._model._prefixes is None
    ids = tok.encode((stem + "0000042") * 3 + " " + "\u0101" * 500, add_special=True)
    # three whole tokens, then one unknown for the uncovered space and run of U+0101, then EOS
    assert ids == [tok.token_id(stem + "0000042")] * 3 + [tok.token_id("<unk>"), tok.eos_id]


def test_charsmap_with_a_cycle_loads_and_normalizes_nothing() -> None:
    """A hostile XCDA whose child for 'a' links back to the root: checked once, walked only as far as the input."""
    units = [0] * 256
    units[0x61] = (0x61 << 10) | 0x61  # LCHECK 'a', BASE 0x61: its children are the root's again
    blob = struct.pack("<I", 4 * len(units)) + struct.pack(f"<{len(units)}I", *units) + b"\0"
    tok = _load_with(CHARSMAP_KEY, np.frombuffer(blob, dtype=np.uint8))
    metadata = dict(_metadata("t5-sp-test"))
    del metadata[CHARSMAP_KEY]
    plain = Tokenizer.from_metadata(metadata)  # no charsmap: checked against llama.cpp by the variants above
    for text in ("a" * 300, "banana ｈｅｌｌｏ", "aaa①"):
        assert tok.encode(text, add_special=True) == plain.encode(text, add_special=True)
