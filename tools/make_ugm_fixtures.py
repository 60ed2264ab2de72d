"""Golden UGM (T5) tokenizer fixtures from llama.cpp, through llama-cpp-python's low-level calls.

Run with a Python that has llama-cpp-python (development only, never a dependency of GGUF Lens), after
tools/make_ugm_vocab.py has written the vocabularies, and with SentencePiece's extracted sdist for its test text:

    /tmp/llvenv/bin/python tools/make_ugm_fixtures.py /tmp/spsrc/sentencepiece-0.2.1

Each vocabulary (tests/fixtures/ugm/*.gguf) is loaded with llama_model_load_from_file(vocab_only) and tokenizes
the shared corpus (tests/fixtures/tokenizer_corpus.json) plus the UGM strings below and sampled lines of the
sdist's test/botchan.txt, with llama_tokenize for the four add_special x parse_special combinations; the
add_special+parse_special ids are turned back into text by llama_detokenize for the four remove_special x
unparse_special combinations. Values are stored with tests/engine/tokenizer/corpus.py's helpers, small enough to
commit (~350 KB): for the UGM strings the ids inline when short, for the shared corpus digests, for the Unicode
sweep one group digest per SWEEP_GROUP chunks, texts always as digests, repeats as back-references; with
llama_token_to_piece of every token (group digests), the attributes that are not NORMAL, the EOG ids and
BOS/EOS/add_bos/add_eos. The English vocabulary is also rebuilt with its
metadata changed (no charsmap; no merging of spaces, with and without the space prefix) and run on the UGM strings,
so every branch of llama.cpp's normalize() is pinned. Output: tests/fixtures/ugm/tokens_ugm.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from importlib import metadata as importlib_metadata
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import make_tokenizer_fixtures as mtf  # noqa: E402  (tokenize / detokenize / token_to_piece with growing buffers)
import make_ugm_vocab  # noqa: E402
from tests.engine.tokenizer import corpus as corpus_lib  # noqa: E402

OUT = ROOT / "tests" / "fixtures" / "ugm" / "tokens_ugm.json"
SWEEP_GROUP = 64  # sweep chunks per stored digest
PIECE_GROUP = 256  # token ids per stored digest of llama_token_to_piece
BOTCHAN_EVERY = 25  # every 25th line of test/botchan.txt (172 lines, the Gutenberg header and BOM included)
# what UGM does that BPE/SPM do not: the nfkc charsmap, space merging and prefixing, unknown runs, user tokens
UGM_STRINGS = [
    # sentencepiece_test.py's own sentences
    "I saw a girl with a telescope.", "清水寺は京都にある。", "hello\tworld\r\nthis\tis a \b pen", "Hello world",
    # spaces: runs, leading, trailing, only spaces, other space characters the charsmap folds
    "a  b", "a     b   c", "   ", " ", " leading", "trailing ", "  both  ", "\u3000全角\u3000space", "nb\u00a0sp",
    "thin\u2009space", "zero\u200bwidth", "\ufeffbom", "soft\u00adhyphen", "en\u2002em\u2003", "x \u3000 y",
    # newlines and tabs
    "a\nb", "a\tb", "\r\n", "line1\n\nline2\n", "\t\tindented", "\n", "tab\t", " \n \t ",
    # full-width and compatibility characters nfkc rewrites
    "ｈｅｌｌｏ ｗｏｒｌｄ", "ＡＢＣ１２３！？", "①②③ ⑩", "ﬁ ﬂ ﬃ ﬄ ﬅ", "ﬁne ﬂow", "㍻ ㌀ ㎏ ㎞", "½ ¼ ¾", "Ⅻ ⅷ",
    "ｶﾀｶﾅ ﾊﾟﾋﾟ", "™ ℌ ℕ ℃", "x² H₂O", "e\u0301 é", "A\u030a Å", "ǆ Ǆ", "…", "ｈ", "ｈｉ", "ｈｉｔ ｈｉ",
    "ﬁx ﬁxed ﬁ", "\u2126 \u212b", "ｱｲｳ", "‼ ⁇", "⑴ ⒜", "㈱", "ℓ", "\u1e9b\u0323",
    # characters outside the vocabulary: unknown runs merge
    "Ω≈ç√∫", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "ᚠᛇᚻ᛫ᛒᛦᚦ", "안녕하세요 세계", "مرحبا بالعالم", "नमस्ते दुनिया", "Ελληνικά", "Привет мир",
    "a😀b", "😀👍🏽👨‍👩‍👧 🇯🇵", "zzz\U0010ffff", "\x00", "a\x00b", "\x01\x02\x1f\x7f",
    # special tokens' texts and near misses, unused padding tokens
    "<unk>", "<s>", "</s>", "<s>hi</s>", "<extra_id_0>", "<extra_id_0><extra_id_1>", " <extra_id_0> x ", "<extra_id_",
    "<e", "<ex tra", "<<extra_id_0>>", "[PAD1003]", "[PAD8003]", "x[PAD1004]y", "<pad>",
    # Japanese for the Japanese vocabulary
    "吾輩は猫である。名前はまだ無い。", "東京特許許可局 きゃりーぱみゅぱみゅ", "カタカナとひらがな、漢字。", "２０２４年１２月",
    # mixed and long-ish
    "The quick brown fox jumps over the lazy dog.", "Don't you think it's 3.14? — “quoted” «text»",
    "ａｂｃ abc ＡＢＣ", "  ｈｅｌｌｏ   wor ld ", "①ﬁ", "I  saw\ta\ngirl", "word " * 40, "ｘ" * 50,
]
COMBOS = mtf.COMBOS
DETOK = mtf.DETOK
# variant name -> changes to the English vocabulary's .model before writing it (llama.cpp reads these keys)
VARIANTS = {
    "no_charsmap": {"charsmap": b""},
    "keep_spaces": {"remove_extra_whitespaces": False},
    "keep_spaces_no_prefix": {"remove_extra_whitespaces": False, "add_dummy_prefix": False},
    "no_prefix": {"add_dummy_prefix": False},
}
GGUF_KEY = {"charsmap": "tokenizer.ggml.precompiled_charsmap", "add_dummy_prefix": "tokenizer.ggml.add_space_prefix",
            "remove_extra_whitespaces": "tokenizer.ggml.remove_extra_whitespaces"}


def load_vocab(path: Path):
    """A vocab-only llama_model and its llama_vocab."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model, llama_cpp.llama_model_get_vocab(model)


