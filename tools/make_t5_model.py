"""The random-weight T5 test models and llama.cpp's decoder logits on them (make_arch_models.py's `t5` entries).

Each model (2 encoder and 2 decoder blocks, 256 wide, 4 heads of 64, 32 relative position buckets) is written from a
fixed seed with the project's GGUF writer in llama.cpp's tensor layout (enc.blk.*, dec.blk.*, the position bias in
block 0 only, as converted T5 files have it), quantized by llama.cpp's llama_model_quantize, then run by
llama-cpp-python's low-level API (a development tool, see README.md "Golden fixtures"):

    /tmp/llvenv/bin/python tools/make_arch_models.py t5 t5_relu      # or: tools/make_t5_model.py [NAME ...]

llama_encode on the encoder tokens, then llama_decode on the decoder tokens (the first from
llama_model_decoder_start_token), the first `prefill` in one batch and the rest one per call, every position's
logits kept (F16 KV cache, no flash attention). Per quantization and case, tests/fixtures/arch/NAME.npz holds the
top-K log-probabilities at every decoder position and NAME.json each quantized file's sha256.

The tokenizer is a real T5 one: every tokenizer.ggml.* key of tests/fixtures/ugm/t5-sp-test.gguf (UGM, 1,008 tokens
from sentencepiece's own unigram test model, tools/make_ugm_vocab.py) and its decoder_start_token_id, read from that
file with their GGUF types. NAME.json also holds llama.cpp's ids for PROMPT (llama_tokenize, add_special, as `gguf-lens
generate` tokenizes a prompt) and, per quantization, its greedy decode of them: llama_encode on the prompt ids, then
GREEDY_STEPS llama_decode calls of one token each from the start token, each taking the argmax of its logits.

The weights make each part of T5 move the answer by far more than rounding: the position bias is large against
the unscaled q.k (whose weights are scaled down by 1/sqrt(head_dim)), so distance decides where attention looks;
the cross-attention's output is three times the other blocks', so what the encoder read decides the top token as
much as the decoder's own last token (the head is a bigram table, as in make_arch_models.py).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.gguf import open_gguf, write_gguf  # noqa: E402
from engine.gguf.constants import ARRAY_DTYPES, GGUFValueType  # noqa: E402
from engine.quant.types import GGMLType  # noqa: E402
from tools.make_arch_models import (  # noqa: E402
    FIXTURES,
    OUT_SCALE,
    SEED,
    TOP_K,
    U32,
    log_softmax,
    quantize_llama_cpp,
    sha256_file,
)

QUANTS = {"F16": 1, "Q8_0": 7}  # llama_ftype ids
N_CTX = 512
UGM_VOCAB = ROOT / "tests" / "fixtures" / "ugm" / "t5-sp-test.gguf"
START_KEY = "t5.decoder_start_token_id"
PROMPT = "translate English to German: The house is wonderful."
GREEDY_STEPS = 8


@functools.lru_cache(maxsize=1)
def ugm_vocab() -> dict[str, Any]:
    """UGM_VOCAB's tokenizer.ggml.* keys and its decoder start token, each with the GGUF type the file gives it."""
    g = open_gguf(UGM_VOCAB)
    try:
        out: dict[str, Any] = {}
        for key, value in g.metadata.items():
            if not (key.startswith("tokenizer.") or key == START_KEY):
                continue
            vtype = g.metadata_types[key][0]
            if vtype not in (GGUFValueType.ARRAY, GGUFValueType.STRING, GGUFValueType.BOOL):
                value = ARRAY_DTYPES[vtype].type(value)  # a scalar keeps its width (u32 ids, not Python ints)
            out[key] = value
        return out
    finally:
        g.close()


def n_vocab() -> int:
    """The test models' vocabulary size: the UGM vocabulary's token count (1,008)."""
    return len(ugm_vocab()["tokenizer.ggml.tokens"])


def dec_start() -> int:
    """The decoder start token: the UGM vocabulary file's decoder_start_token_id (0, as real T5 files have)."""
    return int(ugm_vocab()[START_KEY])


