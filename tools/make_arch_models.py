"""Small random-weight GGUF files with each architecture's exact tensor layout, and llama.cpp's logits on them.

No real Qwen, Phi-3, Gemma 2 or Llama 3 file can be fetched here, so each architecture is written as a tiny
model (2 layers, 256 wide, a 1,024-token vocabulary) from a fixed seed with the project's GGUF writer
(`write_arch`, which the test suite calls too), then, with llama-cpp-python (a development tool, see README.md
"Golden fixtures"):

    /tmp/llvenv/bin/python tools/make_arch_models.py [--work DIR] [NAME ...]

quantizes copies with llama.cpp's own llama_model_quantize (F16, Q8_0, Q4_K_M, IQ4_XS; MXFP4_MOE for the
Mixture-of-Experts models), runs llama.cpp (F16 KV cache; a
128-token prompt, then one token per step) on N_TOKENS fixed token ids, and stores per quantization the top-K log-probabilities at every
position in tests/fixtures/arch/NAME.npz, with each quantized file's sha256 and the mean top-1 probability in
tests/fixtures/arch/NAME.json. The suite rebuilds the files itself (our writer, then `gguf-lens quantize`'s
code, byte-identical to llama-quantize: the sha256 says so), so only the logits are committed.

The weights are shaped so the next-token distributions are peaked with a clear winner (mean top-1 probability
0.4-0.55, each file's is in its JSON), as a trained model's are: the block outputs are scaled down (OUT_SCALE) so
the token embedding stays visible in the residual stream, and an untied head points each token's embedding at a
random successor (a bigram table), so what attention mixes in decides the top token by a margin. Near-uniform
or near-tied distributions would turn the 8-bit activation rounding llama.cpp does and the float32 numerics do not
into top-token flips that say nothing about the architecture.

The encoder-decoder entries `t5` and `t5_relu` are built and run by tools/make_t5_model.py (llama_encode, then the
decoder's logits); naming them here runs that. The DeltaNet hybrids' blocks are tools/make_hybrid_models.py's, the
Gemma 4 entries' (`gemma4`, `gemma4_moe`: F16, Q8_0, Q4_K_M, and MXFP4_MOE) tools/make_gemma4_models.py's; both are
also run as one prompt in batches of SPLIT (Q8_0).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from engine.gguf import write_gguf  # noqa: E402
from tools.make_gemma4_models import GEMMA4, build_gemma4  # noqa: E402
from tools.make_gemma4_models import QUANTS as GEMMA4_QUANTS  # noqa: E402
from tools.make_hybrid_models import HYBRIDS, build_hybrid  # noqa: E402
from engine.quant.types import GGMLType  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "arch"
SEED = 1234
OUT_SCALE = 0.3  # attn_output and ffn_down weights times this: the embedding stays visible in the residual

N_TOKENS = 200
N_CTX = 1024  # the context both engines run with (Phi-3 picks its long factors above 128, see phi3 below)
TOP_K = 64
PREFILL = 128  # the first PREFILL tokens run as one batch, the rest one at a time (a prompt, then decode steps)
SPLIT = 48  # hybrids: also every token as one prompt in batches of SPLIT (a recurrent state carried across batches)
QUANTS = {"F16": 1, "Q8_0": 7, "Q4_K_M": 15, "IQ4_XS": 30}  # llama_ftype ids (enum llama_ftype in llama.h)
MOE_QUANTS = {"MXFP4_MOE": 38}  # and for the Mixture-of-Experts models: the experts in MXFP4, the rest Q8_0
VOCAB = 1024
U32 = np.uint32


@dataclass(frozen=True)
class ArchSpec:
    """One test model: the GGUF architecture, its shapes and what makes it that architecture."""

    arch: str
    n_heads: int = 4
    n_kv_heads: int = 1
    head_dim: int = 64
    dim: int = 256
    hidden: int = 512
    n_layers: int = 2
    rope_base: float = 10000.0
    rope_dim: int | None = None  # rope.dimension_count when it is not the head size (Phi-3's partial RoPE)
    tied: bool = True
    logit_std: float = 3.5  # the spread of the logits, for peaked distributions
    successor: float = 1.2  # untied: each token's embedding also points the head at one successor token
    metadata: dict[str, Any] = field(default_factory=dict)
    extras: tuple[str, ...] = ()  # rope_freqs, biases, qk_norm, post_norms, fused, phi_factors, moe, shexp
    n_expert: int = 0  # moe: experts per layer, the number each token uses, one expert's width (0: the metadata
    n_used: int = 0  # leaves expert_feed_forward_length out, so the architecture's default applies)
    expert_hidden: int = 0
    router_std: float = 1.2  # moe: the router's logits spread (peaked routing with clear but not total winners)
    expert_std: float = 1.0  # moe: the experts' gate/up weights times this (gpt-oss: past the clamp at 7 now and then)


SPECS: dict[str, ArchSpec] = {
    # Llama 3.x: rope_freqs.weight, a large freq_base, GQA 4:1, a separate output matrix
    "llama3": ArchSpec("llama", rope_base=500000.0, tied=False, extras=("rope_freqs",)),
    "llama3_nofreqs": ArchSpec("llama", rope_base=500000.0, tied=False),  # the same file without rope_freqs
    "llama_linear": ArchSpec("llama", n_kv_heads=2, logit_std=1.6, metadata={"rope.scaling.type": "linear", "rope.scaling.factor": 4.0}),
    "llama_yarn": ArchSpec("llama", n_kv_heads=2, logit_std=1.6, metadata={
        "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": U32(64)}),
    "qwen2": ArchSpec("qwen2", n_kv_heads=2, rope_base=1_000_000.0, logit_std=1.8, extras=("biases",)),
    "qwen3": ArchSpec("qwen3", n_kv_heads=2, head_dim=128, rope_base=1_000_000.0, tied=False, extras=("qk_norm",)),
    "gemma2": ArchSpec("gemma2", n_kv_heads=2, head_dim=128, extras=("post_norms",), logit_std=1.0, metadata={
        "attention.sliding_window": U32(32), "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}),
    # Mixture-of-Experts: the expert width left to the default (n_ff / used) in qwen3moe, given in qwen2moe
    "qwen3moe": ArchSpec("qwen3moe", n_kv_heads=2, head_dim=128, rope_base=1_000_000.0, tied=False, hidden=512,
                         extras=("qk_norm", "moe"), n_expert=8, n_used=2),
    "qwen2moe": ArchSpec("qwen2moe", n_kv_heads=2, rope_base=1_000_000.0, hidden=256, tied=False,
                         extras=("biases", "moe", "shexp"), n_expert=6, n_used=3, expert_hidden=256),
    "mixtral": ArchSpec("llama", n_kv_heads=2, tied=False, hidden=256, extras=("moe",), n_expert=4, n_used=2),
    # gpt-oss: sinks, biases on q/k/v/o, router and experts, the clamped SwiGLU, a window on layer 0, YaRN
    "gpt_oss": ArchSpec("gpt-oss", n_heads=8, n_kv_heads=2, head_dim=64, rope_base=150000.0, tied=False, hidden=256,
                        extras=("biases", "moe", "oai"), n_expert=8, n_used=4, expert_hidden=256, expert_std=2.5,
                        logit_std=3.5, successor=2.6, router_std=4.0, metadata={
                            "attention.sliding_window": U32(32), "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                            "rope.scaling.original_context_length": U32(64)}),
    "phi3": ArchSpec("phi3", n_kv_heads=4, rope_dim=32, tied=False, extras=("fused", "phi_factors"), metadata={
        "rope.scaling.original_context_length": U32(128), "rope.scaling.attn_factor": 1.1902380714238083}),
}


def llama3_factors(rope_dim: int, base: float, factor: float = 8.0, low: float = 1.0, high: float = 4.0,
                   old_ctx: int = 256) -> np.ndarray:
    """Llama 3.1's rope_freqs as convert_hf_to_gguf.py computes them (old_ctx shrunk to the test's length)."""
    freqs = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, np.float32)


def _vocab(n_vocab: int) -> tuple[list[str], np.ndarray]:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    b2u, n = {}, 0
    for b in range(256):
        b2u[b] = chr(b) if b in keep else chr(256 + n)
        n += b not in keep
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + [b2u[b] for b in range(256)] + [f"<filler_{i}>" for i in range(n_vocab - 259)]
    return tokens, np.array([3] * 3 + [1] * (n_vocab - 3), np.int32)


def build(name: str, seed: int = SEED) -> tuple[dict[str, Any], list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]]]:
    """Metadata and F32 tensors of test model `name` (the same for the same seed)."""
    if name in HYBRIDS:  # the DeltaNet hybrids: the vocabulary and head as below (no blocks), then their blocks
        h = HYBRIDS[name]
        md, ts = build_spec(ArchSpec(h.arch, dim=h.dim, n_layers=0, tied=False), seed)
        return build_hybrid(name, np.random.default_rng(seed + 7), md, ts, OUT_SCALE)
    if name in GEMMA4:  # Gemma 4 (tools/make_gemma4_models.py): the vocabulary, tied head and norm as below, its blocks
        g = GEMMA4[name]
        md, ts = build_spec(ArchSpec(g.arch, dim=g.dim, n_layers=0, logit_std=g.logit_std), seed)
        return build_gemma4(name, np.random.default_rng(seed + 11), md, ts, OUT_SCALE)
    return build_spec(SPECS[name], seed)


def build_spec(s: ArchSpec, seed: int) -> tuple[dict[str, Any], list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]]]:
    """Metadata and F32 tensors of the model `s` describes."""
    rng = np.random.default_rng(seed)
    a, f32 = s.arch, GGMLType.F32
    tokens, types = _vocab(VOCAB)
    md: dict[str, Any] = {
        "general.architecture": a, "general.name": "GGUF Lens test model",  # no arch name: llama-vocab.cpp keys token attributes on it
        f"{a}.block_count": U32(s.n_layers), f"{a}.context_length": U32(4096), f"{a}.embedding_length": U32(s.dim),
        f"{a}.feed_forward_length": U32(s.hidden), f"{a}.attention.head_count": U32(s.n_heads),
        f"{a}.attention.head_count_kv": U32(s.n_kv_heads), f"{a}.rope.freq_base": s.rope_base,
        f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["Ġ t"], "tokenizer.ggml.bos_token_id": U32(0),
        "tokenizer.ggml.eos_token_id": U32(2), "tokenizer.ggml.add_bos_token": False,
    }
    if s.head_dim != s.dim // s.n_heads:
        md[f"{a}.attention.key_length"] = md[f"{a}.attention.value_length"] = U32(s.head_dim)
    rope_dim = s.rope_dim or s.head_dim
    md[f"{a}.rope.dimension_count"] = U32(rope_dim)
    md.update({f"{a}.{k}": v for k, v in s.metadata.items()})
    if "moe" in s.extras:
        md[f"{a}.expert_count"], md[f"{a}.expert_used_count"] = U32(s.n_expert), U32(s.n_used)
        if s.expert_hidden:
            md[f"{a}.expert_feed_forward_length"] = U32(s.expert_hidden)
        if "shexp" in s.extras:
            md[f"{a}.expert_shared_feed_forward_length"] = U32(s.hidden)

    def mat(n_in: int, n_out: int, std: float | None = None) -> np.ndarray:  # (n_out, n_in): ggml shape (n_in, n_out)
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(std or 1 / math.sqrt(n_in)))

    def norm(n: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    emb_std = s.logit_std / math.sqrt(s.dim)  # tied: the head reads the same rows
    emb = mat(s.dim, VOCAB, emb_std)
    ts: list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]] = [
        ("token_embd.weight", f32, (s.dim, VOCAB), emb),
        ("output_norm.weight", f32, (s.dim,), norm(s.dim)),
    ]
    if not s.tied:
        # a clear winner, as trained models have: the head row of a successor token follows the embedding of
        # each token (a random bigram table), so what attention mixes in decides the top token by a margin
        out = mat(s.dim, VOCAB, s.logit_std / math.sqrt(s.dim))
        succ = rng.permutation(VOCAB)
        out[succ] += np.float32(s.successor / math.sqrt(s.dim)) * emb / np.linalg.norm(emb, axis=1, keepdims=True) * np.float32(math.sqrt(s.dim))
        ts.append(("output.weight", f32, (s.dim, VOCAB), out))
    if "rope_freqs" in s.extras:
        ts.append(("rope_freqs.weight", f32, (rope_dim // 2,), llama3_factors(rope_dim, s.rope_base)))
    if "phi_factors" in s.extras:
        half = rope_dim // 2
        ts.append(("rope_factors_long.weight", f32, (half,), np.linspace(1.0, 6.0, half, dtype=np.float32)))
        ts.append(("rope_factors_short.weight", f32, (half,), np.linspace(1.0, 1.5, half, dtype=np.float32)))
    qd, kvd = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    for i in range(s.n_layers):
        b = f"blk.{i}."
        ts.append((b + "attn_norm.weight", f32, (s.dim,), norm(s.dim)))
        if "fused" in s.extras:
            ts.append((b + "attn_qkv.weight", f32, (s.dim, qd + 2 * kvd), mat(s.dim, qd + 2 * kvd)))
        else:
            for kind, n_out in (("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)):
                ts.append((f"{b}{kind}.weight", f32, (s.dim, n_out), mat(s.dim, n_out)))
        if "biases" in s.extras:
            for kind, n_out in (("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)):
                ts.append((f"{b}{kind}.bias", f32, (n_out,), (0.5 * rng.standard_normal(n_out)).astype(np.float32)))
        if "qk_norm" in s.extras:
            ts.append((b + "attn_q_norm.weight", f32, (s.head_dim,), norm(s.head_dim)))
            ts.append((b + "attn_k_norm.weight", f32, (s.head_dim,), norm(s.head_dim)))
        ts.append((b + "attn_output.weight", f32, (qd, s.dim), mat(qd, s.dim, OUT_SCALE / math.sqrt(qd))))
        if "oai" in s.extras:  # gpt-oss: one sink logit per head (a large share of each row), the output's bias
            ts.append((b + "attn_sinks.weight", f32, (s.n_heads,), (1.0 + 1.5 * rng.standard_normal(s.n_heads)).astype(np.float32)))
            ts.append((b + "attn_output.bias", f32, (s.dim,), (0.1 * rng.standard_normal(s.dim)).astype(np.float32)))
        if "post_norms" in s.extras:
            ts.append((b + "post_attention_norm.weight", f32, (s.dim,), norm(s.dim)))
            ts.append((b + "post_ffw_norm.weight", f32, (s.dim,), norm(s.dim)))
        ts.append((b + ("post_attention_norm" if "oai" in s.extras else "ffn_norm") + ".weight", f32, (s.dim,), norm(s.dim)))
        if "moe" in s.extras:
            ts += experts(b, s)
        elif "fused" in s.extras:
            ts.append((b + "ffn_up.weight", f32, (s.dim, 2 * s.hidden), mat(s.dim, 2 * s.hidden)))
        else:
            ts.append((b + "ffn_gate.weight", f32, (s.dim, s.hidden), mat(s.dim, s.hidden)))
            ts.append((b + "ffn_up.weight", f32, (s.dim, s.hidden), mat(s.dim, s.hidden)))
        if "moe" not in s.extras:
            ts.append((b + "ffn_down.weight", f32, (s.hidden, s.dim), mat(s.hidden, s.dim, OUT_SCALE / math.sqrt(s.hidden))))
    return md, ts


def experts(b: str, s: ArchSpec) -> list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]]:
    """Block b's Mixture-of-Experts tensors: the router, each expert's gate/up/down stacked on a third axis and,
    with shexp, Qwen2-MoE's shared expert and its gate. Each expert's down matrix has its own scale (0.5x to 2x) so
    that which experts a token takes, and with what weight, moves the output (a renormalisation left out, or an
    expert swapped, changes the logits by far more than rounding does)."""
    rng = np.random.default_rng(zlib.crc32(b.encode()) + s.n_expert)  # per block, independent of the rest
    f32, n, d = GGMLType.F32, s.n_expert, s.dim
    width = s.hidden if s.arch == "llama" else s.expert_hidden or s.hidden // s.n_used  # llama: n_ff wide
    gen = lambda *shape, std: (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))  # noqa: E731
    scale = np.geomspace(0.5, 2.0, n).astype(np.float32)[:, None, None]
    wide = s.expert_std / math.sqrt(d)
    ts = [(b + "ffn_gate_inp.weight", f32, (d, n), gen(n, d, std=s.router_std / math.sqrt(d))),
          (b + "ffn_gate_exps.weight", f32, (d, width, n), gen(n, width, d, std=wide)),
          (b + "ffn_up_exps.weight", f32, (d, width, n), gen(n, width, d, std=wide)),
          (b + "ffn_down_exps.weight", f32, (width, d, n),
           gen(n, d, width, std=OUT_SCALE / math.sqrt(width) / s.expert_std) * scale)]
    if "oai" in s.extras:  # gpt-oss: the router's bias and each expert's biases (ggml shapes width x n, dim x n)
        ts += [(b + "ffn_gate_inp.bias", f32, (n,), gen(n, std=0.5)),
               (b + "ffn_gate_exps.bias", f32, (width, n), gen(n, width, std=1.0)),
               (b + "ffn_up_exps.bias", f32, (width, n), gen(n, width, std=1.0)),
               (b + "ffn_down_exps.bias", f32, (d, n), gen(n, d, std=0.05))]
    if "shexp" in s.extras:
        h = s.hidden
        ts += [(b + "ffn_gate_inp_shexp.weight", f32, (d,), gen(d, std=2 / math.sqrt(d))),
               (b + "ffn_gate_shexp.weight", f32, (d, h), gen(h, d, std=1 / math.sqrt(d))),
               (b + "ffn_up_shexp.weight", f32, (d, h), gen(h, d, std=1 / math.sqrt(d))),
               (b + "ffn_down_shexp.weight", f32, (h, d), gen(d, h, std=OUT_SCALE / math.sqrt(h)))]
    return ts


def write_arch(path: Path, name: str, seed: int = SEED) -> Path:
    """Write test model `name` (F32 weights) to `path` with the project's GGUF writer."""
    md, ts = build(name, seed)
    write_gguf(path, md, ts)
    return path


