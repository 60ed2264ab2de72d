"""The instruction set a benchmark runs GGUF Lens and llama.cpp for, and whether their logits agree there.

`--isa avx2` in benchmarks/vs_llamacpp.py: numba compiles for a Haswell-class CPU (AVX2, FMA, F16C, no AVX-512:
NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, with a kernel cache of its own) and llama.cpp must be a build with AVX2 flags
only (`llama_print_system_info` is read to check it), so both run as they would on an AVX2-only machine, on any x86
host. `exactness` runs the first 128 tokens of the golden prose through both and compares the logits.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HASWELL = ("+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+fsgsbase,+fxsr,+lzcnt,+mmx,+movbe,+pclmul,+popcnt,"
           "+rdrnd,+sahf,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave,+xsaveopt")
ISAS = ("native", "avx2")
EXACT_TOKENS = 128

LLAMA_INFO = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
LLAMA_LOGITS = r"""
import json, sys
import numpy as np
from llama_cpp import Llama
path, tokfile, out, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
ids = json.load(open(tokfile))
llm = Llama(model_path=path, n_ctx=len(ids) + 16, n_batch=512, n_ubatch=512, logits_all=True, n_threads=threads,
            verbose=False, flash_attn=False)
llm.eval(ids)
np.save(out, np.array(llm.scores[: len(ids)], dtype=np.float32))
"""


def isa_env(isa: str, env: dict[str, str]) -> dict[str, str]:
    """`env` for GGUF Lens's processes on `isa` ('native': this CPU as it is)."""
    if isa == "native":
        return env
    if isa != "avx2":
        raise SystemExit(f"--isa {isa}: one of {', '.join(ISAS)}")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gguf-lens" / "numba-avx2"
    cache.mkdir(parents=True, exist_ok=True)
    return dict(env, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=HASWELL, NUMBA_CACHE_DIR=str(cache))


def llama_isa(llama_python: str, env: dict[str, str]) -> str:
    """'avx512' or 'avx2' (or 'other'): what the llama.cpp build behind llama_python runs, from its system info."""
    info = subprocess.run([llama_python, "-c", LLAMA_INFO], capture_output=True, text=True, env=env, check=False).stdout
    flags = {part.split("=")[0].strip(): part.split("=")[-1].strip() for part in info.replace("|", "\n").splitlines()
             if "=" in part}
    if flags.get("AVX512") == "1":
        return "avx512"
    return "avx2" if flags.get("AVX2") == "1" else "other"


def exactness(gguf_lens: list[str], llama_python: str, path: str, env: dict[str, str], threads: int) -> dict:
    """Both engines' logits on the golden prose's first EXACT_TOKENS tokens: how far apart."""
    with tempfile.TemporaryDirectory(prefix="gguf-lens-isa-") as tmp:
        prose = ROOT / "tests" / "fixtures" / "prose.txt"
        ids = json.loads(subprocess.run([*gguf_lens, "tokenize", path, "--text-file", str(prose)], capture_output=True,
                                        text=True, env=env, check=True, cwd=ROOT).stdout)[:EXACT_TOKENS]
        tok = Path(tmp) / "ids.json"
        tok.write_text(json.dumps(ids))
        ours, ref = Path(tmp) / "ours.npy", Path(tmp) / "ref.npy"
        subprocess.run([*gguf_lens, "logits", path, "--tokens-file", str(tok), "--out", str(ours)], env=env,
                       check=True, cwd=ROOT, capture_output=True)
        subprocess.run([llama_python, "-c", LLAMA_LOGITS, path, str(tok), str(ref), str(threads)], env=env, check=True,
                       cwd=ROOT, capture_output=True)
        a, b = np.load(ours).astype(np.float64), np.load(ref).astype(np.float64)
    la = a - a.max(-1, keepdims=True)
    la -= np.log(np.exp(la).sum(-1, keepdims=True))
    lb = b - b.max(-1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(-1, keepdims=True))
    kld = (np.exp(lb) * (lb - la)).sum(-1)
    return {"tokens": len(ids), "max_abs_logit_diff": float(np.abs(a - b).max()),
            "rows_equal": int((a == b).all(axis=1).sum()), "kld_max": float(kld.max()), "kld_mean": float(kld.mean())}