@dataclass(frozen=True)
class T5Spec:
    """One T5 test model."""

    gated: bool = True  # ffn_gate (flan-T5: GELU-gated) or not (T5: ReLU)
    dim: int = 256
    n_heads: int = 4
    head_dim: int = 64
    hidden: int = 512
    n_layers: int = 2  # encoder blocks
    n_dec_layers: int = 2
    n_buckets: int = 32
    bias_std: float = 2.0  # the learned position bias per (bucket, head)
    cross_scale: float = 3 * OUT_SCALE  # the cross-attention output's weights times this
    logit_std: float = 3.5
    successor: float = 1.2


T5_SPECS: dict[str, T5Spec] = {"t5": T5Spec(gated=True), "t5_relu": T5Spec(gated=False)}
# (encoder tokens, decoder tokens with the start token, decoder tokens run as one batch): 40 keys run every
# encoder and cross product through ggml's vec_dot (not a multiple of 16), 64 through tinyBLAS
CASES: dict[str, tuple[int, int, int]] = {"a": (40, 48, 24), "b": (64, 20, 20)}


def build_t5(name: str, seed: int = SEED) -> tuple[dict[str, Any], list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]]]:
    """Metadata and F32 tensors of T5 test model `name` (the same for the same seed)."""
    s = T5_SPECS[name]
    rng = np.random.default_rng(seed + 5)
    a, f32, vocab = "t5", GGMLType.F32, n_vocab()
    md: dict[str, Any] = {
        "general.architecture": a, "general.name": "GGUF Lens test model",
        f"{a}.block_count": U32(s.n_layers), f"{a}.decoder_block_count": U32(s.n_dec_layers),
        f"{a}.context_length": U32(N_CTX), f"{a}.embedding_length": U32(s.dim), f"{a}.feed_forward_length": U32(s.hidden),
        f"{a}.attention.head_count": U32(s.n_heads), f"{a}.attention.key_length": U32(s.head_dim),
        f"{a}.attention.value_length": U32(s.head_dim), f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.attention.relative_buckets_count": U32(s.n_buckets), **ugm_vocab(),
    }

    def mat(n_in: int, n_out: int, std: float) -> np.ndarray:  # (n_out, n_in): ggml shape (n_in, n_out)
        return rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(std)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    d, qd = s.dim, s.n_heads * s.head_dim
    emb = mat(d, vocab, s.logit_std / math.sqrt(d))
    out = mat(d, vocab, s.logit_std / math.sqrt(d))
    succ = rng.permutation(vocab)  # the head points each token's embedding at a successor (a bigram table)
    out[succ] += np.float32(s.successor) * emb / np.linalg.norm(emb, axis=1, keepdims=True)
    ts: list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]] = [
        ("token_embd.weight", f32, (d, vocab), emb), ("output.weight", f32, (d, vocab), out),
        ("enc.output_norm.weight", f32, (d,), norm(d)), ("dec.output_norm.weight", f32, (d,), norm(d))]

    def attention(prefix: str, out_scale: float) -> None:
        qk = 1 / math.sqrt(d) / math.sqrt(math.sqrt(s.head_dim))  # q.k unscaled (kq_scale 1): about unit spread
        ts.extend([(prefix + "_q.weight", f32, (d, qd), mat(d, qd, qk)), (prefix + "_k.weight", f32, (d, qd), mat(d, qd, qk)),
                   (prefix + "_v.weight", f32, (d, qd), mat(d, qd, 1 / math.sqrt(d))),
                   (prefix + "_o.weight", f32, (qd, d), mat(qd, d, out_scale / math.sqrt(qd)))])

    def ffn(b: str) -> None:
        if s.gated:
            ts.append((b + "ffn_gate.weight", f32, (d, s.hidden), mat(d, s.hidden, 1 / math.sqrt(d))))
        ts.append((b + "ffn_up.weight", f32, (d, s.hidden), mat(d, s.hidden, 1 / math.sqrt(d))))
        ts.append((b + "ffn_down.weight", f32, (s.hidden, d), mat(s.hidden, d, OUT_SCALE / math.sqrt(s.hidden))))

    for stack, n in (("enc", s.n_layers), ("dec", s.n_dec_layers)):
        for i in range(n):
            b = f"{stack}.blk.{i}."
            ts.append((b + "attn_norm.weight", f32, (d,), norm(d)))
            attention(b + "attn", OUT_SCALE)
            if i == 0:  # one bias table per stack, in block 0, shared by every block (llama.cpp's fallback)
                bias = (s.bias_std * rng.standard_normal((s.n_buckets, s.n_heads))).astype(np.float32)
                ts.append((b + "attn_rel_b.weight", f32, (s.n_heads, s.n_buckets), bias))
            if stack == "dec":
                ts.append((b + "cross_attn_norm.weight", f32, (d,), norm(d)))
                attention(b + "cross_attn", s.cross_scale)
            ts.append((b + "ffn_norm.weight", f32, (d,), norm(d)))
            ffn(b)
    return md, ts