def token_ids(seed: int = SEED) -> list[int]:
    """The N_TOKENS ids every model runs (no specials)."""
    return np.random.default_rng(seed + 1).integers(3, VOCAB, N_TOKENS).tolist()


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))


def llama_cpp_logits(path: Path, ids: list[int], threads: int, *, n_ctx: int = N_CTX, n_batch: int = 512,
                     prefill: int = PREFILL, setup: Any = None) -> np.ndarray:
    """llama.cpp's logits at every position: F16 KV cache, no flash attention; the first `prefill` tokens in one
    batch, then one token per step, so both the batch and the one-row kernels are in the fixture. `setup(llm)` is
    called on the loaded model first (a control vector, LoRA adapters)."""
    from llama_cpp import Llama  # noqa: PLC0415 - the development venv only

    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, logits_all=True,
                n_threads=threads, verbose=False, flash_attn=False)
    if setup is not None:
        setup(llm)
    llm.reset()
    llm.eval(ids[:prefill])
    for tok in ids[prefill:]:
        llm.eval([tok])
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    del llm
    return out


def quantize_llama_cpp(src: Path, dst: Path, ftype: int) -> None:
    import ctypes  # noqa: PLC0415

    import llama_cpp  # noqa: PLC0415

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = 2
    params.ftype = ftype
    params.allow_requantize = True
    if llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) != 0:
        raise SystemExit(f"llama_model_quantize failed for {src.name} ftype {ftype}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", default=[*SPECS, *HYBRIDS, *GEMMA4, "t5", "t5_relu"])
    ap.add_argument("--work", type=Path, default=Path("/tmp/arch_models"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    FIXTURES.mkdir(parents=True, exist_ok=True)
    import llama_cpp  # noqa: PLC0415

    ids = token_ids()
    for name in args.names:
        if name in ("t5", "t5_relu"):  # encoder-decoder: its own builder and llama.cpp run (tools/make_t5_model.py)
            from tools.make_t5_model import make  # noqa: PLC0415

            print(name, json.dumps(make(name, args.work, args.threads)["quants"]))
            continue
        base = write_arch(args.work / f"{name}.F32.gguf", name)
        out: dict[str, np.ndarray] = {"ids": np.asarray(ids, np.int32)}
        spec = HYBRIDS.get(name) or GEMMA4.get(name) or SPECS[name]
        arch, moe = spec.arch, spec.n_expert
        summary: dict[str, Any] = {"name": name, "arch": arch, "seed": SEED, "top_k": TOP_K,
                                   "n_ctx": N_CTX, "llama_cpp_python": llama_cpp.__version__, "quants": {}}
        quants = {**(GEMMA4_QUANTS if name in GEMMA4 else QUANTS), **(MOE_QUANTS if moe else {})}
        for quant, ftype in quants.items():
            path = args.work / f"{name}.{quant}.gguf"
            quantize_llama_cpp(base, path, ftype)
            logp = log_softmax(llama_cpp_logits(path, ids, args.threads))
            top = np.argsort(-logp, axis=-1, kind="stable")[:, :TOP_K]
            out[f"{quant}_top_ids"] = top.astype(np.int16)
            out[f"{quant}_top_logp"] = np.take_along_axis(logp, top, axis=-1).astype(np.float32)
            summary["quants"][quant] = {"sha256": sha256_file(path), "bytes": path.stat().st_size,
                                        "mean_top1_prob": float(np.exp(logp.max(-1)).mean())}
            if (name in HYBRIDS or name in GEMMA4) and quant == "Q8_0":  # all tokens as a prompt in batches of SPLIT
                logp = log_softmax(llama_cpp_logits(path, ids, args.threads, n_batch=SPLIT, prefill=len(ids)))
                top = np.argsort(-logp, axis=-1, kind="stable")[:, :TOP_K]
                out[f"{quant}_split_top_ids"] = top.astype(np.int16)
                out[f"{quant}_split_top_logp"] = np.take_along_axis(logp, top, axis=-1).astype(np.float32)
        np.savez_compressed(FIXTURES / f"{name}.npz", **out)
        (FIXTURES / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(name, json.dumps(summary["quants"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
