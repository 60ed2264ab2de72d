"""Whose bits the ggml numerics give, said for the target the kernels are compiled for: an AVX-512 target is llama.cpp's
own build for it; an AVX2 target (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, as benchmarks/vs_llamacpp.py --isa avx2 sets
them) is told that llama.cpp's AVX2 build differs; bench --json carries both fields."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.kernels.isa import BITS_OF, describe
from engine.kernels.simd import host_has

ROOT = Path(__file__).resolve().parents[3]


def test_the_target_decides_the_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx,+avx2,+fma,+f16c")
    info = describe()
    assert info.target == "avx2" and info.bits_of == BITS_OF and not info.matches_host_build
    assert "differs" in info.note
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx2,+avx512f,+avx512bw,+avx512vl")
    assert describe().target == "avx512" and describe().matches_host_build
    monkeypatch.setenv("NUMBA_CPU_NAME", "generic")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "")
    assert describe().target == "generic"
    monkeypatch.delenv("NUMBA_CPU_NAME")
    want = "avx512" if all(host_has(f) for f in ("avx512f", "avx512bw", "avx512vl")) else "avx2" if host_has("avx2") \
        else describe().target
    assert describe().target == want


def test_bench_json_says_which_bits(tmp_path: Path) -> None:
    from tools.make_arch_models import write_arch

    path = write_arch(tmp_path / "qwen2.gguf", "qwen2")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    done = subprocess.run([sys.executable, "-m", "engine.cli", "bench", str(path), "-p", "8", "-n", "2", "-r", "1",
                           "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["bits_of"] == BITS_OF and row["isa"] == describe().target