def write_t5(path: Path, name: str, seed: int = SEED) -> Path:
    """Write T5 test model `name` (F32 weights) to `path` with the project's GGUF writer."""
    md, ts = build_t5(name, seed)
    write_gguf(path, md, ts)
    return path


def t5_file(folder: Path, name: str = "t5", quant: str = "Q8_0") -> Path:
    """Test model `name` quantized by the project to `quant` in `folder` (written once per folder)."""
    from engine.quality.requantize import quantize_file  # noqa: PLC0415

    out = folder / f"{name}.{quant}.gguf"
    if not out.exists():
        base = folder / f"{name}.F32.gguf"
        if not base.exists():
            write_t5(base, name)
        quantize_file(base, out, quant)
    return out


def case_ids(case: str, seed: int = SEED) -> tuple[list[int], list[int]]:
    """The encoder tokens and the decoder tokens (the start token first) of `case` (no specials)."""
    n_enc, n_dec, _ = CASES[case]
    rng = np.random.default_rng(seed + 7 + sorted(CASES).index(case))
    return rng.integers(3, n_vocab(), n_enc).tolist(), [dec_start()] + rng.integers(3, n_vocab(), n_dec - 1).tolist()


class LlamaT5:
    """A llama.cpp context on one T5 file (F16 KV cache, no flash attention), run through llama-cpp-python's
    low-level API: `run` is one llama_encode or llama_decode call with every position's logits asked for."""

    def __init__(self, path: Path, threads: int):
        import llama_cpp as L  # noqa: PLC0415, N812 - the development venv only

        self.L, self.path = L, path
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = N_CTX, 512, 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.start = L.llama_model_decoder_start_token(self.model)
        self.batch = L.llama_batch_init(512, 0, 1)

    def run(self, ids: list[int], start: int, encode: bool = False) -> np.ndarray:
        """llama_encode (or llama_decode) of ids at positions start..; the logits (len(ids), n_vocab) of a decode."""
        b = self.batch
        b.n_tokens = len(ids)
        for j, tok in enumerate(ids):
            b.token[j], b.pos[j], b.n_seq_id[j], b.logits[j] = tok, start + j, 1, True
            b.seq_id[j][0] = 0
        if (self.L.llama_encode if encode else self.L.llama_decode)(self.ctx, b) != 0:
            raise SystemExit(f"llama.cpp failed on {self.path.name}")
        if encode:
            return np.zeros((0, self.n_vocab), np.float32)
        return np.asarray([np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, j), (self.n_vocab,)).copy()
                           for j in range(len(ids))], np.float32)

    def tokenize(self, text: str) -> list[int]:
        """llama_tokenize(add_special=True, parse_special=False): the ids `gguf-lens generate` gives a prompt."""
        raw = text.encode()
        out = (self.L.llama_token * (len(raw) + 8))()
        n = self.L.llama_tokenize(self.vocab, raw, len(raw), out, len(out), True, False)
        assert n >= 0
        return list(out[:n])

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


def llama_cpp_t5_logits(path: Path, enc: list[int], dec: list[int], prefill: int, threads: int) -> np.ndarray:
    """llama.cpp's decoder logits at every position: llama_encode(enc), then llama_decode of dec[:prefill] in one
    batch and the rest one token per call."""
    lt = LlamaT5(path, threads)
    try:
        assert lt.start == dec[0] == dec_start()
        lt.run(enc, 0, encode=True)
        rows = [lt.run(dec[:prefill], 0)]
        rows += [lt.run([tok], prefill + j) for j, tok in enumerate(dec[prefill:])]
        return np.concatenate(rows)
    finally:
        lt.close()