def run(vocab, text: str) -> tuple[list[list[int]], list[bytes]]:
    """llama_tokenize's ids for the four COMBOS and llama_detokenize of the first ids for the four DETOK."""
    raw = text.encode("utf-8", errors="surrogatepass")
    ids = [mtf.tokenize(vocab, raw, add_special, parse_special) for _, add_special, parse_special in COMBOS]
    return ids, [mtf.detokenize(vocab, ids[0], rs, us) for rs, us in DETOK]


def entries_for(vocab, items: list[tuple[str, str]], inline: bool) -> dict[str, list]:
    """name -> packed [four id lists..., four detokenized texts]: ids inline when short (if inline) else digests,
    texts as digests."""
    entries = {}
    for name, text in items:
        ids, texts = run(vocab, text)
        stored = [corpus_lib.store_ids(t) if inline else corpus_lib.digest(t) for t in ids]
        stored += [corpus_lib.bytes_digest(t) for t in texts]
        entries[name] = corpus_lib.pack(stored)
    return entries


def sweep_digests(vocab, items: list[tuple[str, str]]) -> list[list[str]]:
    """Per group of SWEEP_GROUP sweep chunks: the group digest of each of the eight values."""
    out = []
    for k in range(0, len(items), SWEEP_GROUP):
        runs = [run(vocab, text) for _, text in items[k:k + SWEEP_GROUP]]
        row = [corpus_lib.group_digest([r[0][j] for r in runs]) for j in range(len(COMBOS))]
        row += [corpus_lib.group_digest([list(r[1][j]) for r in runs]) for j in range(len(DETOK))]
        out.append(row)
    return out


