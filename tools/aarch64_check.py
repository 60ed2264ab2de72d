"""The Python half of tools/aarch64_check.sh: the engine's logits and CPU detection, on x86 and on aarch64.

    python tools/aarch64_check.py models DIR           # host: tiny llama GGUFs (F32 -> Q8_0, Q4_K_M) in DIR
    python tools/aarch64_check.py logits DIR OUT.npz   # host or aarch64: ggml-numerics logits of each file
    python tools/aarch64_check.py compare A.npz B.npz  # the logits of two machines, bit for bit
    python tools/aarch64_check.py features             # what numba and the engine see of the CPU (exit 1 on x86 ISA
                                                       # features on an aarch64 machine)

The model is tools/make_arch_models.py's `llama3` (2 layers, 256 wide, a 1,024-token vocabulary, random weights),
quantized with the project's own llama-quantize (engine.quality.requantize). Each file runs a prompt of
PROMPT tokens (a batch: the gemm and tiled kernels) and then DECODE single tokens (the gemv kernels). The kernels
give llama.cpp's x86 bits on every CPU (engine/kernels/simd.py: the portable IR computes what the intrinsics
do), so the two machines' logits should be equal to the bit.
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = "llama3"  # a SPECS entry of tools/make_arch_models.py
QUANTS = ("Q8_0", "Q4_K_M")
PROMPT = 12  # prompt tokens run as one batch (>= TILED_MIN_ROWS, so the tiled k-quant path runs too)
DECODE = 4  # then one token at a time
N_CTX = 64
X86_FEATURES = ("sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni", "avx512bf16")


def make_models(folder: Path) -> list[Path]:
    """The F32 model and its quantized copies in `folder` (written once)."""
    from engine.quality.requantize import quantize_file  # noqa: PLC0415
    from tools.make_arch_models import write_arch  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    base = folder / f"{MODEL}.F32.gguf"
    if not base.exists():
        write_arch(base, MODEL)
    out = []
    for quant in QUANTS:
        path = folder / f"{MODEL}.{quant}.gguf"
        if not path.exists():
            quantize_file(base, path, quant)
        out.append(path)
    return out


def logits_of(path: Path, ids: list[int]) -> np.ndarray:
    """(len(ids), n_vocab) ggml-numerics logits: the prompt as one batch, then one token per step."""
    from engine.generate import prefill  # noqa: PLC0415
    from engine.model import load_model  # noqa: PLC0415

    model = load_model(path, numerics="ggml")
    try:
        cache = model.new_cache(N_CTX)
        rows = [prefill(model, ids[:PROMPT], cache, all_logits=True)]
        for tok in ids[PROMPT:]:
            rows.append(model.forward([tok], cache))
            cache.commit([tok])
        return np.concatenate(rows).astype(np.float32)
    finally:
        model.close()


def run_logits(folder: Path, out: Path) -> None:
    """Write each quantized file's logits on the first PROMPT + DECODE of make_arch_models' token ids to `out`."""
    from tools.make_arch_models import token_ids  # noqa: PLC0415

    ids = token_ids()[: PROMPT + DECODE]
    result = {}
    for quant in QUANTS:
        t0 = time.monotonic()
        result[quant] = logits_of(folder / f"{MODEL}.{quant}.gguf", ids)
        print(f"{platform.machine()} {quant}: {result[quant].shape} logits in {time.monotonic() - t0:.1f} s",
              flush=True)
    np.savez(out, ids=np.array(ids), **result)


def compare(a_path: Path, b_path: Path) -> bool:
    """Print, per file, max |a - b| and how many rows (positions) are identical bits; True when all are."""
    a, b = np.load(a_path), np.load(b_path)
    same_all = True
    for quant in QUANTS:
        x, y = a[quant], b[quant]
        rows = np.all(x.view(np.uint32) == y.view(np.uint32), axis=1)
        diff = float(np.max(np.abs(x.astype(np.float64) - y))) if x.size else 0.0
        top = int(np.sum(x.argmax(-1) == y.argmax(-1)))
        print(f"logits {quant}: {x.shape[0]} positions x {x.shape[1]} vocab; identical rows {int(rows.sum())}/"
              f"{len(rows)}; max |diff| {diff:.3g}; same top token {top}/{len(rows)}")
        same_all &= bool(rows.all())
    return same_all


def features() -> bool:
    """Print what numba's target and the engine's detection see; False if x86 features show on aarch64."""
    from llvmlite import binding  # noqa: PLC0415
    from numba.core.registry import cpu_target  # noqa: PLC0415

    from engine.kernels.dispatch import compiled  # noqa: PLC0415
    from engine.kernels.simd import host_has, target_features  # noqa: PLC0415

    machine = platform.machine()
    feats = target_features(cpu_target.target_context)
    on = [f for f in X86_FEATURES if host_has(f)]
    print(f"machine {machine}; llvm host cpu {binding.get_host_cpu_name()}; numba target features "
          f"{feats or '(none)'}")
    print(f"engine.kernels.simd.host_has: {', '.join(on) or 'no x86 feature'}; compiled kernels: {compiled()}")
    try:
        from engine.kernels.isa import describe  # noqa: PLC0415

        info = describe()
        print(f"engine.kernels.isa.describe: target {info.target}; {info.note}")
    except ImportError:
        pass
    x86_in_target = [f for f in X86_FEATURES if f"+{f}" in feats.split(",")]
    if machine in ("aarch64", "arm64") and (on or x86_in_target):
        print(f"FAIL: x86 features on {machine}: {on + x86_in_target}")
        return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("models").add_argument("dir", type=Path)
    p = sub.add_parser("logits")
    p.add_argument("dir", type=Path)
    p.add_argument("out", type=Path)
    p = sub.add_parser("compare")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    sub.add_parser("features")
    args = ap.parse_args()
    if args.cmd == "models":
        for path in make_models(args.dir):
            print(path)
        return 0
    if args.cmd == "logits":
        run_logits(args.dir, args.out)
        return 0
    if args.cmd == "compare":
        return 0 if compare(args.a, args.b) else 1
    return 0 if features() else 1


if __name__ == "__main__":
    sys.exit(main())
