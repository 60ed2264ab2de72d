"""Prompt and generation speed of every architecture against llama.cpp, on random-weight models of its layout.

    .venv/bin/python benchmarks/arch_vs_llamacpp.py --llama-python /path/to/llvenv/bin/python [NAME ...]
        [--quants Q4_K_M IQ4_XS] [--size small|test] [-t 2]

No real Qwen, Phi-3, Gemma 2 or Llama 3 file can be fetched here, so each architecture is written with
tools/make_arch_models.py's layout (its extras: rope_freqs, biases, q/k norms, post-norms, fused tensors, soft
caps), at `--size small` scaled up to 8 layers of width 1024 (FFN 2816, 1,024-token vocabulary; about 70 MB
per file in Q4_K_M) so that the matrix products, not the per-token overhead, dominate as in real models;
`--size test` keeps the test suite's 2-layer, 256-wide models (overhead only). Each file is quantized with the
project's quantizer (byte-identical to llama-quantize) into /tmp/gguf-lens-arch-bench and both engines run it
through benchmarks/vs_llamacpp.py in one run (same prompt length, generation length and threads). Prints one
JSON line per file and a table of the ratios (ours / llama.cpp).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.quality.requantize import quantize_file  # noqa: E402
from tools import make_arch_models  # noqa: E402

OUT = Path("/tmp/gguf-lens-arch-bench")
DEFAULT = ("llama3", "llama_yarn", "qwen2", "qwen3", "gemma2", "phi3")


def scaled(spec: make_arch_models.ArchSpec) -> make_arch_models.ArchSpec:
    """The same architecture at 8 layers of width 1024: heads of the spec's size, its GQA ratio kept."""
    n_heads = 1024 // spec.head_dim
    return dataclasses.replace(spec, dim=1024, hidden=2816, n_layers=8, n_heads=n_heads,
                               n_kv_heads=n_heads // (spec.n_heads // spec.n_kv_heads))


def model_file(name: str, quant: str, size: str) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"{name}.{size}.{quant}.gguf"
    if out.exists():
        return out
    base = OUT / f"{name}.{size}.F32.gguf"
    if not base.exists():
        spec = make_arch_models.SPECS[name]
        if size == "small":
            make_arch_models.SPECS[name] = scaled(spec)
        try:
            make_arch_models.write_arch(base, name)
        finally:
            make_arch_models.SPECS[name] = spec
    quantize_file(base, out, quant)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="*", default=list(DEFAULT))
    ap.add_argument("--quants", nargs="+", default=["Q4_K_M", "IQ4_XS"])
    ap.add_argument("--size", choices=("small", "test"), default="small")
    ap.add_argument("--llama-python", required=True, help="a python with llama-cpp-python")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", "--reps", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for name in args.names:
        for quant in args.quants:
            path = model_file(name, quant, args.size)
            cmd = [sys.executable, str(ROOT / "benchmarks" / "vs_llamacpp.py"), str(path), "--llama-python",
                   args.llama_python, "-t", str(args.threads), "-p", str(args.p), "-n", str(args.n), "-r", str(args.reps)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
            if out.returncode != 0:
                print(f"{name} {quant}: failed: {out.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["arch"], row["quant"] = name, quant
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'model':<16} {'quant':<7} {'MB':>6} {'prompt':>7} {'gen':>7}   ratios ours / llama.cpp, {args.threads} threads")
    for r in rows:
        print(f"{r['arch']:<16} {r['quant']:<7} {r['file_mb']:>6.1f} {r['ratio_prompt']:>7.2f} {r['ratio_gen']:>7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
