"""Write a GGUF with a catalog model's exact shapes and tensor types and random weights (for the GPU bench).

The catalog models are too big to carry to a device machine; this writes a stand-in there with the
project's own writer and quantizers (engine.gguf.write_gguf, engine.quant.quantize): same architecture,
dimensions, vocabulary size and per-tensor types as the real file, random weights, a byte-level BPE
vocabulary padded to the real size. Tests build shrunken variants with the same type mixture.

Usage: python benchmarks/synthetic_model.py NAME OUT.gguf      (NAME: smollm2-135m-instruct | gemma3-270m)
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from engine.gguf import write_gguf  # noqa: E402
from engine.quant import quantize  # noqa: E402
from engine.quant.types import GGMLType  # noqa: E402

T = GGMLType
# llama.cpp's Q4_K_M gives these Gemma 3 layers more bits (attn_v Q8_0, ffn_down Q6_K), as in the real file
GEMMA_MORE_BITS = frozenset({0, 1, 4, 7, 10, 13, 15, 16, 17})


@dataclass(frozen=True)
class Spec:
    """A model's shapes and the type of each tensor kind (`types[kind]`, or `more_bits[kind]` on those layers)."""

    arch: str
    dim: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_vocab: int
    n_ctx: int
    rope_base: float
    eps: float
    types: dict[str, GGMLType]
    more_bits: dict[str, GGMLType] = field(default_factory=dict)
    more_bits_layers: frozenset[int] = frozenset()
    window: int | None = None

    def tensor_type(self, kind: str, layer: int | None = None) -> GGMLType:
        if layer is not None and layer in self.more_bits_layers and kind in self.more_bits:
            return self.more_bits[kind]
        return self.types[kind]


SPECS: dict[str, Spec] = {
    "smollm2-135m-instruct": Spec(
        "llama", dim=576, hidden=1536, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, n_vocab=49152,
        n_ctx=8192, rope_base=100000.0, eps=1e-5,
        types={"token_embd": T.Q8_0, **{k: T.Q4_1 for k in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                             "ffn_gate", "ffn_up", "ffn_down")}},
    ),
    "gemma3-270m": Spec(
        "gemma3", dim=640, hidden=2048, n_layers=18, n_heads=4, n_kv_heads=1, head_dim=256, n_vocab=262144,
        n_ctx=32768, rope_base=1_000_000.0, eps=1e-6, window=512,
        types={"token_embd": T.Q8_0, "attn_q": T.Q5_0, "attn_k": T.Q5_0, "attn_v": T.Q5_0, "attn_output": T.Q4_K,
               "ffn_gate": T.Q5_0, "ffn_up": T.Q5_0, "ffn_down": T.Q4_K},
        more_bits={"attn_v": T.Q8_0, "ffn_down": T.Q6_K}, more_bits_layers=GEMMA_MORE_BITS,
    ),
}


def spec(name: str, **changes: Any) -> Spec:
    """The catalog model's spec, with fields changed (tests shrink the dimensions, keeping the types)."""
    return replace(SPECS[name], **changes)


def _byte_to_unicode() -> dict[int, str]:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, n = {}, 0
    for b in range(256):
        out[b] = chr(b) if b in keep else chr(256 + n)
        n += b not in keep
    return out


def _vocab(n_vocab: int) -> tuple[list[str], np.ndarray]:
    """Specials, the 256 byte tokens, then filler tokens up to n_vocab."""
    b2u = _byte_to_unicode()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + [b2u[b] for b in range(256)]
    tokens += [f"<filler_{i}>" for i in range(n_vocab - len(tokens))]
    types = np.array([3] * len(specials) + [1] * (n_vocab - len(specials)), dtype=np.int32)
    return tokens, types


def _matrix(rng: np.random.Generator, n_in: int, n_out: int, qtype: GGMLType, chunk: int = 8192) -> np.ndarray:
    """Random (n_out, n_in) weights with std 1/sqrt(n_in), quantized a chunk of rows at a time."""
    parts = []
    for r in range(0, n_out, chunk):
        w = rng.standard_normal((min(chunk, n_out - r), n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))
        parts.append(quantize(w, qtype) if qtype != T.F32 else w)
    return np.concatenate(parts)


def write_synthetic(path: Path, s: Spec, seed: int = 0) -> Path:
    """Write the model of spec `s` with random weights to `path`."""
    rng = np.random.default_rng(seed)
    a = s.arch
    tokens, types = _vocab(s.n_vocab)
    md: dict[str, Any] = {
        "general.architecture": a, "general.name": f"synthetic {a}",
        f"{a}.block_count": s.n_layers, f"{a}.context_length": s.n_ctx, f"{a}.embedding_length": s.dim,
        f"{a}.feed_forward_length": s.hidden, f"{a}.attention.head_count": s.n_heads,
        f"{a}.attention.head_count_kv": s.n_kv_heads, f"{a}.attention.key_length": s.head_dim,
        f"{a}.attention.value_length": s.head_dim, f"{a}.rope.freq_base": s.rope_base,
        f"{a}.attention.layer_norm_rms_epsilon": s.eps,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": ["Ġ t"], "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False,
    }
    if s.window:
        md[f"{a}.attention.sliding_window"] = s.window

    def norm(n: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    emb_type = s.tensor_type("token_embd")
    emb = _matrix(rng, s.dim, s.n_vocab, emb_type) if emb_type != T.F32 else rng.standard_normal((s.n_vocab, s.dim), dtype=np.float32)
    ts: list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]] = [
        ("token_embd.weight", emb_type, (s.dim, s.n_vocab), emb),
        ("output_norm.weight", T.F32, (s.dim,), norm(s.dim)),
    ]
    qd, kvd = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim
    for i in range(s.n_layers):
        b = f"blk.{i}."
        ts.append((b + "attn_norm.weight", T.F32, (s.dim,), norm(s.dim)))
        for kind, n_in, n_out in (("attn_q", s.dim, qd), ("attn_k", s.dim, kvd), ("attn_v", s.dim, kvd),
                                  ("attn_output", qd, s.dim), ("ffn_gate", s.dim, s.hidden),
                                  ("ffn_up", s.dim, s.hidden), ("ffn_down", s.hidden, s.dim)):
            qt = s.tensor_type(kind, i)
            ts.append((f"{b}{kind}.weight", qt, (n_in, n_out), _matrix(rng, n_in, n_out, qt)))
        ts.append((b + "ffn_norm.weight", T.F32, (s.dim,), norm(s.dim)))
        if a == "gemma3":
            ts += [(b + "attn_q_norm.weight", T.F32, (s.head_dim,), norm(s.head_dim)),
                   (b + "attn_k_norm.weight", T.F32, (s.head_dim,), norm(s.head_dim)),
                   (b + "post_attention_norm.weight", T.F32, (s.dim,), norm(s.dim)),
                   (b + "post_ffw_norm.weight", T.F32, (s.dim,), norm(s.dim))]
    write_gguf(path, md, ts)
    return path


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in SPECS:
        sys.stderr.write(f"usage: synthetic_model.py ({' | '.join(SPECS)}) OUT.gguf\n")
        return 2
    write_synthetic(Path(argv[1]), SPECS[argv[0]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
