"""Whose bits the ggml numerics give: by default those of llama.cpp's build for the target the kernels are compiled
for (AVX-512, or AVX2 where NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say so, as benchmarks/vs_llamacpp.py --isa avx2 sets
them); GGUF_LENS_BITS or forced_bits choose the other, and the note says it differs; bench --json carries both."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.kernels.isa import BITS_OF, BUILDS, ENV, bits, describe, forced_bits, lanes, target_has
from engine.kernels.simd import host_has

ROOT = Path(__file__).resolve().parents[3]


def test_the_target_decides_the_bits_and_the_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)  # the suite pins the AVX-512 build (tests/conftest.py); here the default
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx,+avx2,+fma,+f16c")
    info = describe()
    assert info.target == "avx2" and bits() == "avx2" and lanes() == 8
    assert info.bits_of == BUILDS["avx2"] and info.matches_host_build and "the build for this CPU" in info.note
    monkeypatch.setenv(ENV, "avx512")  # asked for the other build: said so, with the difference
    info = describe()
    assert info.bits_of == BITS_OF and not info.matches_host_build and "differs" in info.note and ENV in info.note
    monkeypatch.setenv(ENV, "bogus")  # an unknown name is the default again
    assert bits() == "avx2"
    monkeypatch.delenv(ENV)
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx2,+avx512f,+avx512bw,+avx512vl")
    assert describe().target == "avx512" and describe().matches_host_build and lanes() == 16
    with forced_bits("avx2"):
        assert bits() == "avx2" and not describe().matches_host_build
    with pytest.raises(ValueError, match="unknown build"), forced_bits("neon"):
        pass
    monkeypatch.setenv("NUMBA_CPU_NAME", "generic")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "")
    assert describe().target == "generic" and bits() == "avx512"
    monkeypatch.delenv("NUMBA_CPU_NAME")
    want = "avx512" if all(host_has(f) for f in ("avx512f", "avx512bw", "avx512vl")) else "avx2" if host_has("avx2") \
        else describe().target
    assert describe().target == want


def test_an_avx2_target_never_takes_the_hosts_avx512_instructions(monkeypatch: pytest.MonkeyPatch) -> None:
    """On an AVX-512 host, numba targeting Haswell (benchmarks' --isa avx2) must not be handed VDPBF16PS: LLVM
    aborts the process compiling it for that target. The BF16 check asks the target, never the host."""
    monkeypatch.setenv("NUMBA_CPU_NAME", "haswell")
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx,+avx2,+fma,+f16c")
    assert not target_has("avx512bf16") and target_has("avx2")
    env = {**os.environ, "NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx,+avx2,+fma,+f16c"}
    code = "from engine.kernels.floats.tinyblas import bf16_available; print(bf16_available())"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]
    monkeypatch.delenv("NUMBA_CPU_NAME")
    assert target_has("avx2") == host_has("avx2")


def test_bench_json_says_which_bits(tmp_path: Path) -> None:
    from tools.make_arch_models import write_arch

    path = write_arch(tmp_path / "qwen2.gguf", "qwen2")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU")}
    done = subprocess.run([sys.executable, "-m", "engine.cli", "bench", str(path), "-p", "8", "-n", "2", "-r", "1",
                           "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["bits_of"] == BUILDS[env[ENV]] and row["isa"] == describe().target
