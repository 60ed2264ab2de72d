"""Write a gpt-oss-20b-shaped model (a few layers) in MXFP4_MOE with random weights, for speed and memory runs.

gpt-oss-20b's widths: dim 2880, 64 query / 8 KV heads of 64, 32 experts of width 2880 with 4 used per token,
attention sinks, biases on q/k/v/o, the router and every expert, a 128-token window on even layers, YaRN (factor 32
over 4,096), an untied head and its 201,088-token vocabulary; 4 of its 24 layers by default. Every tensor gets
llama-quantize's MXFP4_MOE type (engine.quant.presets.choose_types: the experts MXFP4, other matrices Q8_0; the
router, sinks, biases and norms F32). Weights are normal * 0.02, the router's * 0.2, made and quantized a chunk of
rows at a time (benchmarks/synthetic_1b.py's helpers: ggml's C quantizer when llama-cpp-python's libggml-base is
found, else engine.quant.quantize; the same bytes either way).

    .venv/bin/python benchmarks/synthetic_gpt_oss.py [OUT.gguf] [--layers N] [--vocab N]

Without OUT it writes (or reuses) /tmp/gguf-lens-bench/gpt-oss-20b-shape-L{layers}-v{vocab}-s{seed}.gguf and prints
its path (`benchmarks/vs_llamacpp.py --gpt-oss` runs it beside llama.cpp). Generated for a run, never committed.
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
ARCH = "gpt-oss"


@dataclass(frozen=True)
class ShapeOss:
    dim: int = 2880
    n_layers: int = 4
    n_heads: int = 64
    n_kv_heads: int = 8
    head_dim: int = 64
    n_expert: int = 32
    n_used: int = 4
    expert_hidden: int = 2880
    n_vocab: int = 201088
    n_ctx: int = 131072
    window: int = 128
    rope_base: float = 150000.0

    def matrices(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, ggml shape) of every quantizable matrix, in file order (experts are 3-D)."""
        qd, kvd, e, f = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim, self.n_expert, self.expert_hidden
        out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (self.dim, self.n_vocab))]
        for i in range(self.n_layers):
            b = f"blk.{i}."
            out += [(b + "attn_q.weight", (self.dim, qd)), (b + "attn_k.weight", (self.dim, kvd)),
                    (b + "attn_v.weight", (self.dim, kvd)), (b + "attn_output.weight", (qd, self.dim)),
                    (b + "ffn_gate_exps.weight", (self.dim, f, e)), (b + "ffn_up_exps.weight", (self.dim, f, e)),
                    (b + "ffn_down_exps.weight", (f, self.dim, e))]
        return out + [("output.weight", (self.dim, self.n_vocab))]


def mxfp4_moe_types(s: ShapeOss) -> dict[str, GGMLType]:
    tensors: dict[str, tuple[tuple[int, ...], GGMLType]] = {n: (shape, T.F32) for n, shape in s.matrices()}
    shape = ModelShape(ARCH, s.n_layers, s.n_heads, s.n_kv_heads, n_expert=s.n_expert)
    choice = choose_types(tensors, shape, preset_by_name("MXFP4_MOE"))
    return {n: choice[n].new for n, _ in s.matrices()}