def llama_cpp_greedy(path: Path, text: str, steps: int, threads: int) -> tuple[list[int], list[int]]:
    """llama.cpp's ids for `text` and its greedy decoder ids: llama_encode on them, then `steps` llama_decode calls
    of one token from the start token, each the argmax of the last logits (EOS included, not stopped at)."""
    lt = LlamaT5(path, threads)
    try:
        ids = lt.tokenize(text)
        lt.run(ids, 0, encode=True)
        out, tok = [], lt.start
        for pos in range(steps):
            tok = int(np.argmax(lt.run([tok], pos)[0]))
            out.append(tok)
        return ids, out
    finally:
        lt.close()


BUCKET_COUNTS = (8, 32, 128)  # relative_buckets_count values whose bucket table is kept (T5 files have 32)
BUCKET_RANGE = 300  # relative positions -300..300


def llama_cpp_buckets() -> dict[str, np.ndarray]:
    """llama_relative_position_bucket (llama-graph.cpp, exported by libllama) for every relative position in
    [-BUCKET_RANGE, BUCKET_RANGE], bidirectional and causal, for each of BUCKET_COUNTS."""
    import ctypes  # noqa: PLC0415

    import llama_cpp  # noqa: PLC0415

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libllama.so"))
    fn = lib._Z30llama_relative_position_bucketiimb  # int32_t (llama_pos x, llama_pos y, uint64_t, bool)
    fn.restype, fn.argtypes = ctypes.c_int32, [ctypes.c_int32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_bool]
    rel = np.arange(-BUCKET_RANGE, BUCKET_RANGE + 1)
    out = {"bucket_rel": rel.astype(np.int32)}
    for n in BUCKET_COUNTS:
        for kind, bi in (("bi", True), ("causal", False)):
            out[f"bucket_{kind}_{n}"] = np.array([fn(int(r), 0, n, bi) for r in rel], np.int32)
    return out


def make(name: str, work: Path, threads: int) -> dict[str, Any]:
    """Write, quantize and run T5 test model `name`; store its fixture. Returns the summary."""
    import llama_cpp  # noqa: PLC0415

    base = write_t5(work / f"{name}.F32.gguf", name)
    out: dict[str, np.ndarray] = llama_cpp_buckets()
    summary: dict[str, Any] = {"name": name, "arch": "t5", "seed": SEED, "top_k": TOP_K, "n_ctx": N_CTX,
                               "cases": {c: list(v) for c, v in CASES.items()},
                               "llama_cpp_python": llama_cpp.__version__, "prompt": PROMPT, "quants": {}}
    for quant, ftype in QUANTS.items():
        path = work / f"{name}.{quant}.gguf"
        quantize_llama_cpp(base, path, ftype)
        top1 = []
        for case, (_, _, prefill) in CASES.items():
            enc, dec = case_ids(case)
            out[f"{case}_enc_ids"], out[f"{case}_dec_ids"] = np.asarray(enc, np.int32), np.asarray(dec, np.int32)
            logp = log_softmax(llama_cpp_t5_logits(path, enc, dec, prefill, threads))
            top = np.argsort(-logp, axis=-1, kind="stable")[:, :TOP_K]
            out[f"{quant}_{case}_top_ids"] = top.astype(np.int16)
            out[f"{quant}_{case}_top_logp"] = np.take_along_axis(logp, top, axis=-1).astype(np.float32)
            top1.append(float(np.exp(logp.max(-1)).mean()))
        prompt_ids, greedy = llama_cpp_greedy(path, PROMPT, GREEDY_STEPS, threads)
        assert summary.setdefault("prompt_ids", prompt_ids) == prompt_ids  # the tokenizer: the same for each file
        summary["quants"][quant] = {"sha256": sha256_file(path), "bytes": path.stat().st_size,
                                    "mean_top1_prob": float(np.mean(top1)), "greedy_ids": greedy}
    np.savez_compressed(FIXTURES / f"{name}.npz", **out)
    (FIXTURES / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=list(T5_SPECS))
    ap.add_argument("--work", type=Path, default=Path("/tmp/arch_models"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    for name in args.names:
        print(name, json.dumps(make(name, args.work, args.threads)["quants"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
