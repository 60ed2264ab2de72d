"""Tiny GGUF models built in code: a byte-level BPE vocabulary and random weights, for fast engine tests."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engine.gguf import write_gguf
from engine.quant.types import GGMLType


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (the byte-level BPE alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "Ġ s", "e r", "o n", "a n", "Ġ w"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def tiny_vocab() -> tuple[list[str], np.ndarray, list[str]]:
    """(tokens, token_type, merges): specials first, then the 256 byte tokens, then merge results."""
    b2u = byte_to_unicode()
    tokens = list(SPECIALS) + [b2u[b] for b in range(256)] + [m.replace(" ", "") for m in MERGES]
    types = np.array([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)), dtype=np.int32)
    return tokens, types, list(MERGES)


def _as_type(w: np.ndarray, qtype: GGMLType) -> np.ndarray:
    if qtype == GGMLType.F32:
        return w.astype(np.float32)
    if qtype == GGMLType.F16:
        return w.astype(np.float16)
    from engine.quant import quantize  # noqa: PLC0415 - quantizers arrive with the quantization lab

    return quantize(w.reshape(w.shape[0], -1).astype(np.float32), qtype)


def make_tiny_llama(
    path: Path,
    *,
    n_layers: int = 2,
    dim: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    hidden: int = 128,
    n_ctx: int = 256,
    qtype: GGMLType = GGMLType.F32,
    seed: int = 0,
    tied: bool = True,
    overrides: dict[str, Any] | None = None,
    drop_tensors: tuple[str, ...] = (),
    chat_template: str | None = None,
) -> Path:
    """Write a random llama-architecture model with a real (tiny) byte-level BPE tokenizer."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = tiny_vocab()
    n_vocab = len(tokens)
    head_dim = dim // n_heads
    md: dict[str, Any] = {
        "general.architecture": "llama",
        "general.name": "tiny-llama",
        "llama.block_count": n_layers,
        "llama.context_length": n_ctx,
        "llama.embedding_length": dim,
        "llama.feed_forward_length": hidden,
        "llama.attention.head_count": n_heads,
        "llama.attention.head_count_kv": n_kv_heads,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": head_dim,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
    }
    if chat_template is not None:
        md["tokenizer.chat_template"] = chat_template
    md.update(overrides or {})

    def mat(n_in: int, n_out: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    ts: list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]] = []
    ts.append(("token_embd.weight", qtype, (dim, n_vocab), _as_type(rng.standard_normal((n_vocab, dim)).astype(np.float32), qtype)))
    for i in range(n_layers):
        ts.append((f"blk.{i}.attn_norm.weight", GGMLType.F32, (dim,), (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32)))
        for name, n_in, n_out in (("attn_q", dim, dim), ("attn_k", dim, n_kv_heads * head_dim),
                                  ("attn_v", dim, n_kv_heads * head_dim), ("attn_output", dim, dim),
                                  ("ffn_gate", dim, hidden), ("ffn_up", dim, hidden), ("ffn_down", hidden, dim)):
            ts.append((f"blk.{i}.{name}.weight", qtype, (n_in, n_out), _as_type(mat(n_in, n_out), qtype)))
        ts.append((f"blk.{i}.ffn_norm.weight", GGMLType.F32, (dim,), (1 + 0.1 * rng.standard_normal(dim)).astype(np.float32)))
    ts.append(("output_norm.weight", GGMLType.F32, (dim,), np.ones(dim, np.float32)))
    if not tied:
        ts.append(("output.weight", qtype, (dim, n_vocab), _as_type(mat(dim, n_vocab), qtype)))
    ts = [t for t in ts if t[0] not in drop_tensors]
    write_gguf(path, md, ts)
    return path


def make_tiny_gemma3(
    path: Path,
    *,
    n_layers: int = 6,
    dim: int = 32,
    n_heads: int = 2,
    n_kv_heads: int = 1,
    head_dim: int = 16,
    hidden: int = 64,
    n_ctx: int = 1024,
    window: int = 16,
    seed: int = 0,
) -> Path:
    """Write a random gemma3-architecture model (local and global layers) with the tiny BPE vocabulary."""
    rng = np.random.default_rng(seed)
    tokens, types, merges = tiny_vocab()
    n_vocab = len(tokens)
    md: dict[str, Any] = {
        "general.architecture": "gemma3",
        "general.name": "tiny-gemma3",
        "gemma3.block_count": n_layers,
        "gemma3.context_length": n_ctx,
        "gemma3.embedding_length": dim,
        "gemma3.feed_forward_length": hidden,
        "gemma3.attention.head_count": n_heads,
        "gemma3.attention.head_count_kv": n_kv_heads,
        "gemma3.attention.key_length": head_dim,
        "gemma3.attention.value_length": head_dim,
        "gemma3.rope.freq_base": 1_000_000.0,
        "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
        "gemma3.attention.sliding_window": window,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
    }

    def mat(n_in: int, n_out: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    f32 = GGMLType.F32
    ts: list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]] = [
        ("token_embd.weight", f32, (dim, n_vocab), (0.2 * rng.standard_normal((n_vocab, dim))).astype(np.float32)),
        ("output_norm.weight", f32, (dim,), norm(dim)),
    ]
    qd, kvd = n_heads * head_dim, n_kv_heads * head_dim
    for i in range(n_layers):
        b = f"blk.{i}."
        ts += [
            (b + "attn_norm.weight", f32, (dim,), norm(dim)),
            (b + "attn_q.weight", f32, (dim, qd), mat(dim, qd)),
            (b + "attn_k.weight", f32, (dim, kvd), mat(dim, kvd)),
            (b + "attn_v.weight", f32, (dim, kvd), mat(dim, kvd)),
            (b + "attn_q_norm.weight", f32, (head_dim,), norm(head_dim)),
            (b + "attn_k_norm.weight", f32, (head_dim,), norm(head_dim)),
            (b + "attn_output.weight", f32, (qd, dim), mat(qd, dim)),
            (b + "post_attention_norm.weight", f32, (dim,), norm(dim)),
            (b + "ffn_norm.weight", f32, (dim,), norm(dim)),
            (b + "ffn_gate.weight", f32, (dim, hidden), mat(dim, hidden)),
            (b + "ffn_up.weight", f32, (dim, hidden), mat(dim, hidden)),
            (b + "ffn_down.weight", f32, (hidden, dim), mat(hidden, dim)),
            (b + "post_ffw_norm.weight", f32, (dim,), norm(dim)),
        ]
    write_gguf(path, md, ts)
    return path