def piece_digests(vocab, n_vocab: int) -> list[list[str]]:
    """Per group of PIECE_GROUP ids: group digests of llama_token_to_piece's bytes, special=True and False."""
    return [[corpus_lib.group_digest([list(mtf.token_to_piece(vocab, t, special))
                                      for t in range(k, min(k + PIECE_GROUP, n_vocab))]) for special in (True, False)]
            for k in range(0, n_vocab, PIECE_GROUP)]


def describe(vocab, path: Path, corpus_items: list[tuple[str, str]], extra_items: list[tuple[str, str]]) -> dict:
    """Everything the tests compare for one vocabulary."""
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    attrs, eog = mtf.token_attrs(vocab, n_vocab)
    sweep = [item for item in corpus_items if item[0].startswith("sweep")]
    rest = [item for item in corpus_items if not item[0].startswith("sweep")]

    def opt(token: int) -> int | None:
        return None if token < 0 else int(token)

    return {
        "file": path.name, "n_vocab": n_vocab,
        "bos": opt(llama_cpp.llama_vocab_bos(vocab)), "eos": opt(llama_cpp.llama_vocab_eos(vocab)),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
        "eog": eog, "attrs_not_normal": attrs, "pieces": piece_digests(vocab, n_vocab),
        "extra": entries_for(vocab, extra_items, inline=True),
        "corpus": entries_for(vocab, rest, inline=False),
        "sweep": sweep_digests(vocab, sweep),
    }


def main() -> int:
    """Write tests/fixtures/ugm/tokens_ugm.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sdist", type=Path, help="the extracted sentencepiece-0.2.1 folder (for test/botchan.txt)")
    args = parser.parse_args()
    llama_cpp.llama_backend_init()
    lines = (args.sdist / "test" / "botchan.txt").read_text(encoding="utf-8").splitlines()
    extra = [{"name": f"ugm{i:03d}", "text": t} for i, t in enumerate(UGM_STRINGS)]
    extra += [{"name": f"botchan{k:04d}", "text": lines[k]} for k in range(0, len(lines), BOTCHAN_EVERY)]
    extra_items = [(e["name"], e["text"]) for e in extra]
    corpus_items = list(corpus_lib.expand(corpus_lib.load()))
    out: dict = {"llama_cpp_python": importlib_metadata.version("llama-cpp-python"),
                 "sweep_group": SWEEP_GROUP, "piece_group": PIECE_GROUP, "combos": [c[0] for c in COMBOS],
                 "detokenize": [f"remove_special={rs},unparse_special={us}" for rs, us in DETOK],
                 "extra": extra, "vocabs": {}, "variants": {}}
    for name in make_ugm_vocab.SOURCES:
        path = ROOT / "tests" / "fixtures" / "ugm" / f"{name}.gguf"
        model, vocab = load_vocab(path)
        out["vocabs"][name] = describe(vocab, path, corpus_items, extra_items)
        llama_cpp.llama_model_free(model)
        print(f"{name}: {len(corpus_items)} + {len(extra_items)} strings", file=sys.stderr)
    rel, _, added = make_ugm_vocab.SOURCES["t5-sp-test"]
    source = make_ugm_vocab.parse_model((args.sdist / rel).read_bytes())
    with tempfile.TemporaryDirectory() as tmp:
        for variant, changes in VARIANTS.items():
            path = Path(tmp) / f"{variant}.gguf"
            make_ugm_vocab.write_gguf({**source, **changes}, added, path, rel)
            model, vocab = load_vocab(path)
            # the GGUF keys changed: a bool is the new value, None a key left out
            metadata = {GGUF_KEY[k]: v if isinstance(v, bool) else None for k, v in changes.items()}
            out["variants"][variant] = {"vocab": "t5-sp-test", "metadata": metadata,
                                        "extra": entries_for(vocab, extra_items, inline=False)}
            llama_cpp.llama_model_free(model)
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=None) + "\n", encoding="utf-8")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
