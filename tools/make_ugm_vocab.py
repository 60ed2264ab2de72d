"""Make vocabulary-only T5 (UGM) GGUFs from real SentencePiece unigram models, as llama.cpp's converter does.

llama.cpp ships no T5 vocabulary file, so the test material comes from SentencePiece's own source release,
sentencepiece 0.2.1, sdist sentencepiece-0.2.1.tar.gz from PyPI
(sha256 8138cec27c2f2282f4a34d9a016e3374cd40e5c6e9cb335063db66a0a3b71fad), whose test/ folder holds two UNIGRAM
models with the nfkc normaliser and its precompiled character map:

    test/test_model.model     1,000 pieces trained on test/botchan.txt (English)
                              sha256 4884d27bf50494e080aa99dbb868f27b68b6a3b6bd128da37ad6057c5e3cf5a2
    test/test_ja_model.model  8,000 pieces (Japanese)
                              sha256 e39551e7ab937745b25edf55a7399d3c78948fda1dabca6b1781df2fcec67f65

    pip download --no-deps --no-binary :all: sentencepiece==0.2.1 -d /tmp/spsrc
    tar xzf /tmp/spsrc/sentencepiece-0.2.1.tar.gz -C /tmp/spsrc
    .venv/bin/python tools/make_ugm_vocab.py /tmp/spsrc/sentencepiece-0.2.1

The .model file is a protobuf (sentencepiece_model.proto: ModelProto); a small wire-format reader here takes the
pieces, the trainer spec's model type and special ids and the normalizer spec, so sentencepiece is not needed.
The GGUF is written the way T5Model.set_vocab in llama.cpp's conversion/t5.py writes it: tokenizer.ggml.model
't5', pre 'default', the pieces with their scores and types (USER_DEFINED pieces of the .model become NORMAL there,
as the converter asks only IsUnknown/IsControl/IsUnused/IsByte), add_space_prefix from add_dummy_prefix,
remove_extra_whitespaces, the precompiled charsmap; a config vocab_size larger than the model pads with
'[PAD<i>]' UNUSED tokens of score -10000, and added_tokens.json entries overwrite padded ids as USER_DEFINED with
score -1000 (`added` below plays that file: ASCII '<extra_id_N>' tokens for the English vocabulary, and for the
Japanese one also tokens starting with non-ASCII bytes, whose prefixes llama.cpp passes through unnormalised).
The special ids are the trainer spec's (SpecialVocab's job in the converter), and the hyperparameters are
t5-small's, which llama.cpp's vocab_only load reads.
"""
from __future__ import annotations

import argparse
import hashlib
import struct
import sys
from pathlib import Path

import gguf

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "fixtures" / "ugm"
# fixture name -> (path in the sdist, its sha256, added_tokens.json: text -> index into the padding)
SOURCES = {
    "t5-sp-test": ("test/test_model.model", "4884d27bf50494e080aa99dbb868f27b68b6a3b6bd128da37ad6057c5e3cf5a2",
                   {"<extra_id_0>": 0, "<extra_id_1>": 1}),
    "t5-sp-test-ja": ("test/test_ja_model.model",
                      "e39551e7ab937745b25edf55a7399d3c78948fda1dabca6b1781df2fcec67f65",
                      {"<extra_id_0>": 0, "ﬁx": 1, "ｈｉ": 2}),
}
EXTRA_VOCAB = 8  # config vocab_size beyond the model's pieces (t5-small: 32,128 for 32,000 pieces)
# t5-small's config.json, as T5Model.set_gguf_parameters writes it
HPARAMS = {"n_positions": 512, "d_model": 512, "d_ff": 2048, "num_layers": 6, "num_heads": 8, "d_kv": 64,
           "layer_norm_epsilon": 1e-6, "relative_attention_num_buckets": 32, "decoder_start_token_id": 0}
