"""Write Qwen3.6-35B-A3B-shaped (qwen35moe, a few layers) and Qwen3.5-2B-shaped (qwen35) models in Q4_K_M with
random weights, for `benchmarks/vs_llamacpp.py --qwen35moe / --qwen35`.

Qwen3.6-35B-A3B's widths: dim 2048; gated DeltaNet layers with 16 key heads and 32 value heads of 128, a 4-tap
convolution; every fourth layer gated attention with 16 query / 2 KV heads of 256 and partial multi-section RoPE (64
rotated dims, sections 11/11/10); 256 experts of width 512, 8 used, a shared expert of 512 behind a sigmoid gate;
a 248,320-token vocabulary, an untied head. By default 4 of its 40 layers (three DeltaNet, one attention).
Qwen3.5-2B's: dim 2048, 24 layers (18 DeltaNet with 16 key / 16 value heads of 128, 6 attention with 8 query / 2
KV heads of 256), a dense SwiGLU FFN of 6144, a tied head. Every matrix gets llama-quantize's Q4_K_M type for the
file (engine.quant.presets.choose_types); ssm_conv1d, ssm_a, ssm_dt, the router and the norms stay F32. Weights are
normal * 0.02, made and quantized a chunk of rows at a time (benchmarks/synthetic_1b.py's helpers).

    .venv/bin/python benchmarks/synthetic_qwen35.py {moe|dense} [OUT.gguf] [--layers N]

Without OUT it writes (or reuses) a file under /tmp/gguf-lens-bench and prints its path; never committed.
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
class ShapeQwen35:
    moe: bool = True
    dim: int = 2048
    n_layers: int = 4
    n_heads: int = 16
    n_kv_heads: int = 2
    head_dim: int = 256
    rope_dim: int = 64
    k_heads: int = 16
    v_heads: int = 32
    state: int = 128
    conv_kernel: int = 4
    n_expert: int = 256
    n_used: int = 8
    expert_hidden: int = 512
    hidden: int = 512  # the shared expert's width (moe), the FFN's (dense)
    n_vocab: int = 248320
    n_ctx: int = 8192
    tied: bool = False

    @property
    def arch(self) -> str:
        return "qwen35moe" if self.moe else "qwen35"

    def recurrent(self, i: int) -> bool:
        return (i + 1) % 4 != 0

    def matrices(self) -> list[tuple[str, tuple[int, ...]]]:
        """(name, ggml shape) of every quantized matrix, in file order (experts are 3-D)."""
        d, qd, kvd = self.dim, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        kd, vd = self.k_heads * self.state, self.v_heads * self.state
        out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (d, self.n_vocab))]
        for i in range(self.n_layers):
            b = f"blk.{i}."
            if self.recurrent(i):
                out += [(b + "attn_qkv.weight", (d, 2 * kd + vd)), (b + "attn_gate.weight", (d, vd)),
                        (b + "ssm_beta.weight", (d, self.v_heads)), (b + "ssm_alpha.weight", (d, self.v_heads)),
                        (b + "ssm_out.weight", (vd, d))]
            else:
                out += [(b + "attn_q.weight", (d, 2 * qd)), (b + "attn_k.weight", (d, kvd)),
                        (b + "attn_v.weight", (d, kvd)), (b + "attn_output.weight", (qd, d))]
            if self.moe:
                e, w, h = self.n_expert, self.expert_hidden, self.hidden
                out += [(b + "ffn_gate_exps.weight", (d, w, e)), (b + "ffn_up_exps.weight", (d, w, e)),
                        (b + "ffn_down_exps.weight", (w, d, e)), (b + "ffn_gate_shexp.weight", (d, h)),
                        (b + "ffn_up_shexp.weight", (d, h)), (b + "ffn_down_shexp.weight", (h, d))]
            else:
                out += [(b + "ffn_gate.weight", (d, self.hidden)), (b + "ffn_up.weight", (d, self.hidden)),
                        (b + "ffn_down.weight", (self.hidden, d))]
        return out + ([] if self.tied else [("output.weight", (d, self.n_vocab))])


DENSE_2B = ShapeQwen35(moe=False, n_layers=24, n_heads=8, v_heads=16, hidden=6144, tied=True)


def q4_k_m_types(s: ShapeQwen35) -> dict[str, GGMLType]:
    tensors: dict[str, tuple[tuple[int, ...], GGMLType]] = {n: (shape, T.F32) for n, shape in s.matrices()}
    shape = ModelShape(s.arch, s.n_layers, s.n_heads, s.n_kv_heads, n_expert=s.n_expert if s.moe else 0)
    choice = choose_types(tensors, shape, preset_by_name("Q4_K_M"))
    return {n: choice[n].new for n, _ in s.matrices()}


def _metadata(s: ShapeQwen35) -> dict[str, Any]:
    tokens, token_types = _vocab(s.n_vocab)
    a = s.arch
    md: dict[str, Any] = {
        "general.architecture": a, "general.name": f"synthetic {a} Q4_K_M", "general.file_type": 15,
        f"{a}.block_count": s.n_layers, f"{a}.context_length": s.n_ctx, f"{a}.embedding_length": s.dim,
        f"{a}.feed_forward_length": s.hidden, f"{a}.attention.head_count": s.n_heads,
        f"{a}.attention.head_count_kv": s.n_kv_heads, f"{a}.attention.key_length": s.head_dim,
        f"{a}.attention.value_length": s.head_dim, f"{a}.rope.dimension_count": s.rope_dim,
        f"{a}.rope.dimension_sections": np.array([11, 11, 10, 0], np.int32),
        f"{a}.rope.freq_base": 10_000_000.0, f"{a}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{a}.ssm.conv_kernel": s.conv_kernel, f"{a}.ssm.inner_size": s.state * s.v_heads,
        f"{a}.ssm.state_size": s.state, f"{a}.ssm.time_step_rank": s.v_heads, f"{a}.ssm.group_count": s.k_heads,
        f"{a}.full_attention_interval": 4,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": token_types, "tokenizer.ggml.merges": ["Ġ t"],
        "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False,
    }
    if s.moe:
        md.update({f"{a}.expert_count": s.n_expert, f"{a}.expert_used_count": s.n_used,
                   f"{a}.expert_feed_forward_length": s.expert_hidden,
                   f"{a}.expert_shared_feed_forward_length": s.hidden})
    return md


def write_qwen35(path: Path, s: ShapeQwen35, *, seed: int = 0, threads: int = 2, quantizer: Any = None,
                 log: Any = None) -> Path:
    quant = quantizer if quantizer is not None else make_quantizer()
    say = log or (lambda msg: None)
    types = q4_k_m_types(s)
    md = _metadata(s)
    u32 = (GGUFValueType.UINT32, None)
    md_types = {k: u32 for k, v in md.items() if isinstance(v, int) and not isinstance(v, bool)}
    rng = np.random.default_rng(seed)
    ones = lambda n: np.ones(n, np.float32)  # noqa: E731
    conv_dim = 2 * s.k_heads * s.state + s.v_heads * s.state
    ts: list[tuple[str, GGMLType, tuple[int, ...], np.ndarray]] = [("output_norm.weight", T.F32, (s.dim,), ones(s.dim))]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for idx, (name, shape) in enumerate(s.matrices()):
            rows = int(np.prod(shape[1:]))
            ts.append((name, types[name], shape, _matrix(pool, quant, seed, idx, shape[0], rows, types[name])))
            b = name[: name.index(".", 4) + 1] if name.startswith("blk.") else ""
            if name.endswith(("attn_qkv.weight", "attn_q.weight")):
                ts += [(b + "attn_norm.weight", T.F32, (s.dim,), ones(s.dim)),
                       (b + "post_attention_norm.weight", T.F32, (s.dim,), ones(s.dim))]
            if name.endswith("attn_qkv.weight"):
                ts += [(b + "ssm_conv1d.weight", T.F32, (s.conv_kernel, conv_dim),
                        (0.3 * rng.standard_normal((conv_dim, s.conv_kernel))).astype(np.float32)),
                       (b + "ssm_dt.bias", T.F32, (s.v_heads,), np.zeros(s.v_heads, np.float32)),
                       (b + "ssm_a", T.F32, (s.v_heads,), -np.linspace(1.0, 16.0, s.v_heads, dtype=np.float32)),
                       (b + "ssm_norm.weight", T.F32, (s.state,), ones(s.state))]
            if name.endswith("attn_q.weight"):
                ts += [(b + "attn_q_norm.weight", T.F32, (s.head_dim,), ones(s.head_dim)),
                       (b + "attn_k_norm.weight", T.F32, (s.head_dim,), ones(s.head_dim))]
            if s.moe and name.endswith("ffn_gate_exps.weight"):
                ts += [(b + "ffn_gate_inp.weight", T.F32, (s.dim, s.n_expert),
                        rng.standard_normal((s.n_expert, s.dim), dtype=np.float32) * np.float32(0.2)),
                       (b + "ffn_gate_inp_shexp.weight", T.F32, (s.dim,), 0.02 * ones(s.dim))]
            if name.endswith(("ffn_down_shexp.weight", "ffn_down.weight")):
                say(f"{name.split('.')[1]}/{s.n_layers - 1} layers  {time.perf_counter() - t0:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_gguf(path, md, ts, metadata_types=md_types)
    say(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f} s")
    return path


def default_path(s: ShapeQwen35, seed: int = 0, folder: Path = DEFAULT_DIR) -> Path:
    kind = "qwen36-35b-a3b" if s.moe else "qwen35-2b"
    return folder / f"{kind}-shape-L{s.n_layers}-v{s.n_vocab}-s{seed}-f{FORMAT}.gguf"


def ensure_qwen35(path: Path | None = None, s: ShapeQwen35 = ShapeQwen35(), *, seed: int = 0, threads: int = 2,
                  quantizer: str = "auto", llama_python: str | None = None, log: Any = None) -> Path:
    path = path or default_path(s, seed)
    if path.exists():
        return path
    return write_qwen35(path, s, seed=seed, threads=threads, quantizer=make_quantizer(quantizer, llama_python), log=log)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["moe", "dense"])
    ap.add_argument("out", nargs="?", type=Path)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--quantizer", choices=["auto", "ggml", "numpy"], default="auto")
    ap.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON"))
    args = ap.parse_args(argv)
    base = ShapeQwen35() if args.kind == "moe" else DENSE_2B
    s = base if args.layers is None else ShapeQwen35(**{**base.__dict__, "n_layers": args.layers})
    path = ensure_qwen35(args.out, s, threads=args.threads, quantizer=args.quantizer, llama_python=args.llama_python,
                         log=lambda m: print(m, file=sys.stderr, flush=True))
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
