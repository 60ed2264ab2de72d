"""Write a Qwen3-30B-A3B-shaped Mixture-of-Experts model (a few layers) in Q4_K_M with random weights.

Qwen3-30B-A3B's widths: dim 2048, 32 query / 4 KV heads of 128, 128 experts of width 768, 8 used per token,
q/k RMSNorm, an untied head; 4 of its 48 layers by default and a 49,152-token vocabulary (about 2.5B parameters,
1.4 GiB), so llama.cpp and GGUF Lens can be measured on it side by side (`benchmarks/vs_llamacpp.py --moe`).
Every tensor gets llama-quantize's Q4_K_M type for a 128-expert qwen3moe (engine.quant.presets.choose_types);
the router and norms stay F32. Weights are normal * 0.02 (the router's * 0.2, so routing is not uniform), made
and quantized a chunk of rows at a time (benchmarks/synthetic_1b.py's helpers: ggml's C quantizer when
llama-cpp-python's libggml-base is found, else engine.quant.quantize; the same bytes either way).

    .venv/bin/python benchmarks/synthetic_moe.py [OUT.gguf] [--layers N] [--threads N]

Without OUT it writes (or reuses) /tmp/gguf-lens-bench/qwen3moe-30b-a3b-shape-L{layers}-s{seed}.gguf and prints
its path. Generated for a benchmark run, never committed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_1b import DEFAULT_DIR, _matrix, make_quantizer  # noqa: E402
from synthetic_model import _vocab  # noqa: E402

from engine.gguf import GGUFValueType, write_gguf  # noqa: E402
from engine.quant.presets import ModelShape, choose_types, preset_by_name  # noqa: E402
from engine.quant.types import GGMLType  # noqa: E402

T = GGMLType
FORMAT = 1


@dataclass(frozen=True)
class ShapeMoE:
    dim: int = 2048
    n_layers: int = 4
    n_heads: int = 32
    n_kv_heads: int = 4
    head_dim: int = 128
    n_expert: int = 128
    n_used: int = 8
    expert_hidden: int = 768
    n_vocab: int = 49152
    n_ctx: int = 8192
    rope_base: float = 1_000_000.0
    eps: float = 1e-6

    def matrices(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, ggml shape) of every quantized matrix, in file order (experts are 3-D)."""
        qd, kvd, e = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim, self.n_expert
        out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (self.dim, self.n_vocab))]
        for i in range(self.n_layers):
            b = f"blk.{i}."
            out += [(b + "attn_q.weight", (self.dim, qd)), (b + "attn_k.weight", (self.dim, kvd)),
                    (b + "attn_v.weight", (self.dim, kvd)), (b + "attn_output.weight", (qd, self.dim)),
                    (b + "ffn_gate_exps.weight", (self.dim, self.expert_hidden, e)),
                    (b + "ffn_up_exps.weight", (self.dim, self.expert_hidden, e)),
                    (b + "ffn_down_exps.weight", (self.expert_hidden, self.dim, e))]
        return out + [("output.weight", (self.dim, self.n_vocab))]


def q4_k_m_types(s: ShapeMoE) -> dict[str, GGMLType]:
    tensors: dict[str, tuple[tuple[int, ...], GGMLType]] = {n: (shape, T.F32) for n, shape in s.matrices()}
    shape = ModelShape("qwen3moe", s.n_layers, s.n_heads, s.n_kv_heads, n_expert=s.n_expert)
    choice = choose_types(tensors, shape, preset_by_name("Q4_K_M"))
    return {n: choice[n].new for n, _ in s.matrices()}


def write_moe(path: Path, s: ShapeMoE, *, seed: int = 0, threads: int = 2, quantizer: Any = None,
              log: Any = None) -> Path:
    quant = quantizer if quantizer is not None else make_quantizer()
    say = log or (lambda msg: None)
    types = q4_k_m_types(s)
    tokens, token_types = _vocab(s.n_vocab)
    a = "qwen3moe"
    md: dict[str, Any] = {
        "general.architecture": a, "general.name": "synthetic qwen3moe (30B-A3B shapes) Q4_K_M", "general.file_type": 15,
        f"{a}.block_count": s.n_layers, f"{a}.context_length": s.n_ctx, f"{a}.embedding_length": s.dim,
        f"{a}.feed_forward_length": 6144, f"{a}.attention.head_count": s.n_heads,
        f"{a}.attention.head_count_kv": s.n_kv_heads, f"{a}.attention.key_length": s.head_dim,
        f"{a}.attention.value_length": s.head_dim, f"{a}.rope.dimension_count": s.head_dim,
        f"{a}.rope.freq_base": s.rope_base, f"{a}.attention.layer_norm_rms_epsilon": s.eps,
        f"{a}.expert_count": s.n_expert, f"{a}.expert_used_count": s.n_used,
        f"{a}.expert_feed_forward_length": s.expert_hidden,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": token_types, "tokenizer.ggml.merges": ["Ġ t"],
        "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False,
    }
    u32 = (GGUFValueType.UINT32, None)
    md_types = {k: u32 for k, v in md.items() if isinstance(v, int) and not isinstance(v, bool)}
    ones = np.ones(s.dim, np.float32)
    rng = np.random.default_rng(seed)
    ts: list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]] = [("output_norm.weight", T.F32, (s.dim,), ones)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for idx, (name, shape) in enumerate(s.matrices()):
            qt = types[name]
            rows = int(np.prod(shape[1:]))
            ts.append((name, qt, shape, _matrix(pool, quant, seed, idx, shape[0], rows, qt)))
            if name.endswith("attn_q.weight"):
                b = name[: -len("attn_q.weight")]
                ts += [(b + "attn_norm.weight", T.F32, (s.dim,), ones), (b + "ffn_norm.weight", T.F32, (s.dim,), ones),
                       (b + "attn_q_norm.weight", T.F32, (s.head_dim,), np.ones(s.head_dim, np.float32)),
                       (b + "attn_k_norm.weight", T.F32, (s.head_dim,), np.ones(s.head_dim, np.float32)),
                       (b + "ffn_gate_inp.weight", T.F32, (s.dim, s.n_expert),
                        (rng.standard_normal((s.n_expert, s.dim), dtype=np.float32) * np.float32(0.2)))]
            if name.endswith("ffn_down_exps.weight"):
                say(f"{name.split('.')[1]}/{s.n_layers - 1} layers  {time.perf_counter() - t0:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(path, md, ts, metadata_types=md_types)
    say(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f} s")
    return path


def default_path(s: ShapeMoE, seed: int = 0, folder: Path = DEFAULT_DIR) -> Path:
    return folder / f"qwen3moe-30b-a3b-shape-L{s.n_layers}-v{s.n_vocab}-s{seed}-f{FORMAT}.gguf"


def ensure_moe(path: Path | None = None, s: ShapeMoE = ShapeMoE(), *, seed: int = 0, threads: int = 2,
               quantizer: str = "auto", llama_python: str | None = None, log: Any = None) -> Path:
    path = path or default_path(s, seed)
    if path.exists():
        return path
    return write_moe(path, s, seed=seed, threads=threads, quantizer=make_quantizer(quantizer, llama_python), log=log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--layers", type=int, default=ShapeMoE.n_layers)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--quantizer", choices=["auto", "ggml", "numpy"], default="auto")
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON"))
    args = ap.parse_args(argv)
    s = ShapeMoE(n_layers=args.layers)
    path = ensure_moe(args.out, s, seed=args.seed, threads=args.threads, quantizer=args.quantizer,
                      llama_python=args.llama_python, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