# SentencePiece piece type -> GGUF token type (llama_token_type), as conversion/t5.py maps them
PIECE_TYPE = {1: 1, 2: 2, 3: 3, 4: 1, 5: 5, 6: 6}
UNIGRAM = 1


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A base-128 varint at pos: (value, position after it)."""
    value, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) of every field of a message: varints as ints, fixed32/64 and bytes as bytes."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos)
            out.append((number, value))
        elif wire == 1:
            out.append((number, buf[pos:pos + 8]))
            pos += 8
        elif wire == 2:
            n, pos = read_varint(buf, pos)
            out.append((number, buf[pos:pos + n]))
            pos += n
        elif wire == 5:
            out.append((number, buf[pos:pos + 4]))
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire} for field {number}")
    return out


def int32(value: int) -> int:
    """A varint read back as the signed int32 protobuf encodes (negatives take ten bytes)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def parse_model(buf: bytes) -> dict:
    """The parts of a ModelProto the converter reads (defaults as sentencepiece_model.proto declares them)."""
    model: dict = {"pieces": [], "model_type": UNIGRAM, "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1,
                   "vocab_size": None, "normalizer": "", "charsmap": b"", "add_dummy_prefix": True,
                   "remove_extra_whitespaces": True}
    trainer_keys = {3: "model_type", 4: "vocab_size", 40: "unk_id", 41: "bos_id", 42: "eos_id", 43: "pad_id"}
    for number, value in fields(buf):
        if number == 1:  # SentencePiece {piece = 1, score = 2, type = 3}
            piece = {"piece": "", "score": 0.0, "type": 1}
            for n, v in fields(value):
                if n == 1:
                    piece["piece"] = v.decode("utf-8")
                elif n == 2:
                    piece["score"] = struct.unpack("<f", v)[0]
                elif n == 3:
                    piece["type"] = v
            model["pieces"].append(piece)
        elif number == 2:  # TrainerSpec
            for n, v in fields(value):
                if n in trainer_keys:
                    model[trainer_keys[n]] = int32(v)
        elif number == 3:  # NormalizerSpec {name = 1, precompiled_charsmap = 2, add_dummy_prefix = 3, ...}
            for n, v in fields(value):
                if n == 1:
                    model["normalizer"] = v.decode("utf-8")
                elif n == 2:
                    model["charsmap"] = bytes(v)
                elif n == 3:
                    model["add_dummy_prefix"] = bool(v)
                elif n == 4:
                    model["remove_extra_whitespaces"] = bool(v)
    return model


def vocabulary(model: dict, added: dict[str, int]) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types as T5Model.set_vocab builds them (padding and added tokens included)."""
    n_pieces = len(model["pieces"])
    vocab_size = n_pieces + EXTRA_VOCAB
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores = [-10000.0] * vocab_size
    types = [int(gguf.TokenType.UNUSED)] * vocab_size
    for i, piece in enumerate(model["pieces"]):
        tokens[i] = piece["piece"]
        scores[i] = piece["score"]
        types[i] = PIECE_TYPE.get(piece["type"], 1)
    for text, k in added.items():
        tokens[n_pieces + k] = text
        scores[n_pieces + k] = -1000.0
        types[n_pieces + k] = int(gguf.TokenType.USER_DEFINED)
    return tokens, scores, types


def write_gguf(model: dict, added: dict[str, int], out: Path, source_name: str) -> None:
    """The vocabulary-only GGUF: general.architecture t5, t5-small's hyperparameters, the t5 tokenizer."""
    tokens, scores, types = vocabulary(model, added)
    arch = "t5"
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(f"t5 vocabulary from sentencepiece 0.2.1 {source_name}")
    hp = HPARAMS
    w.add_context_length(hp["n_positions"])
    w.add_embedding_length(hp["d_model"])
    w.add_feed_forward_length(hp["d_ff"])
    w.add_block_count(hp["num_layers"])
    w.add_head_count(hp["num_heads"])
    w.add_key_length(hp["d_kv"])
    w.add_value_length(hp["d_kv"])
    w.add_layer_norm_eps(hp["layer_norm_epsilon"])
    w.add_relative_attn_buckets_count(hp["relative_attention_num_buckets"])
    w.add_layer_norm_rms_eps(hp["layer_norm_epsilon"])
    w.add_decoder_start_token_id(hp["decoder_start_token_id"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(model["add_dummy_prefix"])
    w.add_remove_extra_whitespaces(model["remove_extra_whitespaces"])
    if model["charsmap"]:
        w.add_precompiled_charsmap(model["charsmap"])
    for role, adder in (("unk_id", w.add_unk_token_id), ("bos_id", w.add_bos_token_id),
                        ("eos_id", w.add_eos_token_id), ("pad_id", w.add_pad_token_id)):
        if 0 <= model[role] < len(tokens):
            adder(model[role])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    """Read both .model files of the sdist and write their GGUFs (refusing files other than the documented)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sdist", type=Path, help="the extracted sentencepiece-0.2.1 folder")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name, (rel, sha256, added) in SOURCES.items():
        path = args.sdist / rel
        buf = path.read_bytes()
        digest = hashlib.sha256(buf).hexdigest()
        if digest != sha256:
            print(f"{path}: sha256 {digest} is not the documented {sha256}", file=sys.stderr)
            return 2
        model = parse_model(buf)
        if model["model_type"] != UNIGRAM:
            print(f"{path}: model_type {model['model_type']} is not UNIGRAM (1)", file=sys.stderr)
            return 2
        out = args.out_dir / f"{name}.gguf"
        write_gguf(model, added, out, rel)
        print(f"wrote {out} ({out.stat().st_size} bytes): {len(model['pieces'])} pieces + {EXTRA_VOCAB} padded, "
              f"normalizer {model['normalizer']!r}, charsmap {len(model['charsmap'])} bytes, add_dummy_prefix "
              f"{model['add_dummy_prefix']}, remove_extra_whitespaces {model['remove_extra_whitespaces']}, ids unk "
              f"{model['unk_id']} bos {model['bos_id']} eos {model['eos_id']} pad {model['pad_id']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