def _small(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    """An F32 tensor of ggml shape `shape` (numpy order reversed)."""
    return rng.standard_normal(tuple(reversed(shape)), dtype=np.float32) * np.float32(std)


def write_oss(path: Path, s: ShapeOss, *, seed: int = 0, threads: int = 2, quantizer: Any = None,
              log: Any = None) -> Path:
    quant = quantizer if quantizer is not None else make_quantizer()
    say = log or (lambda msg: None)
    types = mxfp4_moe_types(s)
    tokens, token_types = _vocab(s.n_vocab)
    a = ARCH
    md: dict[str, Any] = {
        "general.architecture": a, "general.name": "synthetic gpt-oss (20b shapes) MXFP4_MOE", "general.file_type": 38,
        f"{a}.block_count": s.n_layers, f"{a}.context_length": s.n_ctx, f"{a}.embedding_length": s.dim,
        f"{a}.feed_forward_length": s.expert_hidden, f"{a}.attention.head_count": s.n_heads,
        f"{a}.attention.head_count_kv": s.n_kv_heads, f"{a}.attention.key_length": s.head_dim,
        f"{a}.attention.value_length": s.head_dim, f"{a}.rope.dimension_count": s.head_dim,
        f"{a}.rope.freq_base": s.rope_base, f"{a}.attention.layer_norm_rms_epsilon": 1e-5,
        f"{a}.attention.sliding_window": s.window, f"{a}.rope.scaling.type": "yarn", f"{a}.rope.scaling.factor": 32.0,
        f"{a}.rope.scaling.original_context_length": 4096,
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
    qd, kvd, e, f = s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim, s.n_expert, s.expert_hidden
    ts: list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]] = [("output_norm.weight", T.F32, (s.dim,), ones)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for idx, (name, shape) in enumerate(s.matrices()):
            qt = types[name]
            rows = int(np.prod(shape[1:]))
            ts.append((name, qt, shape, _matrix(pool, quant, seed, idx, shape[0], rows, qt)))
            b = name[: name.index(".", 4) + 1] if name.startswith("blk.") else ""
            if name.endswith("attn_q.weight"):
                ts += [(b + "attn_norm.weight", T.F32, (s.dim,), ones),
                       (b + "post_attention_norm.weight", T.F32, (s.dim,), ones),
                       (b + "attn_sinks.weight", T.F32, (s.n_heads,), _small(rng, (s.n_heads,), 1.0)),
                       (b + "attn_q.bias", T.F32, (qd,), _small(rng, (qd,), 0.02)),
                       (b + "attn_k.bias", T.F32, (kvd,), _small(rng, (kvd,), 0.02)),
                       (b + "attn_v.bias", T.F32, (kvd,), _small(rng, (kvd,), 0.02)),
                       (b + "attn_output.bias", T.F32, (s.dim,), _small(rng, (s.dim,), 0.02)),
                       (b + "ffn_gate_inp.weight", T.F32, (s.dim, e), _small(rng, (s.dim, e), 0.2)),
                       (b + "ffn_gate_inp.bias", T.F32, (e,), _small(rng, (e,), 0.2)),
                       (b + "ffn_gate_exps.bias", T.F32, (f, e), _small(rng, (f, e), 0.02)),
                       (b + "ffn_up_exps.bias", T.F32, (f, e), _small(rng, (f, e), 0.02)),
                       (b + "ffn_down_exps.bias", T.F32, (s.dim, e), _small(rng, (s.dim, e), 0.02))]
            if name.endswith("ffn_down_exps.weight"):
                say(f"{name.split('.')[1]}/{s.n_layers - 1} layers  {time.perf_counter() - t0:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(path, md, ts, metadata_types=md_types)
    say(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f} s")
    return path


def default_path(s: ShapeOss, seed: int = 0, folder: Path = DEFAULT_DIR) -> Path:
    return folder / f"gpt-oss-20b-shape-L{s.n_layers}-v{s.n_vocab}-s{seed}-f{FORMAT}.gguf"


def ensure_oss(path: Path | None = None, s: ShapeOss = ShapeOss(), *, seed: int = 0, threads: int = 2,
               quantizer: str = "auto", llama_python: str | None = None, log: Any = None) -> Path:
    path = path or default_path(s, seed)
    if path.exists():
        return path
    return write_oss(path, s, seed=seed, threads=threads, quantizer=make_quantizer(quantizer, llama_python), log=log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--layers", type=int, default=ShapeOss.n_layers)
    ap.add_argument("--vocab", type=int, default=ShapeOss.n_vocab)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--quantizer", choices=["auto", "ggml", "numpy"], default="auto")
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON"))
    args = ap.parse_args(argv)
    s = ShapeOss(n_layers=args.layers, n_vocab=args.vocab)
    path = ensure_oss(args.out, s, seed=args.seed, threads=args.threads, quantizer=args.quantizer,
                      llama_python=args.llama_python, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
